"""mlplcode: a coding agent small enough to understand, written as a book."""
__version__ = "0.1.0"

from .agent import Agent

__all__ = ["Agent", "__version__"]
