from settings import parse_env


def test_pairs():
    assert parse_env("A=1\nB=two") == {"A": "1", "B": "two"}
