from settings import parse_env


def test_comments_blanks_and_spaces():
    text = "# a comment\n\nA = 1\n  # indented comment\nB=two \n"
    assert parse_env(text) == {"A": "1", "B": "two"}


def test_plain_pairs():
    assert parse_env("A=1\nB=two") == {"A": "1", "B": "two"}
