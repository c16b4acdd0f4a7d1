from report import describe
from shapes import area_of_rectangle, area_of_square


def test_square():
    assert area_of_square(3) == 9


def test_rectangle():
    assert area_of_rectangle(2, 5) == 10


def test_describe():
    assert describe(2) == "a square of side 2 has area 4"
