from counter import bump


def test_bump_leaves_its_argument_alone():
    counts = {"a": 1}
    assert bump(counts, "a") == {"a": 2}
    assert counts == {"a": 1}
