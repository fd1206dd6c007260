"""Unknown query parameters on a GET are an error, on every route (one mechanism).

FastAPI ignores query parameters a route does not declare, so ``GET /runs?nmae=x`` used to answer
every run. :func:`reject_unknown_query` is an application-wide dependency: for GET/HEAD it compares
the request's query parameter names with those the matched route declares (its own and its
dependencies', recursively) and answers 422 with the project's error body, naming each unknown
parameter, the nearest declared one, and the list the route accepts.
"""

from __future__ import annotations

import difflib
from typing import Any

from fastapi import Request

from service.errors import ValidationFailed

__all__ = ["declared_query_params", "reject_unknown_query"]


def declared_query_params(dependant: Any) -> set[str]:
    """Query parameter names (aliases) a FastAPI ``Dependant`` and its sub-dependencies declare."""
    names = {getattr(p, "alias", None) or p.name for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= declared_query_params(sub)
    return names


async def reject_unknown_query(request: Request) -> None:
    """422 when a GET/HEAD carries a query parameter its route does not declare."""
    if request.method not in ("GET", "HEAD") or not request.query_params:
        return
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    allowed = declared_query_params(dependant)
    unknown = [name for name in dict.fromkeys(request.query_params.keys()) if name not in allowed]
    if not unknown:
        return
    details = []
    for name in unknown:
        near = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.6)
        details.append({"field": name, "value": request.query_params.get(name),
                        "message": "unknown query parameter" + (f"; did you mean {near[0]!r}?" if near else "")})
    raise ValidationFailed(
        f"unknown query parameter(s) {', '.join(repr(n) for n in unknown)} for {request.url.path}; "
        f"accepted: {', '.join(sorted(allowed)) or 'none'}", details)
