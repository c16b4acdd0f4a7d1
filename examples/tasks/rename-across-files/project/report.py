"""Sentences about shapes."""
from shapes import area_of_square


def describe(side):
    return f"a square of side {side} has area {area_of_square(side)}"
