def shout(text):
    """TEXT in capitals, followed by an exclamation mark."""
    return text.upper()
