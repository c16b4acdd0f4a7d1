from pathlib import Path

from shop.cart import total


def test_the_discount_is_applied_once():
    assert total({"book": 10}) == 180
    assert total({"lamp": 2, "book": 5}) == 180


def test_small_carts_pay_full_price():
    assert total({"lamp": 1}) == 50
    assert total({"lamp": 2}) == 100


def test_a_test_was_added():
    assert (Path(__file__).parent / "test_shop.py").read_text().count("def test_") >= 2
