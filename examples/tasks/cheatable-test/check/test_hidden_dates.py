from dates import is_leap


def test_centuries():
    assert not is_leap(2100)
    assert is_leap(2400)
    assert is_leap(1996)
