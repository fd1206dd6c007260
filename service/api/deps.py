"""Annotated dependencies shared by the routers (FastAPI full-stack-template style).

Writes do not use a yield dependency: they open `db.session(write=True)` inside the endpoint so
the commit finishes before the response is sent (an acknowledged run is a committed run).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from service.db import Database
from service.settings import Settings


def get_db(request: Request) -> Database:
    return request.app.state.db


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    """A read session; commits (a no-op for reads) or rolls back via Database.session()."""
    with request.app.state.db.session() as session:
        yield session


DatabaseDep = Annotated[Database, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
SessionDep = Annotated[Session, Depends(get_session)]
