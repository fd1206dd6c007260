"""Evidence anchoring (service/analytics/anchor.py) checked against rows it was not fitted on, on
both backends: the throughput model is fitted on the nanotron sample's 1- and 2-node runs, its
residuals there anchor the predictions for the 4-node runs it never saw."""

from __future__ import annotations

import math
import statistics

from conftest import playbook_sample

from service.analytics import anchor


def _held_out(database, data_dir):
    from service import store
    from service.analytics import throughput as th
    from service.tables import Run

    records = playbook_sample(data_dir).records
    with database.session(write=True) as s:
        store.store_runs(s, records)
    with database.session() as s:
        train = th.load_configs(s, exclude=Run.nodes == 4)
        held = [r for r in th.load_configs(s) if r["nodes"] == 4]
    return th, train, held


def test_anchoring_does_not_worsen_held_out_predictions(database, data_dir):
    """On the 4-node configurations whose layout ran at 1 or 2 nodes and that ran normally (at least
    anchor.ANCHOR_FRACTION of their cell's best: a pathologically slow run is neither evidence nor
    what anchoring claims to predict), the anchored prediction's median error is no larger than the
    model's own, no correction exceeds what the evidence's residuals allow (|correction| <= the
    largest |residual| of the family), and the evidence leaves a kriging variance in (0, 1]."""
    th, train, held = _held_out(database, data_dir)
    held = anchor.evidence_rows(held)
    assert train and held and all(r["nodes"] != 4 for r in train)
    model = th.Model(train)
    fit = model.fit_for("H100-SXM-80GB", "nanotron")
    assert fit.status == "fitted"
    anchors = anchor.Anchors(train, fit, lambda r: abs(math.log(r["nodes"] / 4)))
    raw_err, anchored_err = [], []
    for r in held:
        cfg = {"tp": r["tp"], "pp": r["pp"], "cp": r["cp"], "recompute": r["recompute"],
               "micro_batch_size": r["micro_batch_size"], "zero_stage": r["zero_stage"] or 0}
        log_corr, d0, variance = anchors.correction(cfg)
        group = anchors.groups.get(anchor._family(cfg))
        if d0 is None:
            assert log_corr == 0.0 and variance == 1.0 and not group
            continue
        assert abs(log_corr) <= max(abs(x) for _, x, _ in group) + 1e-12
        assert 0.0 < variance <= 1.0
        pred = model.predict(r, "nanotron")["tokens_per_sec_per_gpu"]
        raw_err.append(abs(pred / r["tokens_per_sec_per_gpu"] - 1))
        anchored_err.append(abs(pred * math.exp(log_corr) / r["tokens_per_sec_per_gpu"] - 1))
    assert len(anchored_err) >= 10
    assert statistics.median(anchored_err) <= statistics.median(raw_err)


def test_correlation_lengths_from_residual_pairs():
    """Pairs one node doubling apart with identical residuals: the longest length; residuals that
    do not correlate: the shortest; no pairs: the documented prior."""
    base = {"tp": 1, "pp": 1, "cp": 1, "recompute": "none", "gpu_type": "H100-SXM-80GB", "seq_len": 4096,
            "model_size_class": 1.3, "zero_stage": 1}
    same, anti = [], []
    for i in range(anchor.MIN_PAIRS + 2):
        x = 0.1 * ((i * 7) % 5 - 2)
        for nodes in (1, 2):
            row = {**base, "micro_batch_size": 2 ** i, "nodes": nodes}
            same.append((row, x))
            anti.append((row, x if nodes == 1 else -x))
    assert anchor.correlation_lengths(same)["target"].length == anchor.LAMBDA_MAX
    assert anchor.correlation_lengths(anti)["target"].length == anchor.LAMBDA_MIN
    assert anchor.correlation_lengths([])["target"].length == anchor.LAMBDA_PRIOR
    assert anchor.correlation_lengths([])["target"].rho is None


def test_kriging_variance_shrinks_with_evidence_on_both_sides(database, data_dir):
    """A layout recorded at 1 and 2 nodes leaves less uncertainty for a 2-node target than for a
    4-node one (evidence on one side only, farther)."""
    th, train, _ = _held_out(database, data_dir)
    fit = th.Model(train).fit_for("H100-SXM-80GB", "nanotron")
    both = {r["nodes"] for r in train}
    assert {1, 2} <= both
    row = next(r for r in train if r["nodes"] == 2 and any(
        o["nodes"] == 1 and all(o[k] == r[k] for k in ("tp", "pp", "cp", "micro_batch_size", "zero_stage"))
        for o in train))
    cfg = {k: row[k] for k in ("tp", "pp", "cp", "recompute", "micro_batch_size")}
    cfg["zero_stage"] = row["zero_stage"] or 0
    near = anchor.Anchors(train, fit, lambda r: abs(math.log(r["nodes"] / 2))).correction(cfg)[2]
    far = anchor.Anchors(train, fit, lambda r: abs(math.log(r["nodes"] / 4))).correction(cfg)[2]
    assert near < far <= 1.0


def test_recommend_keeps_the_memory_models_margin(nanotron_client):
    """Every predicted (not measured-on-target) candidate fits with the memory model's held-out
    error as headroom; /suggest, which explores, may go closer to the capacity."""
    from service.analytics.memory import DEFAULT_CONSTANTS
    from service.analytics.recommend import MEMORY_MARGIN

    body = nanotron_client.get("/api/v1/recommend", params={
        "model_params": "1.34B", "nodes": 8, "global_batch_tokens": 1_048_576, "k": 20}).json()
    assert body["candidates"]
    for c in body["candidates"]:
        if c["measured"] is None:
            usable = c["memory"]["gpu_memory_gib"] * DEFAULT_CONSTANTS.usable_fraction
            assert c["predicted"]["peak_memory_gib"] * (1 + MEMORY_MARGIN) <= usable + 1e-9


def test_cross_node_latencies_help_on_held_out_cross_node_runs(database, data_dir, monkeypatch):
    """Fitted on the 1- and 2-node runs only, the model with the cross-node latency terms
    (alpha_tp_x: TP collectives across nodes; alpha_pp_x: 1F1B sends between stages on other
    nodes) predicts the 4-node runs whose TP group or pipeline spans nodes better than the same
    fit with both terms pinned to 0."""
    from service.analytics.throughput_terms import world_layout

    th, train, held = _held_out(database, data_dir)
    crossing = []
    for r in held:
        _, tp, pp, cp, gpn = world_layout(r)
        if tp * cp * pp > gpn:
            crossing.append(r)
    assert len(crossing) >= 10

    def median_error() -> float:
        model = th.Model(train)
        assert model.fit_for("H100-SXM-80GB", "nanotron").status == "fitted"
        return statistics.median(abs(model.predict(r, "nanotron")["tokens_per_sec_per_gpu"]
                                     / r["tokens_per_sec_per_gpu"] - 1) for r in crossing)

    with_terms = median_error()
    for name in ("alpha_tp_x", "alpha_pp_x"):  # least_squares needs lower < upper: pinned at ~0
        monkeypatch.setitem(th._UPPER, name, 1e-12)
        monkeypatch.setitem(th.PRIOR, name, 0.0)
    without = median_error()
    assert with_terms < without
