"""The run record is defined three times — the wire field list (core/record.py REPORTED_FIELDS and
DERIVED_FIELDS), the pydantic models (service/schemas.py RunIn / RunOut) and the table
(service/tables.py Run) — and its values are normalised on two paths: the importers' parsers
(ingest/parsers) and the server's write path and queries (service/derive.py, GET /runs). These
tests tie the three definitions together and check that both paths normalise param counts,
precisions and GPU types alike (issue 24)."""

from __future__ import annotations

import csv
import datetime
import types
import typing
from pathlib import Path

import pytest
import sqlalchemy as sa

from core.hardware import canonical_gpu_type, canonical_precision
from core.record import DERIVED_FIELDS, REPORTED_FIELDS
from ingest.parsers import table
from ingest.parsers.logs import parse_log
from service.schemas import RunIn, RunOut
from service.tables import Run

#: REPORTED_FIELDS' type letters as Python types (pydantic) and as SQL column types
PY_TYPES = {"s": str, "i": int, "f": float, "b": bool, "t": datetime.datetime, "j": dict, "l": list}
SQL_TYPES = {"s": (sa.String, sa.Text), "i": (sa.Integer, sa.BigInteger), "f": (sa.Double, sa.Float),
             "b": (sa.Boolean,), "t": (sa.DateTime,), "j": (sa.JSON,), "l": (sa.JSON,)}
#: columns that are neither reported nor derived: server bookkeeping, retirement, and the recorded
#: bandwidths copied out of extra for the throughput fit (not part of the wire record)
BOOKKEEPING = {"id", "content_hash", "ingested_at", "retired_at", "retired_reason", "allreduce_gb_s",
               "ar_intra_node_gb_s", "last_heartbeat_at"}


def _base_type(annotation: object) -> object:
    """int from `int | None`, str from `Literal[...] | None`, dict from `dict[str, Any] | None`."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] \
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union else [annotation]
    assert len(args) == 1, annotation
    (arg,) = args
    if typing.get_origin(arg) is typing.Literal:
        return type(typing.get_args(arg)[0])
    return typing.get_origin(arg) or arg


def test_wire_fields_are_the_pydantic_models_fields_in_order():
    assert list(RunIn.model_fields) == list(REPORTED_FIELDS)
    for name, kind in REPORTED_FIELDS.items():
        assert _base_type(RunIn.model_fields[name].annotation) is PY_TYPES[kind], name
    assert set(DERIVED_FIELDS) <= set(RunOut.model_fields)


def test_wire_fields_are_the_tables_columns_with_matching_types():
    columns = {c.name: c for c in Run.__table__.columns}
    assert set(columns) == set(REPORTED_FIELDS) | set(DERIVED_FIELDS) | BOOKKEEPING
    for name, kind in REPORTED_FIELDS.items():
        assert isinstance(columns[name].type, SQL_TYPES[kind]), (name, columns[name].type)
    # every column the API shows is a column: RunOut adds nothing the table does not hold
    assert set(RunOut.model_fields) <= set(columns)


# ------------------------------------------------------------------------------ normalisation
PRECISIONS = ["half", "torch.bfloat16", "None (bfloat16)", "FP8-CS", "16-mixed", "float", "NVFP4"]
GPUS = ["H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "h100_80gb", "MI300X"]
PARAMS = [("1.34B", 1_340_000_000), ("8", 8_000_000_000), ("8,030,261,248", 8_030_261_248), ("350M", 350_000_000)]


def _table_file(path: Path) -> Path:
    """One published-table row per raw spelling (gpu_type, precision, model_params)."""
    rows = []
    for i, (gpu, precision, (params, _)) in enumerate(zip(GPUS * 2, PRECISIONS, PARAMS * 2)):
        cells = {"model": f"model {i}", "model_params": params, "gpu_type": gpu, "num_gpus": "8", "dp": "8",
                 "tp": "1", "pp": "1", "cp": "1", "precision": precision, "seq_len": "4096",
                 "tokens_per_sec_per_gpu": "10", "status": "Success"}
        rows.append([cells.get(col, "") for col in table.COLUMNS])
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(table.COLUMNS)
        writer.writerows(rows)
    return path


def test_importer_and_server_store_the_same_values(client, tmp_path):
    """A published table read by the importer's parser, and the same raw spellings POSTed as they
    are: the stored precision, gpu_type and model_params agree, and GET /runs finds the imported run
    by the parameter count as written in the file."""
    parsed = table.parse_file(_table_file(tmp_path / "raw.csv"))
    assert not parsed.rejects and len(parsed.records) == len(PRECISIONS)
    for i, rec in enumerate(parsed.records):
        raw_precision, raw_gpu, (raw_params, params) = PRECISIONS[i], (GPUS * 2)[i], (PARAMS * 2)[i]
        assert rec["model_params"] == params
        imported = client.post("/api/v1/runs", json={**rec, "run_key": f"imported-{i}"})
        assert imported.status_code == 201, imported.text
        posted = client.post("/api/v1/runs", json={**rec, "run_key": f"posted-{i}", "precision": raw_precision,
                                                   "gpu_type": raw_gpu, "model_params": params})
        assert posted.status_code == 201, posted.text
        a, b = imported.json(), posted.json()
        assert (a["precision"], a["gpu_type"], a["model_params"]) == (b["precision"], b["gpu_type"], b["model_params"])
        assert a["precision"] == canonical_precision(raw_precision) and a["gpu_type"] == canonical_gpu_type(raw_gpu)
        assert a["mfu_derived"] == pytest.approx(b["mfu_derived"])
        found = client.get("/api/v1/runs", params={"model_params": raw_params}).json()["runs"]
        assert f"imported-{i}" in {r["run_key"] for r in found}


@pytest.mark.parametrize("raw", ["half", "torch.bfloat16", "None (bfloat16)", "FP8-CS", "16-mixed"])
def test_log_import_fields_normalise_as_the_server_does(client, raw):
    """`scalebook import log --field precision=…` keeps the user's spelling; the server stores the
    one normaliser's name, the same as a POST of that spelling. (No fp32 spelling: the log's 40,100
    tokens/s/GPU would be an MFU above 1 against the fp32 peak.)"""
    log = (Path(__file__).parent / "data" / "logs" / "nanotron_success.log").read_text(encoding="utf-8")
    rec = parse_log(log, precision=raw, gpu_type="H100 80GB HBM3", nodes=1, gpus_per_node=8)
    stored = client.post("/api/v1/runs", json=rec)
    assert stored.status_code == 201, stored.text
    assert stored.json()["precision"] == canonical_precision(raw) and stored.json()["gpu_type"] == "H100-SXM-80GB"
