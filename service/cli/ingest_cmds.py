"""`scalebook sync`, `scalebook classify`, `scalebook import log|mlflow|wandb`.

- ``sync`` replays the push client's spool (SCALEBOOK_SPOOL_DIR) through the API.
- ``classify`` labels error lines read on stdin with the DESIGN §6 failure classes.
- ``import log`` turns training logs (see ``ingest.parsers.logs.FORMATS``) into one run each and
  refuses a log with neither training records nor a recognised failure; ``import mlflow`` /
  ``import wandb`` read MLflow experiments (REST API) and W&B
  runs-table CSV exports through a TOML/YAML mapping file (``ingest.external``). Like every
  importer they send through the API (SCALEBOOK_API_URL), print read / stored / already present /
  rejected, write rejected rows with reasons to a CSV file, and use deterministic run keys so a
  second import stores nothing new.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import typer

from service.cli.base import app, client, console, err_console, fail, print_json
from service.cli.imports import (
    ImportSummary,
    default_rejects_path,
    finish,
    import_app,
    send_records,
    write_rejects,
)
from service.cli.progress import QUIET, progress, track

_REJ = typer.Option(None, "--rejects", help="where to write rejected rows (default "
                    "$SCALEBOOK_DATA_DIR/rejects/<name>.rejects.csv)")
_JSON = typer.Option(False, "--json", help="print the summary as JSON")
_MAP = typer.Option(..., "--map", exists=True, dir_okay=False,
                    help="mapping file: TOML, or YAML when PyYAML is installed (see ingest.external)")


@app.command("sync")
def sync(
    spool_dir: Path = typer.Option(None, "--spool-dir", help="spool directory (default SCALEBOOK_SPOOL_DIR or "
                                   "~/.local/share/scalebook/spool)"),
    deadline: float = typer.Option(30.0, "--deadline", help="seconds of retries per batch before giving up"),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds one request (≤ 1,000 runs) may take"),
    as_json: bool = _JSON,
    quiet: bool = QUIET,
) -> None:
    """Replay runs the push client spooled while the API was unreachable (exactly once: run keys), then
    the live runs' spooled opens, step batches and finishes, in order (ingest/live.py).

    Exits 1 when runs remain in the spool (the API is still unreachable) or when the server
    rejected any (they are in the rejects file named above), like every importer."""
    from ingest.client import Client
    from ingest.live import live_spool, sync_live

    client = Client(spool_dir=spool_dir, deadline_s=deadline, timeout_s=timeout)
    with progress(f"syncing {client.spool_path}", total=client.pending(), quiet=quiet) as bar:
        result = client.sync(progress=bar.update)
    # then the live runs' opens, steps and finishes, in the order they were spooled
    live = sync_live(client) if result.error is None else None
    if as_json:
        print_json({**result.as_dict(), "spool": str(client.spool_path), "rejects_file": str(client.rejects_path),
                    "live": live.as_dict() if live else None, "live_spool": str(live_spool(client))})
    else:
        console.print(f"{client.spool_path}: replayed {result.replayed}, already present {result.already_present}, "
                      f"rejected {result.rejected}, remaining {result.remaining}")
        if live is not None and (live.replayed or live.rejected or live.remaining):
            console.print(f"{live_spool(client)}: live-run ops replayed {live.replayed}, rejected {live.rejected}, "
                          f"remaining {live.remaining}")
        if result.rejected or (live and live.rejected):
            console.print(f"  rejected runs and the server's reasons are in {client.rejects_path}")
        for error in (result.error, live.error if live else None):
            if error:
                console.print(f"  stopped: {error}")
    if result.remaining or result.rejected or live is None or live.remaining or live.rejected:
        raise typer.Exit(1)


@app.command("classify")
def classify(root_cause: bool = typer.Option(
        False, "--root-cause", help="classify stdin as one log: class, status, line number, line")) -> None:
    """Read log lines on stdin; print one failure class per line (`none` for lines that are not errors)."""
    from ingest.classify import classify_stream, classify_text

    if root_cause:
        found = classify_text(sys.stdin.read())
        print("none" if found.error_class is None else
              f"{found.error_class}\t{found.status}\t{found.line_no}\t{found.line}")
        return
    for word in classify_stream(sys.stdin):
        sys.stdout.write(word + "\n")
        sys.stdout.flush()


# ---------------------------------------------------------------------- import log
def parse_size(text: str) -> int:
    """'8030261248', '8B', '1.3b', '350M' → parameter count (core.record.parse_param_count, the
    parser the API shares). Raises typer.BadParameter."""
    from core.record import parse_param_count

    try:
        return parse_param_count(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def parse_field(item: str) -> tuple[str, Any]:
    """'key=value' → (field, value typed as the run record's field); 'extra.k=v' → ('extra.k', v)."""
    from core.record import ALIASES, REPORTED_FIELDS, parse_bool

    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise typer.BadParameter(f"--field {item!r}: expected key=value")
    if key.startswith("extra.") and len(key) > 6:
        try:
            return key, json.loads(raw)
        except ValueError:
            return key, raw
    name = ALIASES.get(key, key)
    kind = REPORTED_FIELDS.get(name)
    if kind is None:
        raise typer.BadParameter(f"--field {key}: not a run field (DESIGN §2 names, or extra.NAME)")
    try:
        if kind == "i":
            return name, parse_size(raw) if name == "model_params" else int(raw)
        if kind == "f":
            return name, float(raw)
        if kind == "b":
            return name, parse_bool(name, raw)
        if kind == "j":
            return name, json.loads(raw)
    except ValueError as exc:
        raise typer.BadParameter(f"--field {key}={raw!r}: {exc}") from None
    return name, raw


@import_app.command("log")
def import_log(
    files: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help="training log(s); one run each"),
    name: str = typer.Option(None, "--name", help="run name"),
    model_name: str = typer.Option(None, "--model-name"),
    model_params: str = typer.Option(None, "--model-params", help="total parameters: 8030261248, 8B, 350M"),
    nodes: int = typer.Option(None, "--nodes"),
    gpus_per_node: int = typer.Option(None, "--gpus-per-node"),
    gpu_type: str = typer.Option(None, "--gpu-type"),
    seq_len: int = typer.Option(None, "--seq-len"),
    dp: int = typer.Option(None, "--dp"),
    tp: int = typer.Option(None, "--tp"),
    pp: int = typer.Option(None, "--pp"),
    cp: int = typer.Option(None, "--cp"),
    ep: int = typer.Option(None, "--ep"),
    zero_stage: int = typer.Option(None, "--zero-stage"),
    micro_batch_size: int = typer.Option(None, "--micro-batch-size"),
    grad_accum_steps: int = typer.Option(None, "--grad-accum-steps"),
    recompute: str = typer.Option(None, "--recompute", help="none | selective | full"),
    precision: str = typer.Option(None, "--precision"),
    framework: str = typer.Option(None, "--framework"),
    field: list[str] = typer.Option(None, "--field", help="any run field as key=value (repeatable; extra.NAME=…)"),
    run_key: str = typer.Option(None, "--run-key", help="default: log:<hash of the log and these options>"),
    log_format: str = typer.Option(None, "--format", help="force a log format instead of detecting it: "
                                   "nanotron, megatron, megatron-deepspeed, torchtitan, nemo, maxtext, "
                                   "mmengine, hf-trainer, deepspeed, unknown (failures only)"),
    rejects: Path = _REJ,
    as_json: bool = _JSON,
    quiet: bool = QUIET,
) -> None:
    """Import training logs: one run per file. Formats: nanotron, Megatron-LM and forks (tgs),
    torchtitan, NeMo 2.0 / Megatron-Bridge, MaxText, MMEngine/XTuner, Hugging Face Trainer,
    DeepSpeed flops profiler, torchrun/Slurm failures (auto-detected; --format to force).

    Options override what the log says. A log with no training records and no recognised failure
    is refused (listed as rejected, exit 1, nothing stored for it). The run key is a hash of the log
    text and the options, so importing the same log with the same options twice stores nothing new."""
    from ingest.parsers.logs import FORMATS, parse_log

    if log_format is not None and log_format not in FORMATS:
        raise typer.BadParameter(f"--format {log_format!r}: one of {', '.join(FORMATS)}")

    fields: dict[str, Any] = {k: v for k, v in {
        "name": name, "model_name": model_name, "model_params": parse_size(model_params) if model_params else None,
        "nodes": nodes, "gpus_per_node": gpus_per_node, "gpu_type": gpu_type, "seq_len": seq_len, "dp": dp,
        "tp": tp, "pp": pp, "cp": cp, "ep": ep, "zero_stage": zero_stage, "micro_batch_size": micro_batch_size,
        "grad_accum_steps": grad_accum_steps, "recompute": recompute, "precision": precision,
        "framework": framework}.items() if v is not None}
    extra: dict[str, Any] = {}
    for item in field or []:
        key, value = parse_field(item)
        if key.startswith("extra."):
            extra[key[6:]] = value
        else:
            fields[key] = value
    if extra:
        fields["extra"] = extra
    if run_key and len(files) > 1:
        fail("--run-key names one run: give one log file")
    summary = ImportSummary(file=str(files[0]) if len(files) == 1 else f"{len(files)} logs")
    records, origins = [], []
    for path in track(files, "parsing logs", unit="logs", quiet=quiet):
        summary.read += 1
        text = path.read_text(errors="replace")
        try:
            record = parse_log(text, log_format=log_format, **fields)
        except ValueError as exc:  # LogNotRecognised: nothing to import from this file
            summary.rejected.append({"line": None, "row": str(path), "reason": f"{path}: {exc}"})
            err_console.print(f"[bold red]refused[/] {path}: {exc}")
            continue
        record.setdefault("name", path.stem)
        digest = hashlib.sha256(text.encode() + json.dumps(fields, sort_keys=True, default=str).encode())
        record["run_key"] = run_key or f"log:{digest.hexdigest()[:32]}"
        record.setdefault("extra", {})["log_file"] = path.name
        records.append(record)
        origins.append({"line": str(path), "row": record})
    send_records(client(), records, origins, summary, quiet=quiet)
    write_rejects(summary, rejects or default_rejects_path(files[0].stem))
    finish(summary, as_json)


# ---------------------------------------------------------------------- MLflow / W&B
def _send_converted(label: str, converted, rejects: Path, as_json: bool, quiet: bool = False) -> None:
    summary = ImportSummary(file=label, read=len(converted.records) + len(converted.rejected))
    for r in converted.rejected:
        summary.rejected.append({"line": r.ref, "row": r.row, "reason": r.reason})
    origins = [{"line": ref, "row": rec} for ref, rec in zip(converted.refs, converted.records)]
    send_records(client(), converted.records, origins, summary, quiet=quiet)
    write_rejects(summary, rejects)
    finish(summary, as_json)


@import_app.command("mlflow")
def import_mlflow(
    tracking_uri: str = typer.Option(..., "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                                     help="MLflow server, http(s)://host:port"),
    experiment: str = typer.Option(..., "--experiment", help="experiment name"),
    mapping: Path = _MAP,
    rejects: Path = _REJ,
    as_json: bool = _JSON,
    quiet: bool = QUIET,
) -> None:
    """Import every finished run of an MLflow experiment (params, latest metrics, tags, start time,
    status) through a mapping file; run keys are mlflow:<run_id>."""
    from ingest import external

    try:
        rules = external.load_mapping(mapping)
        converted = external.import_mlflow(tracking_uri, experiment, rules)
    except (external.MappingError, external.MlflowError) as exc:
        fail(str(exc))
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", experiment).strip("-") or "experiment"
    _send_converted(f"mlflow:{experiment}", converted, rejects or default_rejects_path(f"mlflow-{safe}"), as_json,
                    quiet)


@import_app.command("wandb")
def import_wandb(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="W&B runs-table CSV export"),
    mapping: Path = _MAP,
    rejects: Path = _REJ,
    as_json: bool = _JSON,
    quiet: bool = QUIET,
) -> None:
    """Import a W&B runs-table CSV export (Name, State, Created, Runtime, config and summary columns)
    through a mapping file of `column = "..."` rules; run keys are wandb:<ID or Name>."""
    from ingest import external

    try:
        converted = external.wandb_records(file, external.load_mapping(mapping))
    except external.MappingError as exc:
        fail(str(exc))
    _send_converted(str(file), converted, rejects or default_rejects_path(file.stem), as_json, quiet)
