"""Responses serialised by pydantic in one pass.

An endpoint that returns a model lets FastAPI validate it again against `response_model` and walk
it with `jsonable_encoder` (pure Python): for the heatmap's 436 full runs that is ~60 ms of a
~150 ms request. `model_response` validates the content once against the declared model and dumps
it with pydantic's Rust serializer; the route keeps `response_model` for the OpenAPI document.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import Response
from pydantic import TypeAdapter


@functools.lru_cache(maxsize=64)
def _adapter(model: Any) -> TypeAdapter:
    return TypeAdapter(model)


def model_response(model: Any, content: Any, status_code: int = 200) -> Response:
    """`content` (plain dicts/lists, ORM rows or model instances) validated against `model` (a
    pydantic model or any type TypeAdapter takes, e.g. `list[RunOut]`) and sent as JSON.

    Raises pydantic.ValidationError when the content does not match the model: a server bug,
    answered as a 500 by the generic handler, exactly as FastAPI's own response validation would.
    """
    adapter = _adapter(model)
    return Response(adapter.dump_json(adapter.validate_python(content)), status_code=status_code,
                    media_type="application/json")
