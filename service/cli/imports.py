"""`scalebook import nanotron|table|runs FILE` and `scalebook push FILE`.

Importers are API clients: they parse on this side and send batches to SCALEBOOK_API_URL, so one
process owns the DuckDB file and every row passes the same server-side validation. Each prints a
summary (read, stored, already present, rejected), the first rejected rows with their line and
reason (each reason names the field and its value), and writes every rejected row to
``$SCALEBOOK_DATA_DIR/rejects/<file>.rejects.csv`` (``--rejects`` to choose; the path is printed).
Run keys are deterministic, so running an import twice stores nothing new.

Exit codes (every importer): 0 -- every row stored or already present; 1 -- something was
rejected (the good rows are stored, the rejects file is written and named) or the whole file was
refused (unknown columns, an unrecognisable log: nothing stored); 2 -- bad command-line usage.
A column an importer does not understand is an error naming it and the nearest known name,
unless renamed with ``--map FROM=TO`` or kept in ``extra`` with ``--extra-columns``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from service.cli.base import app, client, console, fail, print_json
from service.cli.progress import QUIET, progress
from service.client import ApiError, Client, ClientError

import_app = typer.Typer(help="Import runs from files (sent through the API).", no_args_is_help=True)
app.add_typer(import_app, name="import")

BATCH = 500


@dataclass
class ImportSummary:
    """Counts of one import, and the rejected rows with reasons."""

    file: str
    read: int = 0
    stored: int = 0
    already_present: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    rejects_file: str | None = None
    #: (field, reported value, stored value) -> runs: names the server rewrote to the hardware
    #: catalog's / the precision list's (the reported one is kept in extra.<field>_reported)
    canonicalised: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "read": self.read, "stored": self.stored, "already_present": self.already_present,
                "rejected": len(self.rejected), "rejects_file": self.rejects_file,
                "canonicalised": [{"field": f, "reported": r, "stored": v, "runs": n}
                                  for (f, r, v), n in self.canonicalised.items()]}

    def note_canonicalised(self, runs: list[dict[str, Any]]) -> None:
        """Count the stored runs whose gpu_type / precision the server read as a catalog name."""
        for run in runs:
            extra: dict[str, Any] = run["extra"] if isinstance(run.get("extra"), dict) else {}
            for name in extra.get("canonicalised_fields") or []:
                key = (name, str(extra.get(f"{name}_reported")), str(run.get(name)))
                self.canonicalised[key] = self.canonicalised.get(key, 0) + 1


#: rejected rows printed under an import's summary (the rest are in the rejects file)
SHOWN_REJECTS = 10


def send_records(api: Client, records: list[dict[str, Any]], origins: list[dict[str, Any]],
                 summary: ImportSummary, quiet: bool = False) -> None:
    """POST records in batches; on 422/409 drop the named rows into `summary.rejected` and resend
    the rest, so one bad row never blocks a file. `origins[i]` describes record i (line, row).
    Progress on stderr unless `quiet` (service.cli.progress); none when there is nothing to send."""
    if not records:
        return
    with progress(f"importing {summary.file}", total=len(records), quiet=quiet) as bar:
        _send_batches(api, records, origins, summary, bar.advance)


def detail_reason(detail: dict[str, Any]) -> str:
    """One error detail of the API as a reason that names the field and its value:
    ``status = 'succes': Input should be 'success', …``; the message alone when it already quotes
    the value, or when the detail names no field."""
    message = str(detail.get("message") or "")
    field, value = detail.get("field"), detail.get("value")
    if not field or field in ("body", "runs"):
        return message or json.dumps(detail, default=str)
    if message.startswith(f"{field}: "):
        message = message[len(field) + 2:]
    if value is None:
        return f"{field}: {message}"
    shown = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    if shown in message:
        return f"{field}: {message}"
    return f"{field} = {shown[:80]}{'…' if len(shown) > 80 else ''}: {message}"


def _send_batches(api: Client, records: list[dict[str, Any]], origins: list[dict[str, Any]],
                  summary: ImportSummary, advance) -> None:
    for start in range(0, len(records), BATCH):
        pending = list(range(start, min(start + BATCH, len(records))))
        while pending:
            try:
                body = api.post("/runs", {"runs": [records[i] for i in pending]})
            except ApiError as exc:
                refused = exc
            except ClientError as exc:
                fail(str(exc))
            else:
                summary.stored += body["created"]
                summary.already_present += body["existing"]
                summary.note_canonicalised(body.get("runs") or [])
                break
            bad: dict[int, list[str]] = {}
            for d in refused.details:
                if isinstance(d.get("index"), int) and 0 <= d["index"] < len(pending):
                    bad.setdefault(d["index"], []).append(detail_reason(d))
            if refused.status not in (409, 422) or not bad:
                fail(f"the API refused a batch (HTTP {refused.status}): {refused.message}")
            for local, reasons in bad.items():
                i = pending[local]
                summary.rejected.append({**origins[i], "reason": "; ".join(reasons)})
            pending = [i for j, i in enumerate(pending) if j not in bad]
        advance(min(BATCH, len(records) - start))


def default_rejects_path(name: str) -> Path:
    """$SCALEBOOK_DATA_DIR/rejects/<name>.rejects.csv (one place, whatever the current directory)."""
    from service.settings import get_settings

    return get_settings().data_dir / "rejects" / f"{name}.rejects.csv"


def write_rejects(summary: ImportSummary, path: Path | None) -> None:
    """Write rejected rows (line, reason, original row as JSON) to CSV; path defaults to
    :func:`default_rejects_path` of the input's stem (folders created). Nothing is written when
    nothing was rejected."""
    if not summary.rejected:
        return
    summary.rejected.sort(key=lambda r: (not isinstance(r.get("line"), int), r.get("line") or 0))
    path = path or default_rejects_path(Path(summary.file).stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["line", "reason", "row"])
        for r in summary.rejected:
            w.writerow([r.get("line", ""), r["reason"], json.dumps(r.get("row"), default=str)])
    summary.rejects_file = str(path)


def report(summary: ImportSummary, as_json: bool) -> None:
    if as_json:
        print_json(summary.as_dict())
        return
    console.print(f"{summary.file}: read {summary.read}, stored {summary.stored}, "
                  f"already present {summary.already_present}, rejected {len(summary.rejected)}",
                  markup=False, highlight=False, soft_wrap=True)  # a long path is wrapped by the terminal, never cut
    show_canonicalised(summary)
    show_rejects(summary)


def show_canonicalised(summary: ImportSummary, limit: int = 5) -> None:
    """Say which reported names were stored as the catalog's (a typo such as 'H100-PCIe-typo' is read
    as H100-PCIe-80GB: the user sees it and can fix the file), the reported name kept in extra."""
    items = sorted(summary.canonicalised.items(), key=lambda kv: -kv[1])
    for (name, reported, stored), n in items[:limit]:
        console.print(f"  {name} {reported!r} stored as {stored!r} ({n:,} run(s); the reported name is kept in "
                      f"extra.{name}_reported)", markup=False, highlight=False)
    if len(items) > limit:
        console.print(f"  … {len(items) - limit} more names read as catalog names (--json lists them)")


def show_rejects(summary: ImportSummary, limit: int = SHOWN_REJECTS) -> None:
    """The first `limit` rejected rows, each with its line and reason, then where all of them are."""
    if not summary.rejected:
        return
    for r in summary.rejected[:limit]:
        where = r.get("line")
        where = f"line {where}" if isinstance(where, int) else (str(where) if where else "row")
        reason = str(r["reason"])
        if reason.startswith(f"{where}: "):
            reason = reason[len(where) + 2:]
        console.print(f"  {where}: {reason}", markup=False, highlight=False)
    more = len(summary.rejected) - limit
    if summary.rejects_file:
        # soft wrap: the terminal wraps a long path, rich does not cut it (a copied path stays whole)
        console.print(f"  {'… ' + format(more, ',') + ' more; ' if more > 0 else ''}every rejected row with its "
                      f"reason: {summary.rejects_file}", markup=False, highlight=False, soft_wrap=True)


def finish(summary: ImportSummary, as_json: bool) -> None:
    """Print the summary; exit 1 when anything was rejected (after the good rows were stored and
    the rejects file written)."""
    report(summary, as_json)
    if summary.rejected:
        raise typer.Exit(1)


def parse_map(items: list[str] | None) -> dict[str, str]:
    """``--map FROM=TO`` options -> {FROM: TO}; typer.BadParameter for a malformed one."""
    out: dict[str, str] = {}
    for item in items or []:
        src, sep, dst = item.partition("=")
        if not sep or not src.strip() or not dst.strip():
            raise typer.BadParameter(f"--map {item!r}: expected FROM=TO (a column name of the file = ours)")
        out[src.strip()] = dst.strip()
    return out


def import_parsed(kind: str, path: Path, api: Client, defaults: dict[str, Any], rejects: Path | None, *,
                  extra_columns: bool = False, column_map: dict[str, str] | None = None,
                  quiet: bool = False) -> ImportSummary:
    """Parse `path` with the `kind` parser ("nanotron" | "table"), send it, write rejects.

    Exits 1 (nothing stored) when the file is refused: wrong layout, unknown columns, bad defaults."""
    from ingest.parsers import nanotron, table

    parser = {"nanotron": nanotron, "table": table}[kind]
    try:
        result = parser.parse_file(path, extra_columns=extra_columns, column_map=column_map,
                                   **{k: v for k, v in defaults.items() if v is not None})
    except ValueError as exc:  # wrong layout, unknown columns, bad --gpu-type/--gpus-per-node defaults
        fail(f"{exc}; nothing stored")
    summary = ImportSummary(file=str(path), read=len(result.records) + len(result.rejects))
    for r in result.rejects:
        summary.rejected.append({"line": r.line_no, "row": r.row, "reason": r.reason})
    origins = [{"line": line, "row": rec} for line, rec in zip(result.lines, result.records)]
    send_records(api, result.records, origins, summary, quiet=quiet)
    write_rejects(summary, rejects)
    return summary


def import_examples(data_dir: Path, url: str) -> list[ImportSummary]:
    """Import every example file (nanotron/*.csv, published/*.csv); idempotent. One line per file
    (with the reasons of its first rejected rows); rejected rows go to
    $SCALEBOOK_DATA_DIR/rejects/<file>.rejects.csv."""
    from service.settings import get_settings

    api = client(url)
    rejects_dir = get_settings().data_dir / "rejects"
    rejects_dir.mkdir(parents=True, exist_ok=True)
    summaries = []
    from ingest.parsers.nanotron import PLAYBOOK_GPU_TYPE

    console.print(f"importing the example data ({data_dir}) through the API:", markup=False, highlight=False)
    # the shipped nanotron file is the Ultra-Scale Playbook sweep, run on H100 SXM (examples/data/README.md);
    # the file does not say so, so the importer is told, as a user importing it would tell it
    for kind, folder, defaults in (("nanotron", "nanotron", {"gpu_type": PLAYBOOK_GPU_TYPE}),
                                   ("table", "published", {})):
        for path in sorted((data_dir / folder).glob("*.csv")):
            s = import_parsed(kind, path, api, defaults, rejects_dir / f"{path.stem}.rejects.csv", quiet=True)
            summaries.append(s)
            counts = [f"{s.stored} stored"] + [f"{n} {what}" for n, what in (
                (s.already_present, "already present"), (len(s.rejected), "rejected")) if n]
            console.print(f"  {folder}/{path.name}: {', '.join(counts)}", markup=False, highlight=False)
            for r in s.rejected[:2]:
                console.print(f"    line {r.get('line')}: {r['reason']}", markup=False, highlight=False)
            if len(s.rejected) > 2:
                console.print(f"    … {len(s.rejected) - 2} more", markup=False, highlight=False)
    stored, present = sum(s.stored for s in summaries), sum(s.already_present for s in summaries)
    rejected = sum(len(s.rejected) for s in summaries)
    console.print(f"  {stored:,} runs stored, {present:,} already present, {rejected} rejected", markup=False,
                  highlight=False)
    if rejected:  # the published tables hold layouts the server refuses (see examples/data/README.md)
        console.print(f"  the {rejected} rejected rows are expected: their published degrees do not multiply to "
                      "their GPU count; every reason is in", markup=False, highlight=False)
        console.print(f"  {rejects_dir}", markup=False, highlight=False, soft_wrap=True)
    return summaries


_GPU = typer.Option(None, "--gpu-type", help="gpu_type for rows that lack one")
_GPN = typer.Option(None, "--gpus-per-node", help="gpus_per_node for rows that lack one")
_FW = typer.Option(None, "--framework", help="framework for rows that lack one")
_PREC = typer.Option(None, "--precision", help="precision (bf16, fp8, ...) for rows whose dtype is empty")
_REJ = typer.Option(None, "--rejects", help="where to write rejected rows (default "
                    "$SCALEBOOK_DATA_DIR/rejects/<file>.rejects.csv)")
_JSON = typer.Option(False, "--json", help="print the summary as JSON")
_COLMAP = typer.Option(None, "--map", help="rename a column: FROM=TO (repeatable)")
_EXTRA_COLS = typer.Option(False, "--extra-columns", help="keep columns the importer does not know in extra")


@import_app.command("nanotron")
def import_nanotron(file: Path = typer.Argument(..., exists=True, dir_okay=False),
                    gpu_type: str = typer.Option(None, "--gpu-type", help="the GPU the sweep ran on (required: the "
                                                 "file does not say; H100-SXM-80GB for the Ultra-Scale Playbook)"),
                    gpus_per_node: int = _GPN, framework: str = _FW, precision: str = _PREC, rejects: Path = _REJ,
                    column_map: list[str] = _COLMAP, extra_columns: bool = _EXTRA_COLS,
                    as_json: bool = _JSON, quiet: bool = QUIET) -> None:
    """Import a nanotron benchmark CSV (Ultra-Scale Playbook sweep format, or current columns).
    The file does not say which GPU it ran on: --gpu-type is required (exit 1, nothing stored,
    without it)."""
    finish(import_parsed("nanotron", file, client(), {"gpu_type": gpu_type, "gpus_per_node": gpus_per_node,
                                                   "framework": framework, "precision": precision}, rejects,
                         extra_columns=extra_columns, column_map=parse_map(column_map), quiet=quiet), as_json)


@import_app.command("table")
def import_table(file: Path = typer.Argument(..., exists=True, dir_okay=False), gpu_type: str = _GPU,
                 gpus_per_node: int = _GPN, framework: str = _FW, rejects: Path = _REJ,
                 column_map: list[str] = _COLMAP, extra_columns: bool = _EXTRA_COLS,
                 as_json: bool = _JSON, quiet: bool = QUIET) -> None:
    """Import a published-results table in the common 33-column layout ("5,762", "41%", "1.7B")."""
    finish(import_parsed("table", file, client(), {"gpu_type": gpu_type, "gpus_per_node": gpus_per_node,
                                                "framework": framework}, rejects,
                         extra_columns=extra_columns, column_map=parse_map(column_map), quiet=quiet), as_json)


@app.command("push")
def push(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON (object or list) or JSONL"),
         rejects: Path = _REJ, as_json: bool = _JSON, quiet: bool = QUIET) -> None:
    """Send run records from a JSON or JSONL file (one record per line). A CSV file is refused:
    `scalebook import runs` reads CSV (and JSONL, Parquet) in the run record's columns."""
    if file.suffix.lower() in (".csv", ".tsv", ".parquet"):
        fail(f"{file}: push reads JSON or JSONL run records; for a {file.suffix} file in the run record's "
             f"columns use `scalebook import runs {file}`")
    text = file.read_text(errors="replace")
    summary = ImportSummary(file=str(file))
    records: list[dict[str, Any]] = []
    origins: list[dict[str, Any]] = []
    lines, bad = read_json_records(file, text)
    for n, line, exc in bad:
        reason = f"not JSON ({json_error(exc)} at column {exc.colno}): {line.strip()[:60]!r}"
        summary.rejected.append({"line": n, "row": line, "reason": reason})
    for line_no, item in lines:
        records.append(item)
        origins.append({"line": line_no, "row": item})
    summary.read = len(records) + len(summary.rejected)
    send_records(client(), records, origins, summary, quiet=quiet)
    write_rejects(summary, rejects)
    finish(summary, as_json)


def json_error(exc: json.JSONDecodeError) -> str:
    """The decoder's message without the trailing " at" some carry ("Invalid control character at"),
    which the caller follows with its own "at line …" ("… at at line 1" before)."""
    return exc.msg.removesuffix(" at")


def read_json_records(file: Path, text: str) -> tuple[list[tuple[int | None, Any]],
                                                      list[tuple[int, str, json.JSONDecodeError]]]:
    """The run records of a JSON document (an object, a list, or {"runs": [...]}; line None) or of
    JSONL ((line number, object), and the lines that are not JSON with their error). Exits 1 with
    the parser's position, nothing sent, when the file is neither (not one line parses) or holds
    no record."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as whole:
        good: list[tuple[int | None, Any]] = []
        bad: list[tuple[int, str, json.JSONDecodeError]] = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    good.append((n, json.loads(line)))
                except json.JSONDecodeError as exc:
                    bad.append((n, line, exc))
        if not good:
            fail(f"{file}: not JSON or JSONL ({json_error(whole)} at line {whole.lineno}, column {whole.colno}); push "
                 "reads one JSON run record, a list of them, {\"runs\": [...]}, or one record per line; nothing sent")
        return good, bad
    items = doc["runs"] if isinstance(doc, dict) and "runs" in doc else doc if isinstance(doc, list) else [doc]
    if not items:
        fail(f"{file}: holds no run record; nothing sent")
    return [(None, item) for item in items], []


def _server_columns() -> list[str]:
    """Columns of the runs table that the service computes (not run-record fields)."""
    from core.record import REPORTED_FIELDS
    from service.tables import Run

    return [c.name for c in Run.__table__.columns if c.name not in REPORTED_FIELDS]


@import_app.command("runs")
def import_runs(file: Path = typer.Argument(..., exists=True, dir_okay=False,
                                            help="CSV (as `scalebook sql ... --format csv` writes), JSONL or Parquet"),
                rejects: Path = _REJ, column_map: list[str] = _COLMAP, extra_columns: bool = _EXTRA_COLS,
                as_json: bool = _JSON) -> None:
    """Import run records in the run record's own columns (DESIGN §2): an export of `runs`, a JSONL
    file of run objects, or a Parquet file. Server-computed columns (id, model_size_class, ...) are
    dropped and recomputed; runs keep their run_key, so re-importing an export stores nothing new."""
    from ingest.parsers import runs

    suffix = file.suffix.lower()
    if suffix == ".csv":
        rows = runs.iter_csv(file)
    elif suffix in (".jsonl", ".ndjson", ".json"):
        rows = runs.iter_jsonl(file)
    elif suffix == ".parquet":
        import pandas as pd

        frame = pd.read_parquet(file)
        rows = ((i + 1, {k: (None if v is pd.NaT else v) for k, v in rec.items()})
                for i, rec in enumerate(frame.to_dict(orient="records")))
    else:
        fail(f"{file}: expected a .csv, .jsonl or .parquet file")
    try:
        result = runs.parse_rows(rows, where=str(file), server_columns=_server_columns(),
                                 extra_columns=extra_columns, column_map=parse_map(column_map))
    except ValueError as exc:
        fail(f"{exc}; nothing stored")
    summary = ImportSummary(file=str(file), read=len(result.records) + len(result.rejects))
    for r in result.rejects:
        summary.rejected.append({"line": r.line_no, "row": r.row, "reason": r.reason})
    send_records(client(), result.records,
                 [{"line": line, "row": rec} for line, rec in zip(result.lines, result.records)], summary)
    write_rejects(summary, rejects)
    finish(summary, as_json)
