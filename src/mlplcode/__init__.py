"""mlplcode: a coding agent small enough to understand, written as a book."""

__version__ = "0.1.0"

__all__ = ["Agent", "__version__"]


def __getattr__(name):
    if name == "Agent":
        from .agent import Agent

        return Agent
    raise AttributeError(f"module 'mlplcode' has no attribute {name!r}")
