from people import initials


def test_initials():
    assert initials("Ada Lovelace") == "A. L."
