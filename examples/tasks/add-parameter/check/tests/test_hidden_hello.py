from greet.hello import greet


def test_punctuation():
    assert greet("Ada") == "Hello, Ada!"
    assert greet("Ada", "?") == "Hello, Ada?"
    assert greet("Ada", punctuation=".") == "Hello, Ada."
