"""Working with names."""


def initials(name):
    """The initials of NAME, such as "A. L." for "Ada Lovelace"."""
    return " ".join(part[0].upper() + "." for part in name.split())
