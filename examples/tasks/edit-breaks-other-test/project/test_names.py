from names import key, slug


def test_slug():
    assert slug("Hello World") == "hello_world"


def test_key():
    assert key("Total Sales") == "total_sales"
