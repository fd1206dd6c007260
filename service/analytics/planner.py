"""GPU planner: how many GPUs to train N parameters on T tokens in D days (DESIGN §4).

Compute budget (Kaplan et al. 2020 / Chinchilla's C ≈ 6·N·D training FLOPs; the SmolLM3 blog and the
Ultra-Scale Playbook size clusters this way):

    GPUs = FLOPs per token · tokens / (peak_flops_per_gpu · MFU · seconds)

with 6·N FLOPs per token for a given MFU, and the 6·N + 12·L·h·s the throughput model counts for its
predicted MFU (below). The cluster is booked in whole nodes: ceil(GPUs / gpus_per_node) nodes, and
the GPU-hours are those of every booked GPU.

With the SmolLM3 inputs (3B parameters, 11T tokens, 28 days, 720 TFLOP/s, 30 % MFU):
6·3e9·11e12 / (720e12·0.30·28·86400) = 378.9 → 379 GPUs.

- MFU: `mfu` when given; else the throughput model's prediction for the best configuration at
  the planned scale (model_mfu; service/analytics/throughput.py), planned with the FLOPs that MFU
  counts, 6N + 12·L·h·s per token [PaLM appendix B] instead of 6N — i.e. GPUs = tokens /
  (predicted tokens/s/GPU · seconds) — never a neighbour's measured
  MFU, and never a run without a known precision (those are not fitted on).
- Peak: `peak_tflops` when given; else the hardware catalog's dense peak for gpu_type
  (core/hardware.py, bf16 by default) — gpu_type defaults to the MFU run's when not given.
- Efficiency at scale: the Amdahl fit of the MFU run's size class (service/analytics/scaling.py), when
  it has one, predicts the efficiency at the planned node count relative to the node count the MFU was
  measured at; `nodes_with_scaling_loss` / `gpus_with_scaling_loss` solve for the cluster whose
  Amdahl-reduced throughput still finishes in time (None when Amdahl's limit 1/s is below the need).
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.orm import Session

from core import hardware
from core.model import model_size_class
from core.record import parse_count
from service.analytics import scaling as sc
from service.analytics.target import parse_model_params
from service.errors import BadRequest, NotFound

SECONDS_PER_DAY = 86_400.0


def parse_tokens(value: str | int | float) -> int:
    """'11T' | '1.5e12' | '500B' | 15000000000 → a token count (int): core.record.parse_count (K/M/B(G)/T/P
    suffixes are powers of 1,000). Raises BadRequest naming the value when it cannot be read or is not positive."""
    try:
        return parse_count(value, what="token count")
    except ValueError as exc:
        raise BadRequest(f"tokens: {exc}", [{"field": "tokens", "value": value, "message": str(exc)}]) from None


def model_mfu(session: Session, n_params: int, n_tokens: int, days: float, gpu_type: str | None,
              gpus_per_node: int, precision: str | None,
              shape: dict[str, Any] | None = None) -> tuple[float, dict[str, Any], str]:
    """The MFU to plan with: the throughput model's prediction for the best configuration at the
    planned scale (service/analytics/recommend.py), for the `precision` and the `shape` (framework,
    model dims, gated_linear_unit: recommend.Target's fields) given, else the records'. The node
    count and the MFU depend on each other, so this iterates from 8 nodes: MFU at n nodes → GPUs
    needed → n' nodes, until n' = n (at most 6 rounds). When no configuration can be proposed at n
    nodes (none hits the target's global batch exactly — e.g. 13 nodes and 768 sequences — or none
    fits), the MFU is predicted at the first count above n where one can, of the next 8 and the
    next power of two (_counts_above, up to 2·n); the iteration stops when the count asked for
    resolves to the count it was predicted at. Each count is looked up once. Returns (mfu,
    {"nodes", "config", "gpu_type", "precision", "global_batch_tokens", "seq_len",
    "evidence_run_ids", "model", "unpredictable": {"nodes", "reason"} | None}, source text).
    Raises BadRequest when nothing can be predicted (no recorded runs to fit or complete the target
    with)."""
    search = _NodeSearch(session, n_params, gpu_type, gpus_per_node, precision, shape)
    found = search.converge(n_tokens, days)
    if found is None:
        raise BadRequest("the throughput model cannot predict an MFU for this target (no recorded runs to fit "
                         "it on, or no configuration fits): pass mfu (e.g. 0.35)",
                         [{"field": "mfu", "value": None, "message": "required: nothing to predict from"}])
    at, answer, unpredictable = found
    top = answer["candidates"][0]
    cfg = top["config"]
    label = f"dp{cfg['dp']} tp{cfg['tp']} pp{cfg['pp']} zero{cfg['zero_stage']} mbs{cfg['micro_batch_size']}"
    pred = top["predicted"]
    # the MFU is a fraction of the peak of the precision it was predicted in (a candidate is only ever
    # costed against a catalog peak: throughput_terms.terms refuses one without)
    peak = hardware.peak_tflops(answer["target"]["gpu_type"], answer["target"]["precision"]) or 0.0
    run = {"nodes": at, "gpu_type": answer["target"]["gpu_type"], "precision": answer["target"]["precision"],
           "tokens_per_sec_per_gpu": pred["tokens_per_sec_per_gpu"],
           # the model FLOPs per token behind the predicted MFU (6N + 12·L·h·s [PaLM appendix B])
           "flops_per_token": pred["mfu"] * peak * 1e12 / pred["tokens_per_sec_per_gpu"],
           "fit_reason": answer["model"].get("reason"),
           "global_batch_tokens": answer["target"]["global_batch_tokens"], "seq_len": answer["target"]["seq_len"],
           "config": cfg,
           "evidence_run_ids": [e["run_id"] for e in top["evidence"]], "model": answer["model"],
           "unpredictable": unpredictable}
    source = (f"throughput model's prediction for {at} node{'s' if at != 1 else ''} × {gpus_per_node} "
              f"{answer['target']['gpu_type']}, best config {label} ({answer['model']['status']} on "
              f"{answer['model']['n_runs']} runs)")
    return float(top["predicted"]["mfu"]), run, source


#: (the node count an MFU is predicted at, its /recommend answer, why the count asked for could not be
#: proposed: {"nodes", "reason"}, None when it could)
_Resolved = tuple[int, dict[str, Any], dict[str, Any] | None]


class _NodeSearch:
    """model_mfu's fixed-point search over node counts: each count asked for is looked up once
    (recommend with k=1 for the planned target)."""

    def __init__(self, session: Session, n_params: int, gpu_type: str | None, gpus_per_node: int,
                 precision: str | None, shape: dict[str, Any] | None) -> None:
        self.session, self.n_params, self.gpu_type = session, n_params, gpu_type
        self.gpus_per_node, self.precision, self.shape = gpus_per_node, precision, shape
        # node count asked for → what it resolves to, or None (nothing can be proposed there nor above)
        self.memo: dict[int, _Resolved | None] = {}

    def ask(self, n: int) -> dict[str, Any]:
        """recommend's answer (k=1) at n nodes; BadRequest asking for an MFU when nothing can be predicted."""
        from service.analytics import recommend as rec

        try:
            return rec.recommend(self.session, rec.Target(model_params=self.n_params, nodes=n,
                                                          gpus_per_node=self.gpus_per_node, gpu_type=self.gpu_type,
                                                          precision=self.precision, **(self.shape or {})), k=1)
        except BadRequest as exc:
            raise BadRequest(f"no MFU to plan with: {exc.message}; pass mfu (e.g. 0.35)",
                             [{"field": "mfu", "value": None, "message": "required: nothing to predict from"}]) from exc

    @staticmethod
    def why_not(answer: dict[str, Any]) -> str:
        c = answer["counts"]
        if not c.get("layouts"):
            return (f"no layout hits the {answer['target']['global_batch_tokens']:,}-token global batch "
                    "exactly")
        return "no layout is predicted to fit in memory"

    def resolve(self, n: int) -> _Resolved | None:
        """n nodes, or the first count above it (_counts_above) where a configuration can be proposed."""
        if n not in self.memo:
            answer = self.ask(n)
            if answer["candidates"]:
                self.memo[n] = (n, answer, None)
            elif answer["target"].get("global_batch_tokens") is None:
                self.memo[n] = None  # nothing recorded to complete the target from: no other count does better
            else:
                gap = {"nodes": n, "reason": self.why_not(answer)}
                self.memo[n] = None
                for m in _counts_above(n):
                    if (above := self.ask(m))["candidates"]:
                        self.memo[n] = (m, above, gap)
                        break
        return self.memo[n]

    def converge(self, n_tokens: int, days: float) -> _Resolved | None:
        """From 8 nodes: the MFU at n nodes → the nodes it needs for `n_tokens` in `days` → ..., until
        the count asked for resolves to the count it was predicted at (at most 6 rounds)."""
        nodes, found = 8, None
        for _ in range(6):
            if (res := self.resolve(nodes)) is None:
                break
            found = res
            at, answer, _gap = res
            # GPUs from the predicted tokens/s/GPU (the MFU counts 6N + 12·L·h·s FLOPs per token, not 6N)
            tps = answer["candidates"][0]["predicted"]["tokens_per_sec_per_gpu"]
            need = max(1, math.ceil(n_tokens / (tps * days * SECONDS_PER_DAY) / self.gpus_per_node - 1e-9))
            # converged: the count it asks for is predicted at this very count (it, or the nearest above it
            # where a configuration can be proposed)
            nxt = self.resolve(need)
            if nxt is None:
                break
            if nxt[0] == at:
                found = nxt  # the same prediction, with why the count asked for could not be proposed
                break
            nodes = need
        return found


def plan(session: Session, *, model_params: str | int, tokens: str | int | float, days: float,
         gpu_type: str | None = None, mfu: float | None = None, peak_tflops: float | None = None,
         gpus_per_node: int = 8, precision: str | None = None, shape: dict[str, Any] | None = None) -> dict[str, Any]:
    """GPUs, nodes and GPU-hours to train `model_params` on `tokens` in `days` (see module docstring).

    `precision`: of the peak and of the predicted MFU (default: the MFU's, bf16); `shape`: the
    framework, model dims and gated_linear_unit the MFU is predicted for (default: the records').

    Units: peak_tflops TFLOP/s per GPU (dense), mfu a fraction in (0, 1], days wall-clock days.
    Returns {"model_params", "model_size_class", "tokens", "days", "gpu_type", "gpus_per_node", "mfu",
    "mfu_source" ("given" | "nearest run #id (size class, nodes, gpu)"), "mfu_run", "peak_tflops",
    "peak_source" ("given" | "catalog: <entry> (<source>)"), "flops_per_token", "flops_formula" (what
    it counts: "6·N" or "6·N + 12·L·h·s"), "total_flops", "gpus_exact", "gpus" (ceil: the GPUs the
    compute needs), "nodes" (ceil(gpus / gpus_per_node)), "gpus_booked" (nodes × gpus_per_node: a
    cluster is booked in whole nodes), "gpu_hours" (gpus_booked × 24 × days), "gpu_hours_compute"
    (total_flops / (peak·MFU) / 3600), "efficiency" {...} | None, "formula", "notes"}.
    Raises BadRequest for unreadable or out-of-range inputs, an unknown GPU without peak_tflops, or no
    MFU (none given and no recorded run has one).
    """
    n_params = parse_model_params(model_params)
    n_tokens = parse_tokens(tokens)
    _check_ranges(days, mfu, peak_tflops, gpus_per_node)
    size_class = model_size_class(n_params)
    notes: list[str] = []
    canonical_gpu = hardware.canonical_gpu_type(gpu_type) if gpu_type else None
    if gpu_type and canonical_gpu is None and peak_tflops is None:
        raise BadRequest(f"gpu_type '{gpu_type}' is not in the hardware catalog: pass peak_tflops, or one of "
                         f"{', '.join(a.name for a in hardware.CATALOG)}",
                         [{"field": "gpu_type", "value": gpu_type, "message": "unknown GPU type"}])

    mfu_run = None
    if mfu is not None:
        mfu_source = "given"
    else:
        mfu, mfu_run, mfu_source = model_mfu(session, n_params, n_tokens, days, canonical_gpu or gpu_type,
                                             gpus_per_node, precision, shape)
        if gpu_type is None and mfu_run.get("gpu_type"):
            canonical_gpu = hardware.canonical_gpu_type(mfu_run["gpu_type"])
            notes.append(f"gpu_type not given: using {mfu_run['gpu_type']}, the records' nearest")
        predicted_in = mfu_run.get("precision")
        if precision is None:
            precision = predicted_in
        elif predicted_in and predicted_in != hardware.canonical_precision(precision) and peak_tflops is None:
            # an MFU predicted in bf16 times the fp8 peak would plan half the GPUs: one precision for both
            notes.append(f"the MFU is predicted in {predicted_in}, so the peak is {predicted_in}'s too (asked: "
                         f"{precision}); pass mfu to plan in {precision}")
            precision = predicted_in

    precision = precision or "bf16"
    peak_tflops, peak_source = _peak(canonical_gpu, gpu_type, precision, peak_tflops)

    seconds = days * SECONDS_PER_DAY
    # the FLOPs the MFU is a fraction of: 6·N per token for a given MFU (Kaplan et al. 2020, C ≈ 6·N·D);
    # the model FLOPs its prediction counts, 6N + 12·L·h·s per token, for a predicted one — so that the
    # GPUs are those that deliver the predicted tokens/s/GPU
    predicted_fpt = bool(mfu_run and mfu_run.get("flops_per_token"))
    fpt = mfu_run["flops_per_token"] if predicted_fpt and mfu_run else 6.0 * n_params
    total_flops = fpt * n_tokens
    gpus_exact = total_flops / (peak_tflops * 1e12 * mfu * seconds)
    gpus = max(1, math.ceil(gpus_exact - 1e-9))
    nodes = math.ceil(gpus / gpus_per_node)
    result = {
        "model_params": n_params, "model_size_class": size_class, "tokens": n_tokens, "days": days,
        "gpu_type": canonical_gpu or gpu_type, "gpus_per_node": gpus_per_node,
        "mfu": mfu, "mfu_source": mfu_source, "mfu_run": mfu_run,
        "peak_tflops": peak_tflops, "peak_source": peak_source,
        "flops_per_token": fpt, "flops_formula": "6·N + 12·L·h·s" if predicted_fpt else "6·N",
        "total_flops": total_flops, "gpus_exact": gpus_exact, "gpus": gpus, "nodes": nodes,
        "gpus_booked": nodes * gpus_per_node, "gpu_hours": nodes * gpus_per_node * 24.0 * days,
        "gpu_hours_compute": total_flops / (peak_tflops * 1e12 * mfu) / 3600.0,
        "formula": ("GPUs = 6·N·tokens / (peak · MFU · time)" if not predicted_fpt else
                    "GPUs = (6·N + 12·L·h·s)·tokens / (peak · MFU · time) = tokens / (predicted tokens/s/GPU · time)"),
        "efficiency": None, "notes": notes,
    }
    if mfu_run is None:
        assert size_class is not None  # parse_model_params returns a positive parameter count
        result["efficiency"] = _efficiency(session, None, size_class, canonical_gpu, nodes, gpus_exact,
                                           gpus_per_node, notes)
    else:
        notes.append(_scale_note(mfu_run, nodes))
        if mfu_run.get("fit_reason"):
            notes.append(f"throughput model: {mfu_run['fit_reason']}")
    return result


def _check_ranges(days: float, mfu: float | None, peak_tflops: float | None, gpus_per_node: int) -> None:
    """BadRequest naming the first of plan's numeric inputs out of its range."""
    if not (isinstance(days, (int, float)) and math.isfinite(days) and days > 0):
        raise BadRequest("days must be > 0", [{"field": "days", "value": days, "message": "must be > 0"}])
    if mfu is not None and not (0 < mfu <= 1):
        raise BadRequest("mfu is a fraction in (0, 1] (30 % → 0.30)",
                         [{"field": "mfu", "value": mfu, "message": "must be in (0, 1]"}])
    if peak_tflops is not None and not (math.isfinite(peak_tflops) and peak_tflops > 0):
        raise BadRequest("peak_tflops must be > 0", [{"field": "peak_tflops", "value": peak_tflops,
                                                      "message": "must be > 0"}])
    if gpus_per_node < 1:
        raise BadRequest("gpus_per_node must be >= 1", [{"field": "gpus_per_node", "value": gpus_per_node,
                                                         "message": "must be >= 1"}])


def _peak(canonical_gpu: str | None, gpu_type: str | None, precision: str,
          peak_tflops: float | None) -> tuple[float, str]:
    """(dense peak TFLOP/s per GPU, where from): the one given, else the catalog's for the GPU at
    `precision`. BadRequest when the catalog has neither the GPU nor its peak at that precision."""
    if peak_tflops is not None:
        return peak_tflops, "given"
    acc = hardware.lookup(canonical_gpu)
    if acc is None:
        raise BadRequest("pass gpu_type (a catalog entry) or peak_tflops to know the peak FLOP/s",
                         [{"field": "gpu_type", "value": gpu_type, "message": "needed for the peak"}])
    peak = hardware.peak_tflops(acc.name, precision)
    if peak is None:
        raise BadRequest(f"the catalog has no {precision} peak for {acc.name}: pass another precision or "
                         "peak_tflops", [{"field": "precision", "value": precision,
                                          "message": f"no {acc.name} peak at this precision"}])
    return peak, f"catalog: {acc.name} {hardware.canonical_precision(precision)} dense ({acc.source})"


def _counts_above(nodes: int, tries: int = 8) -> list[int]:
    """The node counts tried above `nodes` when no configuration can be proposed there: the next
    `tries` counts and the next power of two (which the usual power-of-two batches divide), up to 2·nodes."""
    pow2 = 1 << nodes.bit_length()
    return sorted({*range(nodes + 1, min(2 * nodes, nodes + tries) + 1), min(pow2, 2 * nodes)})


def _scale_note(mfu_run: dict[str, Any], nodes: int) -> str:
    """What the planned node count's MFU rests on, in short sentences: a prediction at that very
    scale, above it (safe side), or below it (the larger scale's communication not in it); then the
    batch it was predicted for."""
    at, gap = mfu_run["nodes"], mfu_run.get("unpredictable")
    batch = (f" Batch: {mfu_run['global_batch_tokens']:,} tokens per step in {mfu_run['seq_len']:,}-token "
             "sequences (the nearest recorded configuration's global batch: a plan takes none).")
    if at == nodes:
        return f"MFU predicted at the planned {nodes} nodes, with the communication cost of that scale.{batch}"
    why = f" ({gap['nodes']} nodes: {gap['reason']})" if gap else ""
    if at > nodes:
        return (f"MFU predicted at {at} nodes, the nearest scale above the planned {nodes} where a layout can be "
                f"proposed{why}. On the safe side: the DP all-reduce costs a little less at {nodes} nodes.{batch}")
    return (f"MFU predicted at {at} nodes, not at the planned {nodes}{why}. The communication cost of {nodes} "
            f"nodes is not in it: the plan may need more GPUs than it says.{batch}")


def _efficiency(session: Session, mfu_run: dict | None, size_class: float, gpu: str | None, nodes: int,
                gpus_exact: float, gpus_per_node: int, notes: list[str]) -> dict[str, Any] | None:
    """Amdahl-predicted efficiency at `nodes` from the scaling fit of the nearest measured size class."""
    fit_class = mfu_run["model_size_class"] if mfu_run else size_class
    fit_gpu = (mfu_run or {}).get("gpu_type") or gpu
    try:
        curve = sc.scaling(session, fit_class, gpu_type=fit_gpu)
    except NotFound:
        curve = None
    fit = (curve or {}).get("amdahl")
    if not fit:
        notes.append(f"no scaling fit for {fit_class:g}B{' on ' + fit_gpu if fit_gpu else ''} (needs successful "
                     "runs at two or more node counts): efficiency loss at this scale not estimated")
        return None
    assert curve is not None  # fit came from it
    eff_target = sc.predicted_efficiency(fit, nodes)
    ref_nodes = (mfu_run or {}).get("nodes") or fit["base_nodes"]
    eff_ref = sc.predicted_efficiency(fit, ref_nodes)
    # scaling()'s Amdahl fit always carries a serial_fraction, so both efficiencies are numbers
    assert eff_target is not None and eff_ref is not None
    measured_max = max(p["nodes"] for p in curve["points"])
    if nodes > 4 * measured_max:
        notes.append(f"{nodes} nodes is far beyond the measured {measured_max}: the efficiency is an Amdahl "
                     "extrapolation")
    needed = _nodes_with_loss(gpus_exact, gpus_per_node, eff_ref, fit["serial_fraction"], fit["base_nodes"])
    if needed is None:
        notes.append("with the fitted serial fraction no node count reaches this throughput: more GPUs stop "
                     "paying before that (raise the MFU, cut the communication, or allow more days)")
    return {
        "source": f"Amdahl fit of {fit_class:g}B{' on ' + fit_gpu if fit_gpu else ''} "
                  f"({fit['n_points']} node counts, base {fit['base_nodes']})",
        "serial_fraction": fit["serial_fraction"], "serial_fraction_stderr": fit["serial_fraction_stderr"],
        "predicted_efficiency": eff_target, "reference_nodes": ref_nodes,
        "relative_to_reference": eff_target / eff_ref,
        "nodes_with_scaling_loss": math.ceil(needed - 1e-9) if needed else None,
        "gpus_with_scaling_loss": math.ceil(needed * gpus_per_node - 1e-9) if needed else None,
    }


def _nodes_with_loss(gpus_exact: float, gpus_per_node: int, eff_ref: float, s: float, base: float) -> float | None:
    """Nodes n (continuous) whose Amdahl throughput matches `gpus_exact` GPUs at the reference efficiency.

    Throughput ∝ GPUs × efficiency, so n·gpn·eff(n)/eff_ref = gpus_exact, with eff(n) = 1/(s·n/b + 1 − s):
    n = A(1 − s) / (1 − A·s/b), A = gpus_exact·eff_ref/gpn; None when A·s/b ≥ 1 (beyond Amdahl's limit).
    """
    a = gpus_exact * eff_ref / gpus_per_node
    if a * s / base >= 1.0:
        return None
    return a * (1.0 - s) / (1.0 - a * s / base)
