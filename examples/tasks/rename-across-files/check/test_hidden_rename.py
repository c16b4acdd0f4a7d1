from pathlib import Path

import report
import shapes


def test_the_new_name_works():
    assert shapes.square_area(3) == 9
    assert report.describe(2) == "a square of side 2 has area 4"


def test_the_old_name_is_gone():
    assert not hasattr(shapes, "area_of_square")
    old = "area_of_" + "square"
    for path in Path(__file__).parent.glob("*.py"):
        if not path.name.startswith("test_hidden"):
            assert old not in path.read_text(), path.name
