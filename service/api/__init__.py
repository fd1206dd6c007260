"""FastAPI application (API v1, DESIGN §3)."""

from service.api.app import create_app

__all__ = ["create_app"]
