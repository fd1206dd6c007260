"""Runs from MLflow and Weights & Biases → run records, through a mapping file. Standard library only.

Mapping file (TOML; YAML with the same structure when PyYAML is importable, i.e. on the CLI side)::

    [fields]                                   # run-record field = where its value comes from
    tokens_per_sec_per_gpu = { metric = "throughput/tokens_per_sec_per_gpu" }
    tp = { param = "parallelism.tp" }
    peak_memory_gib = { metric = "memory/peak_mb", scale = 0.0009765625 }   # MiB -> GiB
    mfu = { metric = "mfu_pct", scale = 0.01 }
    model_name = { tag = "model" }
    recompute = { param = "activation_checkpointing", values = { "true" = "full", "false" = "none" } }
    nodes = { column = "nodes" }               # W&B CSV: a column of the export
    [defaults]                                 # used when the source has no value
    gpu_type = "H100-SXM-80GB"

A rule names exactly one source: ``metric`` (MLflow: the latest value), ``param``, ``tag`` (MLflow)
or ``column`` (W&B CSV; a plain string ``"col"`` is short for ``{ column = "col" }``). Optional
``scale`` multiplies a numeric value; ``values`` maps raw strings (compared case-insensitively)
before conversion. Values are converted to the field's type (int fields accept "8" and 8.0, not
8.5). Field names are DESIGN §2's (``core.record.REPORTED_FIELDS``); ``extra.NAME`` puts a value
under ``extra``.

Without a rule the importer fills: ``name`` (MLflow run name / W&B ``Name``), ``started_at``
(MLflow start_time / W&B ``Created``), ``status`` from the run state (FINISHED/finished →
success; FAILED, KILLED, crashed, failed, killed → failed; classified further from an
``error_message`` when ``ingest.classify`` is present), ``source`` ("mlflow" / "wandb") and a
deterministic ``run_key`` (``mlflow:<run_id>``, ``wandb:<ID>``, or ``wandb:<Name>`` when the export
has no ID column), so importing again stores nothing new. Runs still RUNNING/SCHEDULED/running are
rejected with a reason (import them once they end).

Errors: :class:`MappingError` for a bad mapping file; :class:`MlflowError` when the MLflow server
cannot be reached or answers with an error (its message included). A run that cannot be converted
becomes a :class:`Rejected` (never silently dropped).
"""

from __future__ import annotations

import base64
import csv
import datetime as _dt
import json
import math
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.record import REPORTED_FIELDS, parse_bool, parse_tags

SOURCES = ("metric", "param", "tag", "column")
STATE_STATUS = {"finished": "success", "failed": "failed", "killed": "failed", "crashed": "failed"}
UNFINISHED = {"running", "scheduled", "pending", "preempting"}


class MappingError(ValueError):
    """The mapping file is malformed (names the file and the rule)."""


class MlflowError(RuntimeError):
    """The MLflow tracking server is unreachable or refused a request."""


@dataclass
class Rule:
    """Where one run-record field comes from."""

    field: str
    source: str  # one of SOURCES
    key: str
    scale: float | None = None
    values: dict[str, Any] | None = None


@dataclass
class Mapping:
    rules: list[Rule]
    defaults: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rejected:
    """A source run that could not become a record: `ref` names it (run id or CSV line)."""

    ref: Any
    row: Any
    reason: str


@dataclass
class Converted:
    records: list[dict[str, Any]] = field(default_factory=list)
    refs: list[Any] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)


def load_mapping(path: str | os.PathLike) -> Mapping:
    """Read a TOML (.toml) or YAML (.yaml/.yml, needs PyYAML) mapping file. Raises MappingError."""
    path = Path(path)
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:
            raise MappingError(f"{path}: YAML mappings need PyYAML (pip install pyyaml); or use TOML") from exc
        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise MappingError(f"{path}: not valid YAML: {exc}") from exc
    else:
        import tomllib

        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise MappingError(f"{path}: not valid TOML: {exc}") from exc
    return parse_mapping(doc, str(path))


def parse_mapping(doc: dict[str, Any], where: str = "mapping") -> Mapping:
    """Validate a mapping document ({"fields": {...}, "defaults": {...}}). Raises MappingError."""
    if not isinstance(doc, dict) or set(doc) - {"fields", "defaults"}:
        raise MappingError(f"{where}: top-level tables are [fields] and [defaults], got {sorted(doc)}")
    rules = []
    specs = dict(doc.get("fields") or {})
    nested = specs.pop("extra", None)  # TOML `extra.x = {...}` (unquoted) is a nested table
    if isinstance(nested, dict):
        specs.update({f"extra.{k}": v for k, v in nested.items()})
    elif nested is not None:
        raise MappingError(f"{where}: fields.extra must hold extra.NAME rules")
    for name, spec in specs.items():
        _check_field(name, where)
        if isinstance(spec, str):
            spec = {"column": spec}
        if not isinstance(spec, dict):
            raise MappingError(f"{where}: fields.{name} must be a table like {{ metric = \"...\" }}")
        given = [s for s in SOURCES if s in spec]
        unknown = set(spec) - set(SOURCES) - {"scale", "values"}
        if len(given) != 1 or unknown:
            raise MappingError(f"{where}: fields.{name} needs exactly one of {', '.join(SOURCES)} "
                               f"(optional scale, values); got {sorted(spec)}")
        scale = spec.get("scale")
        if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)):
            raise MappingError(f"{where}: fields.{name}.scale must be a number, got {scale!r}")
        values = spec.get("values")
        if values is not None and not isinstance(values, dict):
            raise MappingError(f"{where}: fields.{name}.values must be a table of raw value = field value")
        rules.append(Rule(name, given[0], str(spec[given[0]]), float(scale) if scale is not None else None,
                          {str(k).lower(): v for k, v in values.items()} if values else None))
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise MappingError(f"{where}: [defaults] must be a table")
    for name in defaults:
        _check_field(name, where)
    return Mapping(rules, dict(defaults))


def _check_field(name: str, where: str) -> None:
    if name not in REPORTED_FIELDS and not (name.startswith("extra.") and len(name) > 6):
        raise MappingError(f"{where}: unknown run field {name!r} (use DESIGN §2 names or extra.NAME)")


def convert(field_name: str, raw: Any, scale: float | None = None) -> Any:
    """`raw` as the type of `field_name` (REPORTED_FIELDS), scaled; "" and None → None.
    Raises ValueError naming the field when the value does not fit."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    kind = "j" if field_name.startswith("extra.") else REPORTED_FIELDS[field_name]
    if kind in ("i", "f") or scale is not None:
        try:
            number = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{field_name}: {raw!r} is not a number") from None
        if not math.isfinite(number):
            raise ValueError(f"{field_name}: {raw!r} is not finite")
        number *= scale if scale is not None else 1.0
        if kind == "i":
            if abs(number - round(number)) > 1e-9 * max(1.0, abs(number)):
                raise ValueError(f"{field_name}: {raw!r} is not an integer")
            return int(round(number))
        return number
    if kind == "b":
        return parse_bool(field_name, raw)
    if kind == "l":
        return parse_tags(raw)
    if kind == "j":
        if isinstance(raw, str):
            try:
                return json.loads(raw)
            except ValueError:
                return raw
        return raw
    return str(raw).strip()


def apply_mapping(mapping: Mapping, lookup: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Record fields from `lookup` (source kind → {key: raw value}) by the rules, then defaults.
    Raises ValueError for a value that does not convert."""
    rec: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for rule in mapping.rules:
        raw = lookup.get(rule.source, {}).get(rule.key)
        if rule.values is not None and raw is not None and str(raw).strip().lower() in rule.values:
            raw = rule.values[str(raw).strip().lower()]
        value = convert(rule.field, raw, rule.scale)
        if value is None:
            continue
        if rule.field.startswith("extra."):
            extra[rule.field[6:]] = value
        else:
            rec[rule.field] = value
    for name, value in mapping.defaults.items():
        if name.startswith("extra."):
            extra.setdefault(name[6:], value)
        elif rec.get(name) is None:
            rec[name] = convert(name, value)
    if extra:
        rec["extra"] = extra
    return rec


def _finish(rec: dict[str, Any], state: str | None) -> None:
    """Status from the run state unless mapped; failure classification from error_message."""
    if rec.get("status") is None:
        status = STATE_STATUS.get((state or "").lower())
        if status is None:
            raise ValueError(f"run state {state!r} is not a final state (finished/failed/killed/crashed)")
        rec["status"] = status
    if rec["status"] != "success" and not rec.get("error_class") and rec.get("error_message"):
        try:
            from ingest.classify import classify_text

            found = classify_text(rec["error_message"])
        except ImportError:
            found = None
        if found is not None and found.error_class:
            rec["error_class"] = found.error_class
            if rec["status"] == "failed" and found.status:
                rec["status"] = found.status


# ---------------------------------------------------------------------- MLflow
class MlflowClient:
    """Minimal MLflow REST client (``/api/2.0/mlflow``) over urllib.

    Auth from the environment like MLflow's own client: MLFLOW_TRACKING_TOKEN (bearer) or
    MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (basic). Only http(s) tracking URIs.
    """

    def __init__(self, tracking_uri: str, timeout_s: float = 30.0):
        if not tracking_uri.startswith(("http://", "https://")):
            raise MlflowError(f"tracking URI {tracking_uri!r}: only http(s) MLflow servers are supported "
                              "(serve a file/sqlite store with `mlflow server` first)")
        self.base = tracking_uri.rstrip("/") + "/api/2.0/mlflow"
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if os.environ.get("MLFLOW_TRACKING_TOKEN"):
            self.headers["Authorization"] = f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"
        elif os.environ.get("MLFLOW_TRACKING_USERNAME"):
            cred = f"{os.environ['MLFLOW_TRACKING_USERNAME']}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}"
            self.headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()

    def call(self, method: str, path: str, body: dict | None = None, **query: Any) -> dict[str, Any]:
        """One REST call; returns the JSON answer. Raises MlflowError with MLflow's message."""
        url = f"{self.base}/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, headers=self.headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                err = json.loads(exc.read())
                message = f"{err.get('error_code', '')}: {err.get('message', '')}"
            except ValueError:
                message = exc.reason
            raise MlflowError(f"MLflow {method} {path} → HTTP {exc.code} {message}") from None
        except (OSError, ValueError) as exc:
            raise MlflowError(f"cannot reach MLflow at {self.base}: {exc}") from None

    def experiment_id(self, name: str) -> str:
        return self.call("GET", "experiments/get-by-name", experiment_name=name)["experiment"]["experiment_id"]

    def search_runs(self, experiment_id: str, page_size: int = 500) -> Iterator[dict[str, Any]]:
        """Every run of the experiment (all lifecycle stages but deleted), following next_page_token."""
        token = None
        while True:
            body: dict[str, Any] = {"experiment_ids": [experiment_id], "max_results": page_size,
                                    "run_view_type": "ACTIVE_ONLY", "order_by": ["attributes.start_time ASC"]}
            if token:
                body["page_token"] = token
            page = self.call("POST", "runs/search", body)
            yield from page.get("runs", [])
            token = page.get("next_page_token")
            if not token:
                return


def mlflow_records(runs: list[dict[str, Any]], mapping: Mapping, experiment: str | None = None) -> Converted:
    """MLflow REST run objects ({"info", "data"}) → records (run_key ``mlflow:<run_id>``)."""
    out = Converted()
    for run in runs:
        info, data = run.get("info", {}), run.get("data", {})
        run_id = info.get("run_id") or info.get("run_uuid")
        lookup = {"metric": {m["key"]: m.get("value") for m in data.get("metrics", [])},
                  "param": {p["key"]: p.get("value") for p in data.get("params", [])},
                  "tag": {t["key"]: t.get("value") for t in data.get("tags", [])}}
        try:
            state = info.get("status")
            if (state or "").lower() in UNFINISHED:
                raise ValueError(f"run is {state}: import it once it has ended")
            rec = apply_mapping(mapping, lookup)
            rec.setdefault("name", info.get("run_name") or lookup["tag"].get("mlflow.runName"))
            if info.get("start_time") and rec.get("started_at") is None:
                rec["started_at"] = _dt.datetime.fromtimestamp(int(info["start_time"]) / 1000,
                                                               _dt.UTC).isoformat()
            _finish(rec, state)
        except ValueError as exc:
            out.rejected.append(Rejected(run_id, run, str(exc)))
            continue
        rec["run_key"] = f"mlflow:{run_id}"
        rec.setdefault("source", "mlflow")
        rec["extra"] = {"mlflow_run_id": run_id, "mlflow_experiment": experiment,
                        "mlflow_status": info.get("status"), **rec.get("extra", {})}
        out.records.append({k: v for k, v in rec.items() if v is not None})
        out.refs.append(run_id)
    return out


def import_mlflow(tracking_uri: str, experiment: str, mapping: Mapping) -> Converted:
    """Fetch every run of `experiment` from an MLflow server and convert it. Raises MlflowError."""
    client = MlflowClient(tracking_uri)
    runs = list(client.search_runs(client.experiment_id(experiment)))
    return mlflow_records(runs, mapping, experiment)


# ---------------------------------------------------------------------- W&B
_ID_COLUMNS = ("ID", "Id", "id", "run_id", "Run ID")


def wandb_records(path: str | os.PathLike, mapping: Mapping) -> Converted:
    """A W&B runs-table CSV export (Name, State, Created, Runtime, config and summary columns) →
    records. ``column`` rules read the named columns; ``ref`` of a reject is its CSV line number."""
    out = Converted()
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        id_col = next((c for c in _ID_COLUMNS if c in header), None)
        missing = sorted({r.key for r in mapping.rules if r.source == "column"} - set(header))
        if missing:
            raise MappingError(f"{path}: mapped column(s) not in the CSV header: {', '.join(missing)}")
        bad = sorted({r.source for r in mapping.rules} - {"column"})
        if bad:
            raise MappingError(f"W&B CSV mappings use column = ...; found {', '.join(bad)} rules")
        for line_no, row in enumerate(reader, start=2):
            ident = (row.get(id_col) if id_col else None) or row.get("Name")
            try:
                if not ident:
                    raise ValueError("row has neither an ID nor a Name")
                state = row.get("State")
                if (state or "").lower() in UNFINISHED:
                    raise ValueError(f"run is {state}: import it once it has ended")
                rec = apply_mapping(mapping, {"column": row})
                rec.setdefault("name", row.get("Name") or None)
                if rec.get("started_at") is None and row.get("Created"):
                    rec["started_at"] = row["Created"].strip()
                _finish(rec, state)
            except ValueError as exc:
                out.rejected.append(Rejected(line_no, row, str(exc)))
                continue
            rec["run_key"] = f"wandb:{ident}"
            rec.setdefault("source", "wandb")
            extra = {"wandb_name": row.get("Name"), "wandb_state": row.get("State")}
            if row.get("Runtime"):
                extra["wandb_runtime_s"] = _number_or_text(row["Runtime"])
            rec["extra"] = {**extra, **rec.get("extra", {})}
            out.records.append({k: v for k, v in rec.items() if v is not None})
            out.refs.append(line_no)
    return out


def _number_or_text(raw: str) -> Any:
    try:
        return float(raw)
    except ValueError:
        return raw
