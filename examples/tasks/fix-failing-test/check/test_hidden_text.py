from text import shout


def test_shout():
    assert shout("hello") == "HELLO!"
    assert shout("") == "!"
    assert shout("a b") == "A B!"
