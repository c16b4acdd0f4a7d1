"""The total of a cart."""
from .discounts import apply_discount
from .prices import line_price


def total(items):
    """The price of ITEMS, a dict of product to quantity, after the discount."""
    return apply_discount(sum(line_price(name, quantity) for name, quantity in items.items()))
