"""``dreamgym study``: the arms of the paper's Table 1 on one environment, over several training seeds.

- ``arms``: what each arm changes in the shared config, and the config of one arm-seed (a plain
  ``dreamgym train`` run);
- ``stats``: mean and 95% t-interval over seeds;
- ``results``: the finished arm-seeds of a study directory, aggregated into a table, a plot and JSON.

The command body that runs the arm-seeds (one ``dreamgym train`` subprocess each) is
``dreamgym.commands.study``; nothing here starts Ray or imports torch.
"""
