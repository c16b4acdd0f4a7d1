from stats import moving_average


def test_windows():
    assert moving_average([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]
    assert moving_average([1, 2, 3], 3) == [2.0]
    assert moving_average([4, 8], 1) == [4.0, 8.0]
    assert moving_average([1, 2], 3) == []
