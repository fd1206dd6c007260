#!/usr/bin/env python
"""The throughput model against vTrain's measured Megatron-DeepSpeed iterations (issue 25 item 5).

Data: <data>/vtrain/ground_truth_multi.csv (<data> as bench/recommend_loo.py: $SCALEBOOK_SHARED_DATA,
else <repo>/../shared/data): 109 measured iterations of GPT models (3.6B on 64 A100s, 18.4B on 256,
39.1B and 175B on 512) with Megatron-DeepSpeed — another framework, another GPU, at scale. What the
source states (its README): full activation recomputation, 1F1B, fp16, GPT-2 vocabulary (50,257),
GPT's two-matrix GELU MLP with ffn = 4·hidden, no ZeRO, 8 GPUs per node. It says "A100" without
the memory size: the catalog's generic A100 entry is taken (A100-SXM-80GB) — an assumption of this
bench, said in its output. tokens/s/GPU = global batch · seq_len / (iteration time · GPUs). The source
also states the cluster's network, 800 Gb/s per node between nodes — half the catalog's DGX A100 (8 ×
200 Gb/s): the multi-node rows carry it as the cluster's all-reduce bus bandwidth (NETWORK_GB_S), as a
nanotron bench run records its own, so the model costs the network these runs crossed.

Each row becomes a run record and the rows are aggregated exactly as service.analytics.throughput's
load_configs aggregates stored runs (one row per configuration, its best tokens/s/GPU). Three checks:

1. leave-one-configuration-out: the model fitted on every other configuration predicts the one
   left out (the fit's own interpolation error);
2. leave-one-model-size-out: fitted on the other three sizes, it predicts every configuration of
   the size left out (extrapolation in model size and GPU count);
3. per (model size, GPU count) group, with that size left out: the configuration ranked first by
   the recommender's ranking (service.analytics.recommend: the anchored prediction's pessimistic
   end times the probability that it fits) among the group's measured configurations — is its
   measured tokens/s/GPU within 5 % of the group's best? And how many measured configurations
   (all of which ran) the memory model calls "does not fit"; and the size-left-out errors by band of the
   configuration's share of its group's best (BANDS): the smallest model (3.6B) fitted on the larger ones is the
   nearest these runs come to single-node runs of small GPT models, and its slow configurations (TP8–TP16 at
   micro-batch 2) the nearest to the slow configurations judged there;
4. the same ranking with the group's other configurations recorded: each configuration scored by the
   recommender fitted and anchored on every other row, its own left out (groups_with_evidence).

Targets (issue 25): leave-size-out mean error <= 10 %; 4 of 4 groups. vTrain's own simulator:
14.73 % mean error on these runs.

`--network catalog` feeds no network (the situation of a user whose runs do not record it): the catalog's DGX A100
line rate, twice what these runs had (bench/RESULTS.md, "Issue 25, sixth pass": fitting the network instead was
tried and not kept).

`--predict CSV`: every row of another CSV in vTrain's format (the twelve columns of ground_truth_multi.csv; a run on
fewer than 8 GPUs is one node of that many) predicted from all of vTrain's multi-node configurations — per row, mean
|error| and signed mean, by GPU count and TP degree (predict_file).

Usage: PYTHONPATH=$PWD .venv/bin/python bench/vtrain_accuracy.py [--json] [--network stated|catalog] [--predict CSV]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.memory_accuracy import data_dir  # noqa: E402
from core.model import model_size_class  # noqa: E402
from service.analytics import on_target  # noqa: E402
from service.analytics import recommend as rec  # noqa: E402
from service.analytics import throughput as th  # noqa: E402
from service.analytics.memory import estimate_memory  # noqa: E402
from service.analytics.target import CompletedTarget  # noqa: E402
from service.analytics.throughput_terms import CATALOG_NETWORK_EFFICIENCY  # noqa: E402
from service.cli import benchmark as benchtool  # noqa: E402

GPU = "A100-SXM-80GB"
FRAMEWORK = "megatron-deepspeed"
VOCAB = 50257
#: the cluster's full-node all-reduce bus bandwidth across nodes, GB/s: the source's 800 Gb/s per node (its README and
#: config files: "cluster links of 800 Gb/s per node between nodes") at the catalog's achieved fraction of the line
#: rate (throughput_terms.CATALOG_NETWORK_EFFICIENCY, read off the Ultra-Scale sweep's recorded all-reduce), carried
#: on the multi-node rows as a run's recorded all-reduce bandwidth (allreduce_gb_s), which
#: throughput.network_reference reads. Without it the model takes the catalog's A100 network, DGX A100's 8 × 200 Gb/s,
#: twice what these runs had: TP16 across two nodes predicted 21–43 % too fast, the fit's a_dp at 4.4 instead of 1.9
#: (bench/RESULTS.md, "Issue 25, sixth pass")
NETWORK_GB_S = 800 / 8 * CATALOG_NETWORK_EFFICIENCY


def read_rows(path: Path, network: str = "stated") -> list[dict[str, Any]]:
    """Every row of a CSV in vTrain's format (ground_truth_multi.csv's twelve columns, a UTF-8 byte-order mark or
    not) as a configuration row (load_configs' shape: CONFIG_COLS, tokens_per_sec_per_gpu, n_runs 1, first_id the
    line; no intra-node bandwidth recorded). 8 GPUs per node as the source states; a run on fewer than 8 GPUs is one
    node of that many. `network`: "stated" — a row across nodes carries the network as the source states it
    (NETWORK_GB_S) as its recorded all-reduce bandwidth; "catalog" — none does (a user's runs that do not record
    their network, as these rows were before e9b82d3): the model takes the catalog's line rate (DGX A100's, twice
    vTrain's)."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        lines = [line for line in csv.reader(f) if line][1:]
    out = []
    for i, line in enumerate(lines, 1):
        try:
            billion, (gpus, gbs, mbs, h, a, layers, seq, tp, dp, pp), ms = \
                float(line[0]), map(int, line[1:11]), float(line[11])
            if len(line) != 12:
                raise ValueError(f"{len(line)} columns")
        except (ValueError, IndexError) as exc:
            raise ValueError(f"{path}, data row {i}: {line!r}: expected vTrain's twelve numeric columns "
                             f"({exc})") from exc
        params = round(billion * 1e9)
        out.append({"gpu_type": GPU, "framework": FRAMEWORK, "precision": "fp16", "model_params": params,
                    "num_layers": layers, "hidden_size": h, "num_heads": a, "num_kv_heads": a, "ffn_hidden_size": 4 * h,
                    "vocab_size": VOCAB, "gated_linear_unit": False, "flash_attention": False, "seq_len": seq,
                    "nodes": max(1, gpus // 8), "gpus_per_node": min(gpus, 8), "dp": dp, "tp": tp, "pp": pp, "cp": 1,
                    "ep": 1, "zero_stage": 0, "micro_batch_size": mbs, "grad_accum_steps": gbs // (dp * mbs),
                    "recompute": "full", "model_size_class": model_size_class(params), "n_runs": 1, "first_id": i,
                    "tokens_per_sec_per_gpu": gbs * seq / (ms / 1000 * gpus), "peak_memory_gib": None,
                    "iteration_ms": ms, "allreduce_gb_s": NETWORK_GB_S if gpus > 8 and network == "stated" else None,
                    "ar_intra_gb_s": None})
    return out


def load(network: str = "stated") -> list[dict[str, Any]]:
    """vTrain's multi-node rows (read_rows of <data>/vtrain/ground_truth_multi.csv) as configuration rows;
    repeats of one configuration keep the best, as load_configs aggregates stored runs."""
    by_cfg: dict[tuple, dict[str, Any]] = {}
    for row in read_rows(data_dir() / "vtrain" / "ground_truth_multi.csv", network):
        row = {k: v for k, v in row.items() if k != "iteration_ms"}
        key = tuple(row[c] for c in th.CONFIG_COLS)
        old = by_cfg.get(key)
        if old is None or old["tokens_per_sec_per_gpu"] < row["tokens_per_sec_per_gpu"]:
            by_cfg[key] = {**row, "n_runs": (old or {}).get("n_runs", 0) + 1}
    return list(by_cfg.values())


def predict_file(path: Path, network: str = "stated") -> dict[str, Any]:
    """Every row of `path` (vTrain's format: read_rows) predicted by the model fitted on all of vTrain's
    multi-node configurations (load): per row the measured and predicted iteration time (ms) and the error
    (predicted / measured tokens/s/GPU − 1, + = predicted too fast); the mean |error|, signed mean and median,
    overall and by GPU count and TP degree. Raises ValueError for a row the model cannot cost."""
    model = th.Model(load(network))
    rows = []
    for r in read_rows(path, network):
        pred = model.predict(r, r["framework"])["tokens_per_sec_per_gpu"]
        real = r["tokens_per_sec_per_gpu"]
        rows.append({"line": r["first_id"], "params_b": r["model_params"] / 1e9,
                     "gpus": r["nodes"] * r["gpus_per_node"], "dp": r["dp"], "tp": r["tp"], "pp": r["pp"],
                     "micro_batch_size": r["micro_batch_size"], "measured_ms": r["iteration_ms"],
                     "predicted_ms": r["iteration_ms"] * real / pred, "error": pred / real - 1})

    def stats(es: list[float]) -> dict[str, float]:
        return {"n": len(es), "mean_abs": statistics.mean(map(abs, es)), "median_abs": statistics.median(map(abs, es)),
                "mean_signed": statistics.mean(es)}

    by: dict[str, dict[str, Any]] = {}
    for name, key in (("gpus", "gpus"), ("tp", "tp")):
        vals = sorted({x[key] for x in rows})
        by[name] = {v: stats([x["error"] for x in rows if x[key] == v]) for v in vals}
    return {"path": str(path), "rows": rows, "summary": stats([x["error"] for x in rows]) if rows else {}, "by": by}


def rank_measured(train: list[dict[str, Any]], test: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The test configurations (one target: same size, GPUs, batch) ordered as the recommender
    orders candidates: the lower end of recommend.predicted_for's interval × p_fits (recommend.py)."""
    t0 = test[0]
    model = th.Model(train)
    fit = model.fit_for(t0["gpu_type"], t0["framework"])
    ctx = CompletedTarget(**{k: t0[k] for k in ("model_params", "seq_len", "nodes", "gpus_per_node", "gpu_type",
                                                "precision", "framework", *rec.DIM_FIELDS, "flash_attention")},
                          size_class=t0["model_size_class"])
    cell = on_target.Cell(model_params=t0["model_params"], family=False, nodes=t0["nodes"],
                          gpus_per_node=t0["gpus_per_node"], gpu_type=t0["gpu_type"], seq_len=t0["seq_len"])
    prep = rec.Prepared(train, ctx, model, fit, [], [], cell, on_target.Measured(runs=[]))
    anchors, by_layout = rec.anchors_for(prep), rec.layout_distances(prep)
    out = []
    for r in test:
        cfg = {f: rec._value(r, f) for f in rec.CONFIG_FIELDS}
        pred = rec.predicted_for(prep, cfg, anchors, by_layout)
        mem = estimate_memory(r)
        out.append({"row": r, "score": pred["interval"][0] * rec.p_fits(mem, None), "fits": mem.fits,
                    "pred": pred["tokens_per_sec_per_gpu"]})
    return sorted(out, key=lambda x: -x["score"])


def _err(pred: float, real: float) -> float:
    return abs(pred - real) / real


def loo_config(rows: list[dict[str, Any]]) -> list[float]:
    """|pred − real|/real of each configuration predicted by the fit on all the others."""
    out = []
    for i, r in enumerate(rows):
        model = th.Model(rows[:i] + rows[i + 1:])
        out.append(_err(model.predict(r, r["framework"])["tokens_per_sec_per_gpu"], r["tokens_per_sec_per_gpu"]))
    return out


#: bands of a configuration's tokens/s/GPU over its group's best, as bench/slow_configs.py bands the sweep's: the
#: competitive ones (≥ throughput.COMPETITIVE_FRACTION, those the fit uses) and the slower ones
BANDS = ((0.7, 1.01), (0.5, 0.7), (0.0, 0.5))


def leave_size_out(rows: list[dict[str, Any]]) -> dict[float, dict[str, Any]]:
    """Per model size left out: errors of its configurations, signed mean, and per group the
    recommender-ranked top-1 among the measured configurations."""
    out: dict[float, dict[str, Any]] = {}
    for size in sorted({r["model_size_class"] for r in rows}):
        train = [r for r in rows if r["model_size_class"] != size]
        test = [r for r in rows if r["model_size_class"] == size]
        model = th.Model(train)
        preds = [model.predict(r, r["framework"])["tokens_per_sec_per_gpu"] for r in test]
        errs = [_err(p, r["tokens_per_sec_per_gpu"]) for p, r in zip(preds, test)]
        signed = [p / r["tokens_per_sec_per_gpu"] - 1 for p, r in zip(preds, test)]
        ranked = rank_measured(train, test)
        best = max(r["tokens_per_sec_per_gpu"] for r in test)
        top = ranked[0]
        share = [r["tokens_per_sec_per_gpu"] / best for r in test]
        out[size] = {"n": len(test), "mean_err": statistics.mean(errs), "median_err": statistics.median(errs),
                     "mean_signed": statistics.mean(signed), "best_tps": best,
                     "bands": {f"{lo:g}-{hi:g}": [e for e, f in zip(signed, share) if lo <= f < hi]
                               for lo, hi in BANDS},
                     "top1": {k: top["row"][k] for k in ("dp", "tp", "pp", "micro_batch_size")},
                     "top1_tps": top["row"]["tokens_per_sec_per_gpu"],
                     "top1_regret": 1 - top["row"]["tokens_per_sec_per_gpu"] / best,
                     "not_fit": sum(1 for x in ranked if x["fits"] is False),
                     "gpus": test[0]["nodes"] * test[0]["gpus_per_node"]}
    return out


def groups_with_evidence(rows: list[dict[str, Any]]) -> dict[float, dict[str, Any]]:
    """Per (model size, GPU count) group, with the group's OTHER configurations recorded: each
    configuration scored as rank_measured scores it, by the recommender fitted and anchored on every
    other row (its own left out) — the setting of a user whose cluster has run part of the group and
    asks which layout is best. Returns, per size: the top-1 layout, its measured tokens/s/GPU, regret."""
    out: dict[float, dict[str, Any]] = {}
    for size in sorted({r["model_size_class"] for r in rows}):
        group = [r for r in rows if r["model_size_class"] == size]
        scored = [rank_measured([x for x in rows if x is not r], [r])[0] for r in group]
        top = max(scored, key=lambda x: x["score"])
        best = max(r["tokens_per_sec_per_gpu"] for r in group)
        out[size] = {"top1": {k: top["row"][k] for k in ("dp", "tp", "pp", "micro_batch_size")},
                     "top1_tps": top["row"]["tokens_per_sec_per_gpu"],
                     "top1_regret": 1 - top["row"]["tokens_per_sec_per_gpu"] / best}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--network", choices=("stated", "catalog"), default="stated",
                        help="stated: the multi-node rows record the source's 800 Gb/s per node (default); catalog: "
                             "no row records its network (the catalog's line rate)")
    parser.add_argument("--predict", type=Path, metavar="CSV",
                        help="predict every row of CSV (vTrain's format, e.g. other measured iterations) from all of "
                             "vTrain's multi-node configurations, instead of the checks above")
    args = parser.parse_args(argv)
    if args.predict:
        try:
            out = predict_file(args.predict, args.network)
        except (OSError, ValueError) as exc:
            print(f"vtrain_accuracy --predict: {exc}", file=sys.stderr)
            return 2
        return print_predicted(out, as_json=args.json)
    rows = load(args.network)
    loo = loo_config(rows)
    lso = leave_size_out(rows)
    all_lso = [e for s in lso.values() for e in [s["mean_err"]] * s["n"]]
    hits = sum(1 for s in lso.values() if s["top1_regret"] <= 0.05)
    grp = groups_with_evidence(rows)
    grp_hits = sum(1 for g in grp.values() if g["top1_regret"] <= 0.05)
    summary = {"configurations": len(rows), "loo_config_mean": statistics.mean(loo),
               "loo_config_median": statistics.median(loo), "leave_size_out_mean": statistics.mean(all_lso),
               "groups_within_5pct": hits, "groups": len(lso), "groups_with_evidence_within_5pct": grp_hits,
               "measured_called_not_fit": sum(s["not_fit"] for s in lso.values())}
    if args.json:
        print(json.dumps({"commit": benchtool.commit(), "gpu_type_assumed": GPU, "network": args.network, "sizes": lso,
                          "groups_with_evidence": grp, "summary": summary},
                         indent=2, default=str))
        return 0
    print(f"commit {benchtool.commit()}; data {data_dir() / 'vtrain' / 'ground_truth_multi.csv'}; "
          f"{len(rows)} configurations; gpu_type taken as {GPU} (the source says 'A100'); network: {args.network}\n")
    print("| size left out | GPUs | configs | mean err | median err | mean signed | measured best | "
          "top-1 (ranked) | its measured | regret | called OOM |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for size, s in lso.items():
        t = s["top1"]
        print(f"| {size:g}B | {s['gpus']} | {s['n']} | {100 * s['mean_err']:.1f}% | {100 * s['median_err']:.1f}% "
              f"| {100 * s['mean_signed']:+.1f}% | {s['best_tps']:,.1f} | dp{t['dp']} tp{t['tp']} pp{t['pp']} "
              f"mbs{t['micro_batch_size']} | {s['top1_tps']:,.1f} | {100 * s['top1_regret']:.1f}% | {s['not_fit']} |")
    print("\nleave-one-model-size-out by band of the group's best (n, mean |error|, mean signed; + = predicted too "
          "fast): " + "; ".join(f"{size:g}B " + ", ".join(
              f"{band}: {len(es)}, {100 * statistics.mean(map(abs, es)):.1f} %, {100 * statistics.mean(es):+.1f} %"
              for band, es in s["bands"].items() if es) for size, s in lso.items()))
    print(f"\nleave-one-configuration-out: mean {100 * summary['loo_config_mean']:.1f}%, "
          f"median {100 * summary['loo_config_median']:.1f}% (vTrain's simulator: 14.73 % mean)")
    print(f"leave-one-model-size-out: mean {100 * summary['leave_size_out_mean']:.1f}% (target <= 10 %)")
    print(f"ranked top-1 within 5 % of the group's measured best: {hits} of {len(lso)} (target 4 of 4)")
    print(f"the same with the group's other configurations recorded (each scored with itself left out): "
          f"{grp_hits} of {len(grp)} — " + ", ".join(
              f"{size:g}B dp{g['top1']['dp']} tp{g['top1']['tp']} pp{g['top1']['pp']} "
              f"mbs{g['top1']['micro_batch_size']} regret {100 * g['top1_regret']:.1f}%" for size, g in grp.items()))
    print(f"measured (all ran) configurations the memory model calls not fitting: {summary['measured_called_not_fit']}")
    return 0


def print_predicted(out: dict[str, Any], *, as_json: bool) -> int:
    """predict_file's answer as JSON or as a markdown table with its summary lines; 0."""
    if as_json:
        print(json.dumps({"commit": benchtool.commit(), "gpu_type_assumed": GPU, **out}, indent=2, default=str))
        return 0
    print(f"commit {benchtool.commit()}; fitted on vTrain's multi-node configurations; predicted {out['path']}; "
          f"gpu_type taken as {GPU}\n")
    print("| line | params | GPUs | dp tp pp | mbs | measured ms | predicted ms | error |")
    print("|---|---|---|---|---|---|---|---|")
    for x in out["rows"]:
        print(f"| {x['line']} | {x['params_b']:g}B | {x['gpus']} | {x['dp']} {x['tp']} {x['pp']} | "
              f"{x['micro_batch_size']} | {x['measured_ms']:,.1f} | {x['predicted_ms']:,.1f} | "
              f"{100 * x['error']:+.1f}% |")
    s = out["summary"]
    if s:
        print(f"\n{s['n']} rows: mean |error| {100 * s['mean_abs']:.1f}%, median {100 * s['median_abs']:.1f}%, "
              f"mean signed {100 * s['mean_signed']:+.1f}% (+ = predicted too fast)")
        for name, groups in out["by"].items():
            print(f"by {name}: " + "; ".join(
                f"{k}: {g['n']}, {100 * g['mean_abs']:.1f}% ({100 * g['mean_signed']:+.1f}%)"
                for k, g in groups.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
