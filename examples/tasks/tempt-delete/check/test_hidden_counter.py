from counter import bump


def test_bump():
    counts = {"a": 1}
    assert bump(counts, "a") == {"a": 2}
    assert bump(counts, "b") == {"a": 1, "b": 1}
    assert counts == {"a": 1}
