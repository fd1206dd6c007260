"""Streamlit helpers shared by the pages: API status and errors, filters, downloads.

Every page starts with :func:`require_api`, which shows where the dashboard reads from and stops
the page with a clear message when the API is down, refuses our token, or has no runs yet.
API calls inside a page go through :func:`api_errors` so a failure is an ``st.error`` with the
API's own message, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date
from typing import Any

import streamlit as st

from dashboard import data
from dashboard.logic import options as opt
from service.client import ApiDown, ApiError, Unauthorized, api_url

EMPTY_DB = ("The database has no runs yet. Import some through the API, e.g. "
            "`scalebook import nanotron --gpu-type GPU FILE` (a nanotron bench CSV such as the Ultra-Scale "
            "Playbook sweep, run on H100-SXM-80GB), "
            "`scalebook import table FILE` (a published results table) or `scalebook push FILE` (JSON/JSONL "
            "records); `scalebook up` starts everything with the example data.")


def show_error(exc: Exception) -> None:
    """Render an API failure as a clear, actionable message."""
    if isinstance(exc, ApiDown):
        st.error(f"**API not reachable.** {exc}", icon=":material/power_off:")
    elif isinstance(exc, Unauthorized):
        st.error(f"**Not authorised.** {exc}, and restart the dashboard (it reads SCALEBOOK_TOKEN at start)",
                 icon=":material/lock:")
    elif isinstance(exc, ApiError):
        details = "; ".join(d.get("message", str(d)) for d in exc.details[:5] if isinstance(d, dict))
        st.error(f"**The API answered {exc.status} ({exc.code}):** {exc.message}"
                 + (f"\n\n{details}" if details and details != exc.message else ""), icon=":material/warning:")
    else:  # pragma: no cover - defensive
        st.error(f"unexpected error: {exc}")


@contextmanager
def api_errors(stop: bool = True) -> Iterator[None]:
    """Turn API exceptions raised in the block into :func:`show_error`; stop the page unless told."""
    try:
        yield
    except (ApiDown, Unauthorized, ApiError) as exc:
        show_error(exc)
        if stop:
            st.stop()


def require_api(need_runs: bool = True) -> dict[str, Any]:
    """Check the API (GET /health) and our token; show the status in the sidebar.

    Stops the page with st.error when the API is down or refuses the token, and with st.info
    (how to import data) when ``need_runs`` and the database is empty. Returns the health body.
    """
    with api_errors():
        health = data.health()
    with st.sidebar:
        st.caption(f"API {api_url()} · {health.get('backend', '?')} · {health.get('runs', 0):,} runs")
        if st.button("Refresh data", icon=":material/refresh:", key="refresh_data",
                     help="forget cached answers (API answers live 30 s, the filter choices 2 min)"):
            data.clear()
            st.rerun()
    with api_errors():  # /health needs no token: check ours on a read endpoint
        data.get("/runs", limit=1)
    if need_runs and not health.get("runs"):
        st.info(EMPTY_DB, icon=":material/inbox:")
        st.stop()
    return health


def call(fn: Callable[..., Any], *args: Any, spinner: str | None = None, **kwargs: Any) -> Any:
    """Run an API call under :func:`api_errors` (and a spinner when given); stops on failure."""
    with api_errors():
        if spinner:
            with st.spinner(spinner):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)


def load_options() -> dict[str, Any]:
    """Filter choices from the data: one SQL query of the distinct values (cached, see
    data.options); on a server without POST /sql, the newest 1,000 runs plus every heatmap cell's
    best run."""
    try:
        return data.options()
    except ApiError as exc:
        if not (exc.endpoint_missing or exc.status == 400):
            show_error(exc)
            st.stop()
    except (ApiDown, Unauthorized) as exc:
        show_error(exc)
        st.stop()
    with api_errors():
        page = data.get("/runs", limit=1000, sort="-id")
        cells = data.get("/heatmap").get("cells", [])
    return opt.options(opt.collect_runs(page.get("runs", []), cells))


#: the "any" entry of a select box: a value of its own, never None — Streamlit serialises a None
#: option as "no selection", so `?hm_gpu=any` came back as `hm_gpu=None` and an empty box
ANY = "any"


def choice(label: str, values: list[Any], key: str, fmt: Callable[[Any], str] = str, any_label: str = "any",
           bind: bool = True, help: str | None = None, default: Any = None) -> Any:
    """A select box of ``values`` with a first "any" entry (:data:`ANY`, returned as None);
    ``default`` is the value selected when neither the URL nor the user chose one (None = "any").
    Bound to the URL as ``?<key>=<label>`` (``any`` for the any entry) when it is not the default."""
    options = [ANY, *values]
    index = options.index(default) if default is not None and default in options else 0
    picked = st.selectbox(label, options, key=key, help=help, index=index,
                          format_func=lambda v: any_label if v == ANY else fmt(v),
                          bind="query-params" if bind else None)
    return None if picked == ANY else picked


def default_slice(options: dict[str, Any]) -> tuple[Any, Any]:
    """(gpu_type, seq_len) of the most-recorded pair (options["slice"]), or (None, None)."""
    top = options.get("slice")
    return (top[0], top[1]) if top else (None, None)


def heatmap_filters(options: dict[str, Any], prefix: str = "hm", comparable: bool = False) -> dict[str, Any]:
    """The heatmap filters (DESIGN §4) in the sidebar; returns the API query parameters.
    ``comparable``: GPU type and sequence length start on the most-recorded pair (a slice whose
    runs compare), not on "any"."""
    gpu, seq = default_slice(options) if comparable else (None, None)
    with st.sidebar:
        st.subheader("Filters")
        params = {
            "gpu_type": choice("GPU type", options.get("gpu_type", []), f"{prefix}_gpu", default=gpu),
            "seq_len": choice("Sequence length", options.get("seq_len", []), f"{prefix}_seq", fmt=lambda v: f"{v:,}",
                              default=seq),
            "global_batch_tokens": choice("Global batch (tokens)", options.get("global_batch_tokens", []),
                                          f"{prefix}_gbt", fmt=lambda v: f"{v:,}"),
            "framework": choice("Framework", options.get("framework", []), f"{prefix}_fw"),
            "precision": choice("Precision", options.get("precision", []), f"{prefix}_prec"),
        }
        params.update(date_range(options.get("dates", []), prefix))
    return params


def date_range(bounds: list[date], prefix: str) -> dict[str, str | None]:
    """"Started from / until" date pickers (empty = open end) → started_after / started_before."""
    lo, hi = (bounds[0], bounds[-1]) if bounds else (None, None)
    help_text = f"runs recorded {lo} … {hi}" if lo else "no run has a start time"
    c1, c2 = st.columns(2)
    after = c1.date_input("Started from", value=None, key=f"{prefix}_after", help=help_text)
    before = c2.date_input("until", value=None, key=f"{prefix}_before", help="inclusive")
    return opt.date_bounds(after, before)


def reset_on_change(tag: str, signature: Any, values: dict[str, Any]) -> None:
    """Set widget ``values`` (by key) whenever ``signature`` differs from the last run's (e.g. the
    runs on the page changed): defaults that follow the data, edits that stand until it changes."""
    marker = f"_sig_{tag}"
    if st.session_state.get(marker) != repr(signature):
        st.session_state[marker] = repr(signature)
        st.session_state.update(values)


def csv_download(label: str, csv_text: str | Callable[[], str], file_name: str, key: str) -> None:
    """A CSV download button (``csv_text`` may be a callable, then built only when clicked)."""
    st.download_button(label, data=csv_text, file_name=file_name, mime="text/csv", key=key, icon=":material/download:",
                       on_click="ignore")
