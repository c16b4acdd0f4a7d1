from app import NAME


def test_name():
    assert NAME == "mlpl-demo"
