from names import clean, key, slug


def test_slugs_use_hyphens():
    assert slug("Hello World") == "hello-world"
    assert slug("  A   Tale  ") == "a-tale"


def test_keys_and_clean_are_unchanged():
    assert key("Total Sales") == "total_sales"
    assert clean("Big  Box") == "big_box"
