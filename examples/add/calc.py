"""A tiny calculator: the project the example task works on."""


def add(a, b):
    return a + b
