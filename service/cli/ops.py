"""Placeholder CLI module; filled in by its owner."""

from service.cli.base import app  # noqa: F401
