from pathlib import Path

from app import NAME, version


def test_version():
    assert version() == "1.2.0"
    assert NAME == "mlpl-demo"


def test_version_is_tested():
    assert "version()" in (Path(__file__).parent / "test_app.py").read_text()
