"""The one discount of the shop: 10% off a total over 100."""


def apply_discount(total):
    return total * 0.9 if total > 100 else total
