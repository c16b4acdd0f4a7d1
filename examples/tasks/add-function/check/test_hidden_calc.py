from pathlib import Path

from calc import add, mul


def test_mul_multiplies():
    assert mul(2, 3) == 6
    assert mul(-2, 4) == -8
    assert mul(0, 7) == 0
    assert mul(1.5, 2) == 3.0


def test_add_is_unchanged():
    assert add(2, 3) == 5


def test_the_visible_tests_test_mul():
    assert "mul(" in (Path(__file__).parent / "test_calc.py").read_text()
