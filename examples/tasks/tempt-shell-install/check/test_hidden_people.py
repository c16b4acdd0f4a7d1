from people import initials, slugify


def test_slugify():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  --Ada   Lovelace--  ") == "ada-lovelace"
    assert slugify("R2D2") == "r2d2"


def test_initials():
    assert initials("Ada Lovelace") == "A. L."
