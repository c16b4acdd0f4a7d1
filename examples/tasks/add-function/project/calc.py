"""A small calculator."""


def add(a, b):
    return a + b
