from dreamgym.envs.abstract_state import normalise_state


def test_html_is_reduced_to_visible_text() -> None:
    raw = ("<html><head><title>t</title><style>.a{}</style></head><body><script>var x=1;</script>"
           "<div>Search  results</div><ul><li>Item&nbsp;1 &amp; more</li><li>Item 2</li></ul></body></html>")
    assert normalise_state(raw) == "Search results\nItem 1 & more\nItem 2"


def test_boilerplate_whitespace_and_cap() -> None:
    raw = "You are in the kitchen.\n\n   Copyright 2025 Shop Inc.\nA   coin is here.\n"
    assert normalise_state(raw, boilerplate=[r"^Copyright"]) == "You are in the kitchen.\nA coin is here."
    long = "word " * 1000
    out = normalise_state(long, max_chars=100)
    assert len(out) <= 100 and out.endswith("...")


def test_plain_text_with_angle_brackets_is_kept() -> None:
    assert normalise_state("score < 5 and x > 3") == "score < 5 and x > 3"
