"""Names made from text."""


def clean(text):
    """TEXT lowercased, its words joined by underscores."""
    return "_".join(text.lower().split())


def slug(title):
    """The slug of a page's TITLE, for its URL."""
    return clean(title)


def key(name):
    """The key under which NAME is stored."""
    return clean(name)
