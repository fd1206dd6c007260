"""Tests for the standard-library CSV parsers (ingest/parsers): real published data and synthetic
files. Expected values are worked out from the raw CSV cells in each test (or by hand for the
synthetic files), not copied from parser output."""

from __future__ import annotations

import ast
import collections
import csv
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from core.record import RECOMPUTE, REPORTED_FIELDS, STATUSES
from ingest.parsers import PARSERS, detect_format, parse_nanotron, parse_table
from ingest.parsers.common import Reject
from ingest.parsers.table import COLUMNS

REPO = Path(__file__).resolve().parents[1]


def data_dir() -> Path | None:
    """$SCALEBOOK_SHARED_DATA, else <repo>/../shared/data, else <repo>/examples/data; None if
    none exists (data-driven tests are then skipped)."""
    env = os.environ.get("SCALEBOOK_SHARED_DATA")
    if env:
        return Path(env)
    for candidate in (REPO.parent / "shared" / "data", REPO / "examples" / "data"):
        if candidate.is_dir():
            return candidate
    return None


DATA = data_dir()
DATA_FILES = (sorted(DATA.glob("published/*.csv")) + sorted(DATA.glob("nanotron/*.csv"))
              if DATA is not None else [])
needs_data = pytest.mark.skipif(DATA is None, reason="no shared data directory")


#: the shipped nanotron files are the Ultra-Scale Playbook sweep, which ran on H100 SXM (the file
#: does not say so: the importer is told)
H100 = "H100-SXM-80GB"


def parser_for(path: Path):
    if path.parent.name == "nanotron":
        return lambda p: parse_nanotron(p, gpu_type=H100)
    return parse_table


def data_file(rel: str) -> Path:
    if DATA is None:
        pytest.skip("no shared data directory")
    path = DATA / rel
    assert path.is_file(), f"missing data file {path}"
    return path


def count_data_rows(path: Path) -> int:
    """Data rows counted independently of the parsers: csv rows after the header, blank lines
    excluded."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = [r for r in csv.reader(fh) if r]
    return max(len(rows) - 1, 0)


def raw_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return [{k.strip(): (v or "").strip() for k, v in r.items()} for r in csv.DictReader(fh)]


def pairs(path: Path) -> list[tuple[dict[str, str], dict]]:
    """(raw row, record) in file order; only valid when the file has no rejects."""
    result = parser_for(path)(path)
    assert result.rejects == []
    rows = raw_rows(path)
    assert len(rows) == len(result.records)
    return list(zip(rows, result.records))


def num(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%").lstrip("~"))


# ------------------------------------------------------------------------------------------
# Every shared data file


def check_record_types(rec: dict) -> None:
    assert set(rec) <= set(REPORTED_FIELDS), set(rec) - set(REPORTED_FIELDS)
    for key, value in rec.items():
        kind = REPORTED_FIELDS[key]
        assert value is not None, key
        if kind == "i":
            assert isinstance(value, int) and not isinstance(value, bool), (key, value)
        elif kind == "f":
            assert isinstance(value, float), (key, value)
        elif kind == "s":
            assert isinstance(value, str) and value, (key, value)
        elif kind == "t":
            datetime.fromisoformat(value)
        elif kind == "j":
            assert isinstance(value, dict) and value, (key, value)
    json.dumps(rec, allow_nan=False)


@needs_data
def test_all_shared_files_found():
    names = {p.name for p in DATA_FILES}
    assert "bench_sample.csv" in names
    assert len([p for p in DATA_FILES if p.parent.name == "published"]) >= 10


@pytest.mark.parametrize("path", DATA_FILES, ids=lambda p: p.name)
def test_shared_file_parses_completely(path: Path):
    first, second = parser_for(path)(path), parser_for(path)(path)
    n_rows = count_data_rows(path)
    assert len(first.records) + len(first.rejects) == n_rows
    assert first.rejects == [], [r.reason for r in first.rejects[:3]]  # real data is all readable
    assert first.records == second.records  # deterministic, keys included
    keys = [r["run_key"] for r in first.records]
    assert len(set(keys)) == len(keys)
    expected_source = "nanotron-csv" if path.parent.name == "nanotron" else "published-table"
    assert detect_format(path) == ("nanotron" if expected_source == "nanotron-csv" else "table")
    for rec in first.records:
        check_record_types(rec)
        assert len(rec["run_key"]) <= 200 and rec["run_key"].startswith(expected_source + ":")
        assert rec["source"] == expected_source
        assert rec["status"] in STATUSES
        assert rec.get("recompute", "none") in RECOMPUTE
        for frac in ("mfu", "hfu"):
            if frac in rec:
                assert 0.0 <= rec[frac] <= 1.0, (frac, rec[frac])
        for dim in ("dp", "tp", "pp", "cp", "ep", "world_size", "nodes", "gpus_per_node",
                    "micro_batch_size", "grad_accum_steps", "seq_len", "global_batch_tokens",
                    "model_params"):
            if dim in rec:
                assert rec[dim] >= 1, (dim, rec[dim])
        for metric in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "peak_memory_gib"):
            if metric in rec:
                assert rec[metric] > 0
        if "zero_stage" in rec:
            assert rec["zero_stage"] in (0, 1, 2, 3)


# ------------------------------------------------------------------------------------------
# Published tables: specific rows found by content


def test_torchtitan_thousands_separator_and_gib():
    path = data_file("published/torchtitan_performance.csv")
    (raw, rec), = [(r, c) for r, c in pairs(path) if r["tokens_per_sec_per_gpu"] == "5,762"]
    assert rec["tokens_per_sec_per_gpu"] == 5762.0
    assert "GiB" in raw["notes"] and rec["peak_memory_gib"] == float(raw["peak_memory_gb"])
    assert raw["sharding"] == "FSDP" and rec["zero_stage"] == 3
    assert rec["recompute"] == "selective" and rec["precision"] == "bf16"
    # 1D FSDP on 8 GPUs: dp 8 covers all GPUs, so tp = pp = cp = 1 is implied
    assert (rec["dp"], rec["tp"], rec["pp"], rec["cp"]) == (8, 1, 1, 1)
    assert (rec["world_size"], rec["nodes"], rec["gpus_per_node"]) == (8, 1, 8)
    assert rec["model_params"] == 8_000_000_000  # 'Llama 3.1 8B' with empty model_params
    assert rec["extra"]["model_params_inferred_from"] == "model"
    for raw, rec in pairs(path):
        if raw["precision"].lower().startswith("float8"):
            assert rec["precision"] == "fp8" and rec["extra"]["precision_reported"] == raw["precision"]
        if raw["activation_checkpointing"] == "no":
            assert rec["recompute"] == "none"
        if raw["mfu_pct"]:
            assert rec["mfu"] == pytest.approx(num(raw["mfu_pct"]) / 100)


def test_llama3_percent_and_16m_tokens():
    path = data_file("published/llama3_405b_table4.csv")
    rows = pairs(path)
    (raw, rec), = [(r, c) for r, c in rows if r["mfu_pct"] == "41%"]
    assert rec["mfu"] == pytest.approx(0.41)
    assert rec["tflops_per_gpu"] == 400.0
    assert rec["model_params"] == 405 * 10**9
    assert (rec["world_size"], rec["gpus_per_node"], rec["nodes"]) == (16384, 8, 16384 // 8)
    # "16M" tokens: the notes give batch size per DP rank; 16 seqs × DP 128 × seq 8192 = 2^24
    per_dp = int(raw["notes"].split("Batch size/DP=")[1].split(";")[0])
    assert per_dp * int(raw["dp"]) * int(raw["seq_len"]) == 16 * 2**20
    assert rec["global_batch_tokens"] == 16 * 2**20
    assert rec["zero_stage"] == 3  # "FSDP"
    # the 131k-context row keeps the published layout even though 4·8·16·16 != 16384
    (_, long_rec), = [(r, c) for r, c in rows if r["seq_len"] == "131072"]
    assert (long_rec["dp"], long_rec["tp"], long_rec["pp"], long_rec["cp"]) == (4, 8, 16, 16)
    assert long_rec["world_size"] == 16384


def test_megatron_sizes_dims_and_hfu_from_notes():
    path = data_file("published/megatron_lm_readme_scaling.csv")
    rows = pairs(path)
    ones = [(r, c) for r, c in rows if r["model_params"] == "1.7B"]
    assert len(ones) == 2 and all(c["model_params"] == 1_700_000_000 for _, c in ones)
    (raw, rec), = [(r, c) for r, c in ones if r["gpu_type"] == "H100"]
    assert "hidden=2048" in raw["notes"] and "layers=24" in raw["notes"]
    assert (rec["hidden_size"], rec["num_layers"], rec["num_heads"]) == (2048, 24, 16)
    assert rec["vocab_size"] == 131072  # from the section title "..., vocab 131072"
    assert rec["global_batch_tokens"] == int(raw["global_batch_size"]) * 4096
    (_, old), = [(r, c) for r, c in ones if r["gpu_type"] != "H100"]
    assert old["hfu"] == pytest.approx(0.44)  # "percentage_of_theoretical_peak=44% (hardware FLOPs"
    (_, trillion), = [(r, c) for r, c in rows if r["model_params"] == "1T"]
    assert trillion["model_params"] == 10**12
    (_, big), = [(r, c) for r, c in rows if r["model_params"] == "1008.0B"]
    assert big["model_params"] == 1_008_000_000_000


def test_llmfoundry_fsdp_sharding_and_dp_from_notes():
    path = data_file("published/llmfoundry_mpt_benchmarks.csv")
    seen = collections.Counter()
    for raw, rec in pairs(path):
        expected_zero = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}[raw["sharding"]]
        assert rec["zero_stage"] == expected_zero
        seen[raw["sharding"]] += 1
        world = int(raw["num_gpus"])
        assert "dp=num_gpus" in raw["notes"]
        assert (rec["dp"], rec["tp"], rec["pp"], rec["world_size"]) == (world, 1, 1, world)
        assert rec["gpus_per_node"] == 8 and rec["extra"]["gpus_per_node_assumed"] is True
        assert rec["nodes"] == max(world // 8, 1)
        assert rec["model_params"] == int(raw["model_params"])
        assert rec["mfu"] == pytest.approx(float(raw["mfu_pct"]) / 100)
        assert rec["hfu"] == pytest.approx(float(raw["hfu_pct"]) / 100)
        assert rec["recompute"] == {"True": "full", "False": "none"}[raw["activation_checkpointing"]]
        assert rec["precision"] == {"amp_bf16": "bf16", "bf16": "bf16", "amp_fp8": "fp8"}[raw["precision"]]
        assert rec["global_batch_tokens"] == int(raw["global_batch_tokens"])
        assert rec["extra"]["tokens_per_sec"] == float(raw["tokens_per_sec"])
    assert seen["FULL_SHARD"] and seen["SHARD_GRAD_OP"]
    (_, mpt70), = [(r, c) for r, c in pairs(path) if r["tokens_per_sec"] == "515636"]
    assert mpt70["mfu"] == pytest.approx(0.4125) and mpt70["model_params"] == 64862437376


def test_maxtext_scientific_notation_and_tpu_topology():
    path = data_file("published/maxtext_readme_tpu.csv")
    rows = pairs(path)
    (raw, rec), = [(r, c) for r, c in rows if r["tflops_per_gpu"] == "3.28e+02"]
    assert rec["tflops_per_gpu"] == 328.0
    assert rec["mfu"] == pytest.approx(float(raw["mfu_pct"].rstrip("%")) / 100)
    assert rec["world_size"] == int(raw["num_gpus"]) == 128  # 'TPU v5p-128'
    assert rec["gpus_per_node"] == 4 and rec["nodes"] == 128 // 4
    for raw, rec in rows:
        if raw["num_nodes"]:  # v5e rows: num_nodes counts v5e-256 slices per the notes
            assert "slices" in raw["notes"]
            assert rec["extra"]["slices"] == int(raw["num_nodes"])
            assert rec["world_size"] == int(raw["num_nodes"]) * 256
            assert rec["nodes"] == rec["world_size"] // 4


def test_picotron_approximate_mfu():
    path = data_file("published/picotron_readme.csv")
    (raw, rec), = [(r, c) for r, c in pairs(path) if r["mfu_pct"] == "~50%"]
    assert rec["mfu"] == pytest.approx(0.5)
    assert rec["extra"]["mfu_approximate"] is True and rec["extra"]["mfu_reported"] == "~50%"
    assert rec["model_params"] == 1_700_000_000  # 'SmolLM-1.7B'
    assert "dp" not in rec  # "parallel config not stated"


def test_nemo_long_sequence_layouts_emitted_as_published():
    path = data_file("published/nemo_long_sequence_cp.csv")
    flagged = [(r, c) for r, c in pairs(path) if "differs from #GPUs" in r["notes"]]
    assert flagged
    for raw, rec in flagged:
        dims = [int(raw[d]) for d in ("dp", "tp", "pp", "cp")]
        assert [rec[d] for d in ("dp", "tp", "pp", "cp")] == dims
        assert dims[0] * dims[1] * dims[2] * dims[3] != rec["world_size"] == int(raw["num_gpus"])
        assert rec["tflops_per_gpu"] == num(raw["tflops_per_gpu"])


def test_smollm3_recompute_and_dims():
    path = data_file("published/smollm3_training_configs.csv")
    for raw, rec in pairs(path):
        ac = raw["activation_checkpointing"]
        assert rec["recompute"] == ("full" if "true" in ac.lower() else "none")
        assert rec["zero_stage"] == 0 and rec["model_params"] == 3 * 10**9
        assert rec["world_size"] == int(raw["dp"]) * int(raw["tp"]) * int(raw["cp"])
    (raw, rec), = [(r, c) for r, c in pairs(path) if r["mfu_pct"] == "29.4"]
    assert rec["mfu"] == pytest.approx(0.294) and rec["tokens_per_sec_per_gpu"] == 14000.0
    assert (rec["hidden_size"], rec["num_layers"], rec["num_kv_heads"]) == (2048, 36, 4)
    assert rec["global_batch_tokens"] == 2_359_296 == 576 * 4096


def test_megatron_bridge_precision_sizes_and_gpus_per_node():
    path = data_file("published/nemo_megatron_bridge_performance_summary.csv")
    rows = pairs(path)
    for raw, rec in rows:
        world, tp, pp, cp = (int(raw[c]) for c in ("num_gpus", "tp", "pp", "cp"))
        assert rec["dp"] * tp * pp * cp == world  # dp derived from the stated layout
        assert rec["extra"]["dp_derived"] is True
        per_node = 4 if raw["gpu_type"] in ("DGX-GB200", "DGX-GB300") else 8
        assert rec["gpus_per_node"] == per_node and rec["nodes"] * per_node == world
        if raw["precision"] in ("MXFP8", "FP8", "FP8-CS", "FP8-MX"):
            assert rec["precision"] == "fp8"
        if raw["precision"] == "NVFP4":
            assert rec["precision"] == "fp4" and rec["extra"]["precision_reported"] == "NVFP4"
        if raw["sharding"] == "FSDP":
            assert rec["zero_stage"] == 3
        if raw["sharding"].startswith("DDP"):
            assert "zero_stage" not in rec  # distributed-optimizer use is not stated
        assert rec["global_batch_tokens"] == int(raw["global_batch_size"]) * int(raw["seq_len"])
        if raw["model"] == "GPT OSS 120B":
            assert rec["model_params"] == 120 * 10**9
        if raw["model"].startswith("Qwen3_30B_a3B"):
            assert rec["model_params"] == 30 * 10**9  # total, not the 3B active
        if raw["model"] in ("DeepSeekV3", "Kimi_K2"):
            assert "model_params" not in rec  # no size in the name: nothing invented
    assert any(r["precision"] == "NVFP4" for r, _ in rows)


def test_nemo_24_07_model_name_sizes():
    path = data_file("published/nemo_24_07_performance_summary.csv")
    sizes = {r["model"]: c.get("model_params") for r, c in pairs(path)}
    assert sizes["GPT3-5B"] == 5 * 10**9 and sizes["GPT3-175B"] == 175 * 10**9
    assert sizes["LLAMA3-8B"] == 8 * 10**9 and sizes["Nemotron-340B"] == 340 * 10**9


# ------------------------------------------------------------------------------------------
# nanotron: the Ultra-Scale Playbook sample


def test_nanotron_sample_conversions():
    path = data_file("nanotron/bench_sample.csv")
    rows = pairs(path)
    statuses = collections.Counter()
    checked_failed = checked_success = checked_pp = 0
    for raw, rec in rows:
        dp, tp, pp = int(raw["dp"]), int(raw["tp"]), int(raw["pp"])
        mbs, acc, seq = int(raw["mbs"]), int(float(raw["batch_accum"])), int(raw["seq_len"])
        assert raw["name"].startswith("1.34G_") and rec["model_params"] == 1_340_000_000
        assert rec["model_name"] == "nanotron-1.34B"
        assert rec["world_size"] == dp * tp * pp
        assert rec["nodes"] == int(float(raw["nodes"])) and rec["gpus_per_node"] == 8
        assert rec["gpu_type"] == "H100-SXM-80GB" and rec["framework"] == "nanotron"
        # the precision the row states (dtype), never one it does not (the sweep's failed rows)
        assert rec.get("precision") == ("bf16" if raw["dtype"] == "torch.bfloat16" else None)
        assert rec["grad_accum_steps"] == acc and rec["micro_batch_size"] == mbs
        gbs = float(raw["gbs"])
        if raw["status"] == "Success":
            assert gbs == dp * mbs * acc  # samples
            assert rec["global_batch_tokens"] == int(gbs) * seq
            assert rec["status"] == "success"
            assert rec["mfu"] == pytest.approx(float(raw["mfu"]) / 100)
            assert rec["tokens_per_sec_per_gpu"] == float(raw["tok/s/gpu"])
            assert rec["tflops_per_gpu"] == float(raw["mTFLOPs"])
            assert rec["peak_memory_gib"] == float(raw["Mem Alloc (GB)"])
            assert rec["extra"]["htflops"] == float(raw["hTFLOPs"])
            checked_success += 1
        else:
            assert gbs == dp * mbs * acc * seq  # tokens
            assert rec["global_batch_tokens"] == int(gbs)
            assert "tokens_per_sec_per_gpu" not in rec and "mfu" not in rec
            checked_failed += 1
        if raw["status"] == "OOM":
            assert rec["status"] == "oom" and rec["error_class"] == "oom_gpu"
        if raw["status"] == "Other":
            assert rec["status"] == "failed"
        if pp > 1 and raw["Total Params"] == "1.61G":
            assert rec["model_params"] == 1_340_000_000  # not the over-counted 1.61G
            checked_pp += 1
        if raw["date"]:
            assert rec["started_at"] == raw["date"].replace(" ", "T")
        statuses[rec["status"]] += 1
    raw_status = collections.Counter(r["status"] for r, _ in rows)
    assert statuses == {"success": raw_status["Success"], "oom": raw_status["OOM"],
                        "failed": raw_status["Other"]}
    assert checked_failed and checked_success and checked_pp


def test_nanotron_sample_name_column_mismatch_flagged():
    """Job 14098548 appears twice under the name '..._dp2_tp1_pp4_...'; one row's columns say
    dp=1, pp=8. The columns are kept and the disagreement recorded."""
    path = data_file("nanotron/bench_sample.csv")
    odd = [(r, c) for r, c in pairs(path) if r["job_id"] == "14098548" and r["dp"] == "1"]
    assert len(odd) == 1
    rec = odd[0][1]
    assert (rec["dp"], rec["pp"]) == (1, 8)
    assert rec["extra"]["name_mismatch"] == {"dp": {"name": 2, "column": 1},
                                             "pp": {"name": 4, "column": 8}}
    job_keys = [c["run_key"] for r, c in pairs(path) if r["job_id"] == "14098548"]
    assert len(set(job_keys)) == 2 and all(k.startswith("nanotron-csv:14098548:") for k in job_keys)


# ------------------------------------------------------------------------------------------
# Synthetic files


def write_csv(path: Path, header: list[str], rows: list[list[str] | None]) -> Path:
    """rows: lists of cells; None writes a blank line."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for row in rows:
            if row is None:
                fh.write("\r\n")
            else:
                writer.writerow(row)
    return path


def table_row(**cells: str) -> list[str]:
    base = {"model": "Test 7B", "gpu_type": "H100", "num_gpus": "16", "dp": "16",
            "status": "Success", "notes": ""}
    base.update(cells)
    return [base.get(col, "") for col in COLUMNS]


def test_table_bad_rows_rejected_with_column_and_value(tmp_path: Path):
    rows = [
        table_row(tokens_per_sec_per_gpu="1,234"),                 # line 2: ok
        table_row(tokens_per_sec_per_gpu="12x"),                   # line 3
        None,                                                      # line 4: blank, not a row
        table_row(tp="two"),                                       # line 5
        table_row(mfu_pct="abc%"),                                 # line 6
        table_row(model="", model_params=""),                      # line 7
        table_row(activation_checkpointing="sometimes"),           # line 8
        table_row() + ["surplus"],                                 # line 9
        table_row(model_params="12345.5"),                         # line 10: half a parameter
        table_row(status="Exploded"),                              # line 11
        table_row(mbs="2.5"),                                      # line 12
        table_row(peak_memory_gb="80", notes="memory in GB"),      # line 13: ok
    ]
    path = write_csv(tmp_path / "bad.csv", list(COLUMNS), rows)
    result = parse_table(path)
    assert len(result.records) + len(result.rejects) == count_data_rows(path) == 11
    assert len(result.records) == 2
    by_line = {r.line_no: r for r in result.rejects}
    assert set(by_line) == {3, 5, 6, 7, 8, 9, 10, 11, 12}
    assert by_line[3].reason == "column 'tokens_per_sec_per_gpu': '12x' is not a number"
    named = {5: ("tp", "two"), 6: ("mfu_pct", "abc%"), 8: ("activation_checkpointing", "sometimes"),
             10: ("model_params", "12345.5"), 11: ("status", "Exploded"), 12: ("mbs", "2.5")}
    for line, (column, value) in named.items():
        assert by_line[line].reason.startswith(f"column {column!r}: {value!r} "), by_line[line]
    assert "'model'" in by_line[7].reason and "'model_params'" in by_line[7].reason
    assert "surplus" in by_line[9].reason
    assert isinstance(by_line[3], Reject) and by_line[3].row["tokens_per_sec_per_gpu"] == "12x"
    ok, gb = result.records
    assert ok["tokens_per_sec_per_gpu"] == 1234.0
    assert (ok["nodes"], ok["gpus_per_node"], ok["tp"], ok["pp"], ok["cp"]) == (2, 8, 1, 1, 1)
    # 80 GB (decimal) = 80e9 / 2^30 GiB ≈ 74.506
    assert gb["peak_memory_gib"] == pytest.approx(80e9 / 2**30, abs=1e-3)
    assert gb["extra"]["peak_memory_converted_from_gb"] is True


def test_table_defaults_and_topology(tmp_path: Path):
    rows = [table_row(num_gpus="64", dp="", tp="2", pp="4", cp="1", framework="",
                      sharding="HYBRID_SHARD", precision="NVFP4"),
            table_row(gpu_type="TPU v5p-256", num_gpus="", dp="")]
    path = write_csv(tmp_path / "t.csv", list(COLUMNS), rows)
    plain = parse_table(path).records
    assert plain[0]["dp"] == 64 // (2 * 4) and plain[0]["nodes"] == 8
    assert plain[0]["zero_stage"] == 3 and plain[0]["precision"] == "fp4"
    assert "framework" not in plain[0]
    assert plain[1]["world_size"] == 256 and plain[1]["nodes"] == 256 // 4
    withdef = parse_table(path, gpus_per_node="4", framework="custom").records
    assert withdef[0]["gpus_per_node"] == 4 and withdef[0]["nodes"] == 16
    assert "gpus_per_node_assumed" not in withdef[0]["extra"]
    assert withdef[0]["framework"] == "custom"
    assert plain[0]["run_key"] == withdef[0]["run_key"]  # the key identifies the row
    with pytest.raises(ValueError, match="gpus_per_nod"):
        parse_table(path, gpus_per_nod=8)
    with pytest.raises(ValueError, match="gpus_per_node"):
        parse_table(path, gpus_per_node="eight")
    with pytest.raises(ValueError, match="extra"):
        parse_table(path, extra={"a": 1})


def test_duplicate_rows_get_distinct_stable_keys(tmp_path: Path):
    path = write_csv(tmp_path / "dup.csv", list(COLUMNS), [table_row(), table_row()])
    a, b = parse_table(path).records
    assert a["run_key"] != b["run_key"] and b["run_key"] == a["run_key"] + "~2"
    assert [r["run_key"] for r in parse_table(path).records] == [a["run_key"], b["run_key"]]


def test_wrong_layout_is_refused(tmp_path: Path):
    path = write_csv(tmp_path / "x.csv", ["a", "b"], [["1", "2"]])
    with pytest.raises(ValueError, match="not a published-table CSV"):
        parse_table(path)
    with pytest.raises(ValueError, match="not a nanotron bench CSV"):
        parse_nanotron(path)
    assert detect_format(path) is None
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert parse_table(empty).records == [] and parse_nanotron(empty).rejects == []


def nano_row(job: str, name: str, nodes: int, dp: int, tp: int, pp: int, cp: int, acc: int,
             mbs: int, seq: int, recompute: str, tok: str = "1000.5",
             dtype: str = "torch.bfloat16") -> dict[str, str]:
    """A row in nanotron's own bench columns (create_table_log), gbs in samples."""
    return {"job_id": job, "name": name, "nodes": str(nodes), "seq_len": str(seq),
            "mbs": str(mbs), "batch_accum": str(acc), "gbs": str(dp * mbs * acc),
            "mTFLOPs": "400.0" if tok else "", "hTFLOPs": "420.0" if tok else "",
            "tok/s/gpu": tok, "Mem Alloc (GB)": "60.5", "Mem Res (GB)": "70.25",
            "dp": str(dp), "pp": str(pp), "tp": str(tp), "cp": str(cp), "ep": "1",
            "pp_engine": "1f1b", "tp_mode": "REDUCE_SCATTER", "tp_async_comm": "True",
            "recompute_layer": recompute, "hidden_size": "4096", "num_layers": "32",
            "num_heads": "32", "num_kv_heads": "8", "vocab_size": "131072", "dtype": dtype,
            "zero_stage": "1", "Total Params": "9.1G", "Local Params": "1.2G"}


def test_nanotron_current_columns_cp_ep_recompute_and_sizes(tmp_path: Path):
    # (job, name prefix, nodes, dp, tp, pp, cp, acc, mbs, seq, recompute_layer)
    specs = [
        ("1", "8.86G", 8, 4, 8, 2, 1, 8, 1, 4096, "True"),    # 4·8·2·1 = 64 GPUs = 8 nodes × 8
        ("2", "80G", 16, 4, 8, 4, 1, 32, 1, 4096, "False"),   # 128 = 16 × 8
        ("3", "469G", 32, 1, 8, 16, 2, 64, 1, 8192, "True"),  # 256 = 32 × 8
        ("4", "3.57G", 8, 16, 2, 1, 2, 4, 2, 4096, "False"),  # 64 = 8 × 8
    ]
    rows = [nano_row(j, f"{p}_dp{dp}_tp{tp}_pp{pp}_cp{cp}_acc{acc}_mbs{mbs}_seq{seq}", n,
                     dp, tp, pp, cp, acc, mbs, seq, rc)
            for j, p, n, dp, tp, pp, cp, acc, mbs, seq, rc in specs]
    rows.append(nano_row("5", "3.57G_dp16_tp2_pp1_cp2_acc4_mbs2_seq4096", 8, 16, 2, 1, 2, 4, 2,
                         4096, "False", tok="", dtype=""))
    path = write_csv(tmp_path / "bench.csv", list(rows[0]), [list(r.values()) for r in rows])
    result = parse_nanotron(path, gpu_type=H100)
    assert result.rejects == [] and len(result.records) == 5
    expected_params = [8_860_000_000, 80_000_000_000, 469_000_000_000, 3_570_000_000]
    expected_names = ["nanotron-8.86B", "nanotron-80B", "nanotron-469B", "nanotron-3.57B"]
    for spec, params, name, rec in zip(specs, expected_params, expected_names, result.records):
        _j, _p, nodes, dp, tp, pp, cp, acc, mbs, seq, rc = spec
        assert rec["model_params"] == params and rec["model_name"] == name
        assert rec["world_size"] == dp * tp * pp * cp == nodes * 8
        assert (rec["nodes"], rec["gpus_per_node"], rec["cp"], rec["ep"]) == (nodes, 8, cp, 1)
        assert rec["global_batch_tokens"] == dp * mbs * acc * seq
        assert rec["extra"]["gbs_unit"] == "samples"
        assert rec["recompute"] == ("full" if rc == "True" else "none")
        assert rec["status"] == "success" and rec["extra"]["status_inferred"] is True
        assert rec["peak_memory_gib"] == 60.5 and rec["reserved_memory_gib"] == 70.25
        assert rec["num_kv_heads"] == 8 and rec["precision"] == "bf16"
        assert "name_mismatch" not in rec["extra"]
    last = result.records[-1]
    assert last["status"] == "failed" and last.get("precision") is None  # no dtype, none stated: not guessed
    # defaults replace the parser's assumptions but not stated values
    custom = parse_nanotron(path, gpu_type="H200-SXM-141GB", model_name="my-model",
                            precision="fp8", zero_stage=3).records
    assert all(r["gpu_type"] == "H200-SXM-141GB" and r["model_name"] == "my-model" for r in custom)
    assert [r["precision"] for r in custom] == ["bf16"] * 4 + ["fp8"]
    assert all(r["zero_stage"] == 1 for r in custom)
    assert [r["run_key"] for r in custom] == [r["run_key"] for r in result.records]


def test_nanotron_file_without_a_stated_gpu_is_refused(tmp_path: Path):
    row = nano_row("10", "1.34G_dp8_tp1_pp1_acc16_mbs2_seq4096", 1, 8, 1, 1, 1, 16, 2, 4096, "False")
    path = write_csv(tmp_path / "bench.csv", list(row), [list(row.values())])
    with pytest.raises(ValueError, match="gpu_type: a nanotron bench CSV does not say which GPU"):
        parse_nanotron(path)
    (rec,) = parse_nanotron(path, gpu_type="A100-SXM-80GB").records
    assert rec["gpu_type"] == "A100-SXM-80GB"


def test_nanotron_bad_rows_rejected(tmp_path: Path):
    good = nano_row("10", "1.34G_dp8_tp1_pp1_acc16_mbs2_seq4096", 1, 8, 1, 1, 1, 16, 2, 4096, "False")
    edits = [{"status": "Success", "date": "2024-12-27 17:21:59"},
             {"tok/s/gpu": "12x", "status": "Success"}, {"dp": "", "status": "OOM"},
             {"nodes": "1.5", "status": "Other"}, {"status": "Pending", "date": "yesterday"}]
    rows = [{**good, "status": "", "date": "", **edit} for edit in edits]
    path = write_csv(tmp_path / "bench.csv", list(rows[0]), [list(r.values()) for r in rows])
    result = parse_nanotron(path, gpu_type=H100)
    assert len(result.records) + len(result.rejects) == count_data_rows(path) == 5
    (rec,) = result.records
    assert rec["started_at"] == "2024-12-27T17:21:59" and rec["status"] == "success"
    reasons = {r.line_no: r.reason for r in result.rejects}
    assert reasons[3] == "column 'tok/s/gpu': '12x' is not a number"
    assert "'dp'" in reasons[4] and "empty" in reasons[4]
    assert reasons[5] == "column 'nodes': '1.5' is not an integer"
    assert "'status'" in reasons[6] and "'Pending'" in reasons[6]


# ------------------------------------------------------------------------------------------
# Packaging


def test_parsers_import_standard_library_only():
    parser_dir = REPO / "ingest" / "parsers"
    for source in sorted(parser_dir.glob("*.py")):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in ("ingest", "core", "__future__"), \
                    f"{source.name} imports {name}"
    code = ("import sys, ingest.parsers; "
            "bad = [m for m in ('pandas', 'pydantic', 'numpy', 'sqlalchemy', 'fastapi') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(PARSERS) == {"nanotron", "table"}
