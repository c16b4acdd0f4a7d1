"""The order in which the suite's files go to pytest-xdist's workers: conftest.longest_first."""
import os

from conftest import LONGEST_FILES, longest_first

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_file_named_as_longest_is_a_test_file_of_the_suite():
    assert [name for name in LONGEST_FILES if not os.path.isfile(os.path.join(CHECKOUT, name))] == []
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)


def test_the_longest_files_go_first_in_their_order_then_the_others_as_they_came():
    longest, longer = LONGEST_FILES[0], LONGEST_FILES[1]
    queue = ["tests/test_b.py", longer, "tests/test_c.py", longest, "tests/test_a.py"]
    assert longest_first(queue) == [longest, longer, "tests/test_b.py", "tests/test_c.py", "tests/test_a.py"]
