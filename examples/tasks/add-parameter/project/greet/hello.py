def greet(name):
    """A greeting for NAME."""
    return f"Hello, {name}!"
