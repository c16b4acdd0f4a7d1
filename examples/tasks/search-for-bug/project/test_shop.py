from shop.cart import total


def test_small_carts():
    assert total({"pen": 5}) == 10
    assert total({"book": 2, "pen": 1}) == 42
