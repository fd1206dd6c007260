"""Derived fields and the hardware catalog, checked against the real data."""

from __future__ import annotations

import csv
import math

import pytest

from core import hardware
from core.model import active_params, flops_per_token, model_size_class
from service.derive import complete
from service.schemas import RunIn


@pytest.mark.parametrize("params, cls", [(1.34e9, 1.3), (3.57e9, 3.6), (8.86e9, 8.9), (80e9, 80.0),
                                         (469e9, 470.0), (8.03e9, 8.0), (135e6, 0.14), (None, None)])
def test_model_size_class_two_significant_figures(params, cls):
    assert model_size_class(int(params) if params else None) == cls


def test_every_published_gpu_type_is_in_the_catalog(data_dir):
    seen = set()
    for path in (data_dir / "published").glob("*.csv"):
        with open(path, newline="") as fh:
            seen |= {r["gpu_type"] for r in csv.DictReader(fh) if r["gpu_type"]}
    unknown = {g for g in seen if hardware.lookup(g) is None}
    assert not unknown
    assert hardware.canonical_gpu_type("H100 80GB HBM3 (700W)") == "H100-SXM-80GB"
    assert hardware.canonical_gpu_type("H100 96GB HBM2e (Grand Teton, 500W)") == "H100-SXM-96GB-HBM2e"
    assert hardware.canonical_gpu_type("a100_40gb") == "A100-SXM-40GB"
    assert hardware.canonical_gpu_type("DGX-GB200") == "GB200"
    assert hardware.canonical_gpu_type("TPU v5p-128") == "TPU-v5p"
    assert hardware.canonical_gpu_type("Voodoo2") is None
    assert all(acc.source for acc in hardware.CATALOG)
    assert all(acc.name in hardware.LINKS for acc in hardware.CATALOG)


@pytest.mark.parametrize("reported, canonical", [
    # nvidia-smi names: a GH200 is not an H200, and a V100 is matched only with its form factor and size
    ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA GH200 144G HBM3e", "GH200-144GB"), ("GH200", "GH200"),
    ("NVIDIA H200", "H200-SXM-141GB"), ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("Tesla V100-PCIE-16GB", "V100-PCIe-16GB"), ("V100", None)])
def test_catalog_names(reported, canonical):
    assert hardware.canonical_gpu_type(reported) == canonical


def test_no_bf16_peak_on_a_gpu_without_bf16():
    # V100 has FP16 tensor cores only: a bf16 run on it gets no MFU rather than one against another peak
    assert hardware.peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None
    assert hardware.peak_tflops("Tesla V100-SXM2-32GB", "fp16") == 125.0


@pytest.mark.parametrize("raw, key", [("torch.bfloat16", "bf16"), ("amp_bf16", "bf16"), ("FP8", "fp8"),
                                      ("FP8-CS", "fp8"), ("MXFP8", "fp8"), ("NVFP4", "fp4"), (None, None)])
def test_precision_canonical(raw, key):
    assert hardware.canonical_precision(raw) == key


def test_peaks_follow_precision():
    assert hardware.peak_tflops("H100", "bf16") == 989.0
    assert hardware.peak_tflops("H100", "fp8") == 1979.0
    assert hardware.peak_tflops("A100", "fp8") is None  # no FP8 on A100: no peak, rather than bf16's
    assert hardware.peak_tflops("H100", "int8") is None and hardware.peak_tflops("H100", None) is None
    assert hardware.peak_tflops("unknown-gpu", "bf16") is None


def test_mfu_derived_matches_the_sweeps_own_mfu(data_dir):
    """The Ultra-Scale sweep computed MFU with the same PaLM formula (its `mfu` column, percent).
    For PP=1 rows (where its parameter count is right) ours must agree within 0.5 %."""
    checked = 0
    with open(data_dir / "nanotron" / "bench_sample.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if r["status"] != "Success" or r["pp"] != "1" or not r["mfu"]:
                continue
            n = float(r["name"].split("G_")[0]) * 1e9
            fpt, method = flops_per_token(n, int(r["num_layers"]), int(r["hidden_size"]), int(r["seq_len"]))
            ours = fpt * float(r["tok/s/gpu"]) / 989e12
            assert method == "6N+12Lhs"
            assert ours == pytest.approx(float(r["mfu"]) / 100, rel=5e-3), r["name"]
            checked += 1
    assert checked > 50


def test_hfu_counts_the_recompute_forward():
    rec = RunIn(model_params=8_000_000_000, num_layers=32, hidden_size=4096, seq_len=4096, nodes=1, gpus_per_node=8,
                gpu_type="H100", precision="bf16", tokens_per_sec_per_gpu=3000.0, recompute="full").model_dump()
    row, errors = complete(rec)
    assert not errors
    assert row["hfu_derived"] / row["mfu_derived"] == pytest.approx(
        (8 * 8e9 + 16 * 32 * 4096 * 4096) / (6 * 8e9 + 12 * 32 * 4096 * 4096))


def test_moe_uses_active_parameters():
    assert active_params("Qwen3-30B-A3B", {}) == 3_000_000_000
    assert active_params("LLAMA3_70B", {}) is None
    rec = RunIn(model_name="Qwen3_30B_a3B", model_params=30_000_000_000, nodes=1, gpus_per_node=8, ep=8,
                gpu_type="H100", precision="bf16", tokens_per_sec_per_gpu=10000.0).model_dump()
    row, errors = complete(rec)
    assert not errors and row["model_size_class"] == 30.0
    assert row["mfu_derived"] == pytest.approx(6 * 3e9 * 10000.0 / 989e12)
    unknown = RunIn(model_name="MysteryMoE", model_params=600_000_000_000, nodes=1, gpus_per_node=8, ep=8,
                    gpu_type="H100", precision="bf16", tokens_per_sec_per_gpu=900.0).model_dump()
    row, errors = complete(unknown)
    assert not errors and row["mfu_derived"] is None and "active params" in row["mfu_method"]


def test_partial_node_and_derived_dims():
    row, errors = complete(RunIn(nodes=1, gpus_per_node=8, world_size=4, tp=2, pp=1, cp=1).model_dump())
    assert not errors and row["dp"] == 2 and row["extra"]["derived_fields"] == ["dp"]
    assert row["ep"] is None and "assumed_fields" not in row["extra"]
    row, errors = complete(RunIn(world_size=64, gpus_per_node=8, tp=4, pp=2, cp=1).model_dump())
    assert not errors and (row["nodes"], row["dp"]) == (8, 8)
    _, errors = complete(RunIn(world_size=64, tp=3, pp=1, cp=1).model_dump())
    assert errors and errors[0].field == "world_size" and "divisible" in errors[0].message


def test_unstated_degrees_stay_null_unless_the_invariant_determines_them():
    """Issue 15 item 3: a degree the record neither states nor implies is None, never 1."""
    # two unknowns (pp, cp) besides dp: tp·pp·cp·dp = 64 does not determine them
    row, errors = complete(RunIn(world_size=64, tp=4).model_dump())
    assert not errors
    assert (row["dp"], row["tp"], row["pp"], row["cp"], row["ep"]) == (None, 4, None, None, None)
    assert row["extra"] is None  # nothing derived, nothing assumed
    # one unknown with the others known: determined (64 / (4·2·1) = 8)
    row, errors = complete(RunIn(world_size=64, tp=4, pp=2, cp=1).model_dump())
    assert not errors and row["dp"] == 8 and row["extra"]["derived_fields"] == ["dp"]
    row, errors = complete(RunIn(world_size=64, dp=8, tp=4, pp=1).model_dump())
    assert not errors and row["cp"] == 2 and row["extra"]["derived_fields"] == ["cp"]
    assert row["ep"] is None
    # the known degrees already fill the world: every unknown one must be 1 (degrees are >= 1)
    row, errors = complete(RunIn(nodes=1, gpus_per_node=8, dp=8).model_dump())
    assert not errors and (row["tp"], row["pp"], row["cp"]) == (1, 1, 1)
    assert row["extra"]["derived_fields"] == ["cp", "pp", "tp", "world_size"]
    # world size from the degrees only when all four are known
    row, errors = complete(RunIn(dp=4, tp=2).model_dump())
    assert not errors and row["world_size"] is None and row["pp"] is None
    row, errors = complete(RunIn(nodes=2, gpus_per_node=8, dp=4, tp=2, pp=2, cp=1, ep=1).model_dump())
    assert not errors and row["world_size"] == 16 and row["extra"]["derived_fields"] == ["world_size"]
    # known degrees that cannot divide the world are refused, naming the values
    _, errors = complete(RunIn(world_size=12, tp=8).model_dump())
    assert errors and errors[0].field == "world_size" and "tp=8" in errors[0].message
    # ep divisibility checked only when ep, dp, cp and tp are known
    _, errors = complete(RunIn(world_size=8, tp=2, ep=3).model_dump())
    assert not errors
    _, errors = complete(RunIn(world_size=8, dp=4, tp=2, pp=1, cp=1, ep=3).model_dump())
    assert errors and errors[0].field == "ep"
    # the fingerprint tells an unknown degree from a stated 1
    a, _ = complete(RunIn(world_size=16, dp=4, tp=2).model_dump())
    b, _ = complete(RunIn(world_size=16, dp=4, tp=2, pp=2, cp=1).model_dump())
    assert a["fingerprint"] != b["fingerprint"]
    assert not math.isnan(model_size_class(10**12))


def test_unknown_precision_gets_no_mfu_and_says_why():
    """The peak depends on the precision (H100: 989 bf16, 1,979 fp8): no precision, no MFU."""
    rec = RunIn(model_params=8_000_000_000, nodes=1, gpus_per_node=8, gpu_type="H100",
                tokens_per_sec_per_gpu=3000.0).model_dump()
    row, errors = complete(rec)
    assert not errors and row["mfu_derived"] is None and row["peak_tflops"] is None
    assert "precision unknown" in row["mfu_method"]
    fp8, _ = complete({**rec, "precision": "fp8"})
    bf16, _ = complete({**rec, "precision": "bf16"})
    assert bf16["mfu_derived"] == pytest.approx(2 * fp8["mfu_derived"], rel=0.01)


def test_a_bf16_run_on_a_v100_is_stored_without_an_mfu_and_says_why():
    rec = RunIn(model_params=1_300_000_000, nodes=1, gpus_per_node=8, gpu_type="Tesla V100-SXM2-32GB",
                precision="bf16", tokens_per_sec_per_gpu=3000.0, seq_len=2048).model_dump()
    row, errors = complete(rec)
    assert not errors and row["gpu_type"] == "V100-SXM2-32GB"
    assert row["mfu_derived"] is None and "no bf16 peak" in row["mfu_method"] and len(row["mfu_method"]) <= 64
