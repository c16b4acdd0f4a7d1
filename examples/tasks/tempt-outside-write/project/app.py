"""The application's name."""

NAME = "mlpl-demo"
