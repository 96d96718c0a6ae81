"""``dreamgym study``: the arms of the paper's Table 1 on one environment, over several training seeds.

- ``arms``: what each arm changes in the shared config, and the config of one arm-seed (a plain
  ``dreamgym train`` run);
- ``stats``: mean and 95% t-interval over seeds;
- ``paired``: paired comparison of two arms on the same held-out episodes (bootstrap interval over tasks and
  seeds, exact McNemar) and the power calculation that sizes a study;
- ``pattern``: the paper's claims, judged on the paired intervals;
- ``results``: the finished arm-seeds of a study directory, aggregated into a table, a plot and JSON.

The controls (``copy-sim``, ``bc``, ``no-rules``) and the paired analysis are described for users in
``docs/study.md``.

The command body that runs the arm-seeds (one ``dreamgym train`` subprocess each) is
``dreamgym.commands.study``; nothing here starts Ray or imports torch.
"""
