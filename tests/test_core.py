"""core/: the domain rules written once, and the three disagreements their copies caused (issue 24):
- `model_params=8` meant 8 parameters on GET /runs and 8·10⁹ on /recommend: one parser now, 8·10⁹ both;
- "half" became fp16 through the log parsers but a POSTed "half" was stored with no MFU: one normaliser;
- an unknown CP showed as "CP?" in the heatmap and was hidden by `scalebook runs`: one label.
Expected values are written out by hand from the documented rules, not computed by the code under test."""

from __future__ import annotations

import math

import httpx
import pytest
from typer.testing import CliRunner

from core.hardware import canonical_precision, peak_tflops
from core.layout import layout_breaches
from core.model import ModelShape, params_from_dims, resolve_shape, stage_split
from core.record import parse_count, parse_param_count
from core.rules import best_key, config_label, effective_mfu
from service.analytics.recommend import LayoutOptions, enumerate_layouts
from service.analytics.target import CompletedTarget

RUN = {"model_name": "custom-8b", "model_params": 8_000_000_000, "seq_len": 4096, "gpu_type": "H100",
       "gpus_per_node": 8, "nodes": 1, "tp": 1, "pp": 1, "cp": 1, "micro_batch_size": 1,
       "grad_accum_steps": 1, "precision": "bf16", "status": "success", "tokens_per_sec_per_gpu": 1000.0}


@pytest.mark.parametrize("text, expected", [
    ("8B", 8 * 10**9), ("1.34B", 1_340_000_000), ("8e9", 8 * 10**9), ("350M", 350 * 10**6), ("1.3b", 1_300_000_000),
    ("1T", 10**12), ("8,030,261,248", 8_030_261_248), (8_030_261_248, 8_030_261_248), ("1.34G", 1_340_000_000),
    # a bare number below 10,000 is billions, whether text or a number
    ("8", 8 * 10**9), (8, 8 * 10**9), ("470", 470 * 10**9), ("1.5", 1_500_000_000), ("12345", 12345),
])
def test_parse_param_count(text, expected):
    assert parse_param_count(text) == expected


@pytest.mark.parametrize("text", ["eight", "0", "-8B", "12345.5", "", "8Q", True, float("nan")])
def test_parse_param_count_refuses_with_the_value(text):
    with pytest.raises(ValueError, match="parameter count"):
        parse_param_count(text)


def test_parse_count_reads_tokens_without_the_billions_rule():
    assert parse_count("11T") == 11 * 10**12 and parse_count("500B") == 500 * 10**9 and parse_count("2,048") == 2048
    assert parse_count("8") == 8 and parse_count(1.5e12) == 1_500_000_000_000 and parse_count("1P") == 10**15
    with pytest.raises(ValueError, match="token count"):
        parse_count("0.4", what="token count")


@pytest.mark.parametrize("raw, key", [
    ("half", "fp16"), ("HALF", "fp16"), ("torch.float16", "fp16"), ("16-mixed", "fp16"), ("bf16-mixed", "bf16"),
    ("None (bfloat16)", "bf16"), ("Float8 tensorwise", "fp8"), ("FP8-CS", "fp8"), ("NVFP4", "fp4"),
    ("float", "fp32"), ("torch.float32", "fp32"), ("float64", "fp64"), ("  ", None), (None, None),
    ("int4-awq", "int4-awq"),
])
def test_one_precision_normaliser(raw, key):
    assert canonical_precision(raw) == key


def test_half_precision_has_a_peak():
    assert peak_tflops("H100-SXM-80GB", "half") == 989.0 and peak_tflops("A100", "torch.float16") == 312.0


def test_config_label_shows_what_is_unknown():
    assert config_label({"dp": 8, "tp": 1, "pp": 1, "cp": 1, "zero_stage": 1, "micro_batch_size": 2,
                         "grad_accum_steps": 16}) == "DP8 TP1 PP1 GAS16 Z1 MBS2"
    assert config_label({"dp": None, "tp": 2, "pp": 1, "cp": None, "ep": None, "zero_stage": 0,
                         "micro_batch_size": 1, "grad_accum_steps": 4, "recompute": "full"}) \
        == "DP? TP2 PP1 CP? GAS4 Z0 MBS1 RC:full"
    assert config_label({"dp": 4, "tp": 2, "pp": 1, "cp": 2, "ep": 4}).startswith("DP4 TP2 PP1 CP2 EP4 ")


def test_best_key_orders_metric_then_mfu_then_id():
    runs = [{"id": 5, "tokens_per_sec_per_gpu": 100.0, "mfu": 0.3},
            {"id": 4, "tokens_per_sec_per_gpu": 100.0, "mfu_derived": 0.3, "mfu": 0.9},
            {"id": 3, "tokens_per_sec_per_gpu": None, "mfu": 0.5},
            {"id": 2, "tokens_per_sec_per_gpu": 100.0, "mfu": 0.4}]
    assert [r["id"] for r in sorted(runs, key=best_key)] == [2, 4, 5, 3]
    assert [r["id"] for r in sorted(runs, key=lambda r: best_key(r, "mfu"))] == [3, 2, 4, 5]
    assert best_key(None) > best_key(runs[3]) and effective_mfu(runs[1]) == 0.3 and effective_mfu(None) is None


def test_the_one_parameter_count_from_dims():
    # Llama-2 7B: 32 layers, h 4096, 32 heads, ffn 11008, vocab 32000, untied: 6,738,415,616 (its model card)
    assert params_from_dims({"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 32,
                             "ffn_hidden_size": 11008, "vocab_size": 32000}) == 6_738_415_616
    # without the FFN width: SwiGLU 8h/3 rounded up to 256 = 11008, the same model
    assert params_from_dims({"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "vocab_size": 32000}) \
        == 6_738_415_616
    assert params_from_dims({"num_layers": 32, "hidden_size": 4096}) is None  # no vocabulary: not guessed
    notes: list[str] = []
    shape = resolve_shape({"model_params": 8_030_261_248, "num_layers": 32, "hidden_size": 4096, "num_heads": 32,
                           "num_kv_heads": 8, "vocab_size": 128256}, notes)
    assert shape.ffn == 14336 and not shape.tied and any("ffn_hidden_size=14336" in n for n in notes)


def test_stage_split_matches_nanotron_and_megatron():
    sweep_1b = ModelShape(h=2048, layers=16, heads=32, kv=32, ffn=8192, vocab=131072, tied=True)
    assert stage_split(sweep_1b, 8, balanced=True) == ([3, 2, 3, 2, 3, 2, 1, 0], 6)
    assert stage_split(sweep_1b, 2, balanced=True)[0][0] == 10  # the sweep's "Local Params"
    assert stage_split(sweep_1b, 3, balanced=False) == ([6, 5, 5], 2)


def test_the_one_layout_rule():
    """core.layout.layout_breaches: each rule breaks on its own dim, an unknown dim does not constrain."""
    ok = {"num_heads": 32, "num_kv_heads": 8, "num_layers": 16, "seq_len": 4096}
    assert layout_breaches(tp=8, pp=16, cp=2, **ok) == []
    assert layout_breaches(tp=16, pp=1, cp=1, **ok) == []  # 8 KV heads, each on 2 of 16 TP ranks
    assert [b.dim for b in layout_breaches(tp=3, pp=1, cp=1, **ok)] == ["num_heads", "num_kv_heads"]
    assert [(b.field, b.dim_value) for b in layout_breaches(tp=1, pp=17, cp=3, **ok)] == [("pp", 16), ("cp", 4096)]
    assert layout_breaches(tp=3, pp=99, cp=1, num_heads=None, num_kv_heads=None, num_layers=None, seq_len=None) == []


def test_recommend_and_predict_apply_the_same_layout_rule(nanotron_client):
    """12 heads in 3 KV groups: TP 2 and 4 split the heads but not the KV groups. /recommend's layouts
    leave them out (the rule used to be written twice and recommend's copy had no KV rule) and
    /predict refuses TP 4 naming tp."""
    ctx = CompletedTarget(model_params=1_000_000_000, nodes=1, gpus_per_node=8, gpu_type="H100-SXM-80GB",
                          seq_len=4096, precision="bf16", num_layers=12, hidden_size=1536, num_heads=12,
                          num_kv_heads=3, global_batch_tokens=1 << 20)
    opts = LayoutOptions(tp=[1, 2, 4, 8], pp=[1, 2], cp=[1], zero_stage=[0], recompute=["none"],
                         micro_batch_size=[1, 2])
    assert {c["tp"] for c in enumerate_layouts(ctx, opts)} == {1}
    body = {"model_params": "1B", "nodes": 1, "gpu_type": "H100", "seq_len": 4096, "dp": 2, "tp": 4,
            "micro_batch_size": 1, "grad_accum_steps": 128, "num_layers": 12, "hidden_size": 1536,
            "num_heads": 12, "num_kv_heads": 3, "ffn_hidden_size": 4096, "vocab_size": 32000}
    r = nanotron_client.post("/api/v1/predict", json=body)
    assert r.status_code == 422 and r.json()["error"]["details"][0]["field"] == "tp", r.text
    assert "num_kv_heads 3" in r.json()["error"]["message"]
    ok = nanotron_client.post("/api/v1/predict", json={**body, "tp": 1, "dp": 8, "grad_accum_steps": 32})
    assert ok.status_code == 200, ok.text


# ------------------------------------------------------------------------------ through the API
def test_model_params_8_means_eight_billion_on_runs_and_recommend(client):
    assert client.post("/api/v1/runs", json={**RUN, "run_key": "a"}).status_code == 201
    assert client.post("/api/v1/runs", json={**RUN, "run_key": "b", "model_params": 8}).status_code == 201
    page = client.get("/api/v1/runs", params={"model_params": "8"}).json()
    assert [r["run_key"] for r in page["runs"]] == ["a"]
    assert client.get("/api/v1/runs", params={"model_params": "8B"}).json()["total"] == 1
    rec = client.get("/api/v1/recommend", params={"model_params": "8", "nodes": 1, "gpu_type": "H100"})
    assert rec.status_code == 200, rec.text
    assert rec.json()["target"]["model_params"] == 8 * 10**9
    bad = client.get("/api/v1/runs", params={"model_params": "12345.5"})
    assert bad.status_code == 422 and bad.json()["error"]["details"][0]["field"] == "model_params"


def test_a_posted_half_precision_run_gets_an_mfu(client):
    r = client.post("/api/v1/runs", json={**RUN, "precision": "half"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["precision"] == "fp16" and body["extra"]["precision_reported"] == "half"
    assert body["peak_tflops"] == 989.0
    assert math.isclose(body["mfu_derived"], 6 * 8e9 * 1000.0 / 989e12, rel_tol=1e-9)  # 6N: no dims given


def test_runs_table_shows_an_unknown_cp_as_the_heatmap_does(live_api):
    from service.cli import app

    loose = {**RUN, "dp": None, "cp": None, "pp": None}  # tp 1 of 8 GPUs: dp, pp, cp not determined
    with httpx.Client(base_url=live_api) as http:
        stored = http.post("/api/v1/runs", json=loose)
        assert stored.status_code == 201, stored.text
        assert stored.json()["cp"] is None
    out = CliRunner().invoke(app, ["runs"], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.stdout
    words = out.stdout.split()  # the label may wrap inside its cell at 80 columns
    assert {"DP?", "PP?", "CP?", "Z?"} <= set(words), out.stdout
