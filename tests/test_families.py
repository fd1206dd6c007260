"""core/families.py: the fixed log grid of model-size families and the grouping of heatmap cells
by the one best-run rule. Expected families are written out by hand from the grid's documented
boundaries, not computed by the code under test."""

from __future__ import annotations

import itertools
import math

import pytest

from core.families import FAMILIES, family_of, group_cells, row_label
from core.rules import best_key


@pytest.mark.parametrize("size_b, label", [
    (0.12, "≤200M"), (0.35, "350M"), (0.76, "760M"), (1.3, "1–2B"), (1.7, "1–2B"), (2.7, "3B"), (3.6, "3B"),
    (6.7, "7–8B"), (7.0, "7–8B"), (7.5, "7–8B"), (8.0, "7–8B"), (13.0, "13B"), (16.0, "13B"), (20.0, "20B"),
    (30.0, "30–34B"), (34.0, "30–34B"), (70.0, "70B"), (76.0, "70B"), (175.0, "175B"), (405.0, "405B"),
    (1200.0, "1T+"),
])
def test_family_of_the_usual_model_sizes(size_b, label):
    assert family_of(size_b).label == label


def test_the_grid_is_contiguous_and_rejects_bad_sizes():
    for lower, upper in itertools.pairwise(FAMILIES):
        assert lower.hi_b == upper.lo_b
    assert FAMILIES[0].lo_b == 0 and FAMILIES[-1].hi_b == math.inf
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError):
            family_of(bad)


def cell(size, nodes, run_id, tps, mfu, name="llama", n=(1, 0, 0), ep=1):
    best = None if run_id is None else {"id": run_id, "tokens_per_sec_per_gpu": tps, "mfu_derived": mfu,
                                        "model_name": name, "model_size_class": size, "ep": ep}
    return {"model_size_class": size, "nodes": nodes, "best": best, "config_label": f"run{run_id}",
            "n_success": n[0], "n_oom": n[1], "n_failed": n[2]}


def test_group_cells_keeps_the_best_by_metric_then_mfu_then_id():
    cells = [cell(6.7, 8, 1, 1000.0, 0.30, n=(3, 1, 0)), cell(7.0, 8, 2, 1200.0, 0.20, n=(2, 0, 1)),
             cell(8.0, 8, 3, 1200.0, 0.25, n=(1, 2, 0)), cell(7.5, 8, 4, 1200.0, 0.25), cell(7.1, 16, None, None, None,
                                                                                            n=(0, 4, 0))]
    out = group_cells(cells, "tokens_per_sec_per_gpu")
    assert [(c["family"], c["nodes"]) for c in out] == [("7–8B", 8), ("7–8B", 16)]
    eight = out[0]
    assert eight["best"]["id"] == 3  # 1200 tok/s ties: MFU 0.25 beats 0.20; id 3 beats id 4
    assert eight["sizes"] == [6.7, 7.0, 7.5, 8.0]
    assert (eight["n_success"], eight["n_oom"], eight["n_failed"]) == (7, 3, 1)
    assert eight["model_size_class"] == 8.0 and eight["config_label"] == "run3"
    assert out[1]["best"] is None and out[1]["n_oom"] == 4  # failure-only stays marked
    by_mfu = group_cells(cells, "mfu")
    assert by_mfu[0]["best"]["id"] == 1


def test_runs_without_the_metric_rank_last_and_moe_rows_stay_apart():
    a, b = cell(13.0, 1, 10, None, 0.5), cell(13.0, 1, 11, 500.0, 0.1)
    assert best_key(b["best"], "tokens_per_sec_per_gpu") < best_key(a["best"], "tokens_per_sec_per_gpu")
    moe = cell(30.0, 2, 20, 9000.0, 0.2, name="Qwen3-30B-A3B", ep=8)
    dense = cell(32.0, 2, 21, 1000.0, 0.4, name="qwen2.5-32b")
    assert row_label(moe) == "30–34B MoE (A3B)" and row_label(dense) == "30–34B"
    out = group_cells([moe, dense])
    assert [c["family"] for c in out] == ["30–34B", "30–34B MoE (A3B)"]
    # the API's moe flag decides (core.model.is_moe at write time): a MoE name without an active
    # count is a MoE row all the same, never the dense one
    gpt_oss = {**cell(120.0, 8, 22, 7000.0, 0.3, name="GPT OSS 120B", ep=8), "moe": True}
    gpt3 = {**cell(180.0, 8, 23, 900.0, 0.4, name="GPT3-175B"), "moe": False}
    assert [c["family"] for c in group_cells([gpt_oss, gpt3])] == ["175B", "175B MoE"]
