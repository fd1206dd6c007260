"""The throughput model's array paths (issue 25 item 4: /recommend and /suggest cost thousands of
configurations per request as numpy arrays) give, configuration by configuration, what the one-at-a-time
calls give — on real configuration rows read back from both backends, with rows the model cannot cost
mixed in: throughput_terms.terms_table against terms(), Model.predict_many against predict(),
Anchors.corrections against correction(), recommend.predicted_many against predicted_for()."""

from __future__ import annotations

import math

from conftest import playbook_sample

from service import store
from service.analytics import anchor
from service.analytics import recommend as rec
from service.analytics import throughput as th
from service.analytics import throughput_terms as tt


def _rows(database, data_dir) -> list[dict]:
    with database.session(write=True) as s:
        store.store_runs(s, playbook_sample(data_dir).records)
    with database.session() as s:
        rows = th.load_configs(s)
    assert len(rows) > 50
    return rows


def _variants(rows: list[dict]) -> list[dict]:
    """The rows, then copies that take the other branches of the formulas (full recompute, no
    FlashAttention, each ZeRO stage, another framework, TP across nodes, CP), then rows that cannot be
    costed (a degree of 0, no seq_len, an unknown GPU, a precision without a peak, no micro-batch)."""
    out = list(rows)
    for i, r in enumerate(rows[:40]):
        out.append({**r, "recompute": ("full", "selective", None)[i % 3],
                    "flash_attention": (False, None, True, "false", "1")[i % 5],
                    "zero_stage": (0, 1, 2, 3, None)[i % 5],
                    "framework": ("megatron-lm", None, "Nanotron", "nanotron")[i % 4]})
    out.append({**rows[0], "nodes": 4, "tp": 16, "dp": 2, "pp": 1, "cp": 1})
    out.append({**rows[1], "cp": 2, "dp": max(1, (rows[1]["dp"] or 2) // 2)})
    out += [{**rows[0], "tp": 0}, {**rows[1], "seq_len": None}, {**rows[2], "gpu_type": "no-such-gpu"},
            {**rows[3], "precision": "fp4"}, {**rows[4], "micro_batch_size": None}]
    return out


def test_terms_table_equals_terms_one_at_a_time(database, data_dir):
    cfgs = _variants(_rows(database, data_dir))
    for network in (None, 300.0):
        intra = [c.get("ar_intra_gb_s") for c in cfgs]
        table, kept = tt.terms_table(cfgs, network_gb_s=network, intra_bw_recorded=intra)
        one = [th.config_terms(c, network) for c in cfgs]
        assert kept == [i for i, t in enumerate(one) if t is not None]
        assert len(kept) == len(cfgs) - 5
        for j, i in enumerate(kept):
            for f in tt.Terms.__dataclass_fields__:
                assert table[f][j] == getattr(one[i], f), (i, f)
        # the rows' own view (throughput.rows_terms) and the request's (Model.terms_table) are the same table
        rows_table, rows_kept = th.rows_terms(cfgs, network)
        model_table, model_kept = th.Model(cfgs).terms_table(cfgs[::-1], network)
        assert rows_kept == kept and model_kept == [len(cfgs) - 1 - i for i in kept][::-1]
        for f in table:
            assert list(rows_table[f]) == list(table[f]) == list(model_table[f][::-1])


def test_predictions_and_corrections_in_arrays_equal_one_at_a_time(database, data_dir):
    rows = _rows(database, data_dir)
    model = th.Model(rows)
    cfgs = _variants(rows)
    many = model.predict_many(cfgs, "nanotron")
    for cfg, pred in zip(cfgs, many):
        try:
            one = model.predict(cfg, "nanotron")
        except (ValueError, ZeroDivisionError):
            one = None
        assert pred == one
    assert sum(p is None for p in many) == 5
    fit = model.fit_for("H100-SXM-80GB", "nanotron")
    anchors = anchor.Anchors(rows, fit, lambda r: abs(math.log(r["nodes"] / 4)),
                             terms_of=lambda rs: model.terms_table(rs, fit.network_gb_s))
    layouts = [{"tp": c["tp"], "pp": c["pp"], "cp": c["cp"] or 1, "recompute": c["recompute"],
                "micro_batch_size": c["micro_batch_size"], "zero_stage": c["zero_stage"] or 0} for c in cfgs[:-5]]
    assert anchors.corrections(layouts) == [anchors.correction(c) for c in layouts]
    assert any(d0 is not None for _, d0, _ in anchors.corrections(layouts))
    # a family's kriging set-up is built when a candidate first asks of it: asked in another order, one
    # family at a time, a fresh Anchors gives the same corrections
    fresh = anchor.Anchors(rows, fit, lambda r: abs(math.log(r["nodes"] / 4)),
                           terms_of=lambda rs: model.terms_table(rs, fit.network_gb_s))
    assert [fresh.correction(c) for c in layouts[::-1]][::-1] == anchors.corrections(layouts)


def test_recommend_scores_in_arrays_equal_one_at_a_time(database, data_dir):
    _rows(database, data_dir)
    target = rec.Target(model_params=3_570_000_000, nodes=4)
    with database.session() as s:
        prep = rec.prepare(s, target)
    anchors, by_layout = rec.anchors_for(prep), rec.layout_distances(prep)
    cfgs = rec.layouts(prep.ctx, prep.rows)
    assert len(cfgs) > 20
    assert rec.predicted_many(prep, cfgs, anchors, by_layout) == [rec.predicted_for(prep, c, anchors, by_layout)
                                                                   for c in cfgs]
    assert [(s.config, s.predicted) for s in rec.scored(prep)] == [
        (c, rec.predicted_for(prep, c, anchors, by_layout)) for c in cfgs]


def test_distances_in_arrays_equal_the_formula_row_by_row(database, data_dir):
    """target.distances (every row at once) against the module docstring's formula per row: |ln| ratios of
    size class, nodes and seq_len (0 where a side is unknown) plus the hardware penalty, rounded to 4."""
    from service.analytics import target as tg

    rows = _rows(database, data_dir)
    rows = rows + [{**rows[0], "model_size_class": None}, {**rows[1], "nodes": None, "seq_len": 0},
                   {**rows[2], "gpu_type": "A100-SXM-80GB"}, {**rows[3], "gpu_type": "MI300X"}]

    def log_ratio(a, b):
        return abs(math.log(a / b)) if a and b else 0.0

    for size, nodes, seq, gpu in ((8.0, 8, 4096, "H100-SXM-80GB"), (1.34, 2, None, None), (70.0, 16, 8192, "MI300X")):
        want = [round(log_ratio(r["model_size_class"], size) + log_ratio(r["nodes"], nodes)
                      + log_ratio(r["seq_len"], seq) + tg.hw_penalty(gpu, r["gpu_type"]), 4) for r in rows]
        assert tg.distances(rows, size, nodes, seq, gpu) == want
        assert [tg.distance(r, size, nodes, seq, gpu) for r in rows] == want
        ranked = tg.ranked_rows(rows, size, nodes, seq, gpu)
        assert ranked == sorted(rows, key=lambda r: (want[rows.index(r)], -r["n_runs"]))


def test_fit_with_the_one_pass_jacobian_equals_scipys(database, data_dir):
    """throughput.fit's finite-difference Jacobian (all perturbed residuals in one array pass) gives the
    fit scipy's own two-point loop gives: the same parameters and held-out errors, to the last bit — on the
    sample's configurations, and on a subset that holds some parameters at the PRIOR."""
    rows = _rows(database, data_dir)
    for subset in (rows, [r for r in rows if r["pp"] == 1]):
        ours = th.fit(subset, {}, None)
        scipys = th.fit(subset, {}, None, scipy_jacobian=True)
        assert ours.status == scipys.status == "fitted"
        assert ours.params == scipys.params
        assert (ours.loo_log_q80, ours.loo_log_sigma, ours.loo_median_rel_err) == (
            scipys.loo_log_q80, scipys.loo_log_sigma, scipys.loo_median_rel_err)


def test_config_values_field_by_field_equal_config_value_row_by_row(database, data_dir):
    from service.analytics import on_target

    rows = _rows(database, data_dir)
    rows = rows + [{**rows[0], "zero_stage": None, "recompute": None, "cp": None}, {"tp": 2}]
    assert on_target.config_values(rows, rec.LAYOUT_FIELDS) == [
        tuple(on_target.config_value(r, f) for f in rec.LAYOUT_FIELDS) for r in rows]
    assert on_target.config_values(rows, ()) == [() for _ in rows]
