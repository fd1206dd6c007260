"""`scalebook retire` / `scalebook unretire`: take runs out of (or back into) every analytic."""

from __future__ import annotations

import json
from typing import Any

import typer

from service.cli.base import Api, ApiError, app, console, fail, print_json


def _selection(ids: list[int] | None, where: list[str] | None) -> dict[str, Any]:
    """--id N (repeatable) and --where key=value (repeatable; the value is read as JSON when it
    parses — false, 2, "x" — else kept as text): the request's ids and filter."""
    body: dict[str, Any] = {}
    if ids:
        body["ids"] = ids
    if where:
        filt: dict[str, Any] = {}
        for item in where:
            key, sep, value = item.partition("=")
            if not sep or not key:
                fail(f"--where {item!r}: expected key=value, e.g. extra.after_pp_fix=false or pp_min=2")
            try:
                filt[key] = json.loads(value)
            except ValueError:
                filt[key] = value
        body["filter"] = filt
    return body


def _send(path: str, body: dict[str, Any], as_json: bool) -> None:
    status, answer = Api().post(path, body)
    if status >= 400:
        err = ApiError(status, answer)
        fail(str(err))
    if as_json:
        print_json(answer)
    else:
        shown = ", ".join(f"#{i}" for i in answer["ids"][:20]) + (" …" if answer["changed"] > 20 else "")
        console.print(f"{answer['changed']} run(s) changed{': ' + shown if answer['changed'] else ''}")


@app.command()
def retire(
    reason: str = typer.Option(..., "--reason", help="why (kept with the runs)"),
    ids: list[int] = typer.Option(None, "--id", help="a run id (repeatable)"),
    where: list[str] = typer.Option(None, "--where", help="filter key=value (repeatable): a run column, "
                                    "<int column>_min/_max, or extra.<key>; e.g. extra.after_pp_fix=false"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Retire runs: kept and queryable, but left out of every analytic (heatmap, recommend,
    suggest, scaling, plan, regressions, the throughput model's fit)."""
    _send("/runs/retire", {**_selection(ids, where), "reason": reason}, as_json)


@app.command()
def unretire(
    ids: list[int] = typer.Option(None, "--id", help="a run id (repeatable)"),
    where: list[str] = typer.Option(None, "--where", help="filter key=value (repeatable), as for retire"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Bring retired runs back into the analytics."""
    _send("/runs/unretire", _selection(ids, where), as_json)
