"""Predict: what one configuration a user names will do on its target (DESIGN §4, "Predict").

"I plan DP8 TP4 PP2 MBS2 on 8 nodes — what will it do, will it fit?" The configuration is costed
by the same models and the same steps as a /recommend candidate, for this one configuration,
slow or fast:

1. The configuration is checked as a run record is (service/derive.py: tp·pp·cp·dp = world size,
   EP carved out of DP·CP·TP; a degree left out is 1, DP the world size over the others), then
   against its model (heads divisible by TP, at least one layer per pipeline stage, seq_len
   divisible by CP) and its batch (a whole number of micro-batches per step: GAS given, or the
   global batch over DP·MBS·seq). An impossible configuration is a 422 naming the field.
2. The target is completed as /recommend completes it (service/analytics/recommend.prepare: GPU
   type, seq_len, the recorded model's dims when none are given, framework, precision — each said
   in `notes`); the global batch is the configuration's.
3. The prediction is recommend's for a candidate (recommend.scored with this one configuration:
   the throughput model, service/analytics/throughput.Model.predict, anchored on the residuals of
   the recorded runs of the same layout, service/analytics/anchor.py), the memory model's peak and
   verdict (service/analytics/memory.estimate_memory; what the records say: service/analytics/fits.py —
   a recorded OOM that implies it does not fit, a recorded run that shows it fits, the probability
   that it fits), the evidence it rests on (recommend's), and the
   measurement when this very configuration ran on the target (recommend's exact match, in the
   same framework and precision when one ran so).
4. `model` says which fit answered (GPU type, framework, fitted on how many runs, held-out error)
   and whether the prediction extrapolates, and from what: a prior or a fit carried from another
   GPU type, a node count, model size or sequence length outside the fitted runs', a layout with
   no recorded run, or none within anchor.SUPPORT_DISTANCE of the target.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from core import hardware
from core.layout import layout_breaches
from core.model import params_from_dims, resolve_shape
from service.analytics import fits as fits_
from service.analytics import recommend as rec
from service.analytics.memory import estimate_memory
from service.analytics.on_target import CONFIG_FIELDS, DIM_FIELDS, config_value, names_family
from service.analytics.target import CompletedTarget, parse_model_params
from service.derive import complete
from service.errors import ValidationFailed

#: configuration fields a request may leave out, and what they are then taken as (said in the notes)
DEFAULTS = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero_stage": 0, "micro_batch_size": 1, "recompute": "none"}


#: defaulted fields under which a recorded run of the same layout is pointed out (they change memory
#: and a little throughput, not the layout a user means when leaving them out)
_FREE_WHEN_UNSAID = ("zero_stage", "recompute")


def _ran_with_other_defaults(cfg: dict[str, Any], ctx: CompletedTarget, rows: list[dict[str, Any]],
                             body: dict[str, Any]) -> list[str]:
    """When the question left out the ZeRO stage or the recompute (taken as DEFAULTS) and this layout
    ran on the target with another value, a note naming the best such run: "DP8 TP4 PP2 … not run
    with ZeRO-0" should not read as "nobody ran this layout" when run #1268 ran it with ZeRO-1."""
    free = [f for f in _FREE_WHEN_UNSAID if body.get(f) is None]
    if not free:
        return []
    fixed = [f for f in CONFIG_FIELDS if f not in free]
    hits = [r for r in rows
            if r["model_size_class"] == ctx.size_class and r["nodes"] == ctx.nodes and r["gpu_type"] == ctx.gpu_type
            and r["seq_len"] == ctx.seq_len and r["gpus_per_node"] in (None, ctx.gpus_per_node)
            and all(config_value(r, f) == cfg[f] for f in fixed)
            and any(config_value(r, f) != cfg[f] for f in free)]
    if not hits:
        return []
    best = max(hits, key=lambda r: (r["tokens_per_sec_per_gpu"] or 0.0, -r["first_id"]))
    other = ", ".join(f"{f}={config_value(best, f)}" for f in free if config_value(best, f) != cfg[f])
    return [f"this layout ran on the target with {other} (not given here, so taken as "
            f"{', '.join(f'{f}={cfg[f]}' for f in free)}): run #{best['first_id']}, "
            f"{best['tokens_per_sec_per_gpu']:,.0f} tokens/s per GPU ({best['framework']}, {best['precision']}); "
            f"pass {', '.join(f'{f}={config_value(best, f)}' for f in free)} to see it as measured"]


def _fail(field: str, value: Any, message: str) -> ValidationFailed:
    text = f"{field}: {message}"
    return ValidationFailed(text, [{"field": field, "value": value, "message": text}])


def _check_record(body: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The configuration as a run record: degrees completed and checked as service/derive.complete
    checks a stored run (422 naming the field otherwise)."""
    rec_ = {k: v for k, v in body.items() if v is not None}
    for f, default in DEFAULTS.items():
        if f not in rec_:
            rec_[f] = default
            if f not in ("cp", "ep"):
                notes.append(f"{f}={default} (not given)")
    gpu = rec_.get("gpu_type")
    if gpu is not None and hardware.lookup(gpu) is None:
        raise _fail("gpu_type", gpu, "not in the hardware catalog (core/hardware.py): e.g. H100, A100-80GB, MI300X")
    precision = rec_.get("precision")
    if precision is not None:
        canonical = hardware.canonical_precision(precision)
        if canonical is None or (gpu is not None and not hardware.peak_tflops(gpu, canonical)):
            raise _fail("precision", precision, f"the hardware catalog has no peak FLOP/s for {gpu} at this precision")
    row, errors = complete({**{k: v for k, v in rec_.items() if k != "model_params_text"}, "status": "success"})
    if errors:
        details = [e.as_dict() for e in errors]
        raise ValidationFailed(details[0]["message"], details)
    if "dp" not in body or body.get("dp") is None:
        notes.append(f"dp={row['dp']}: the world size {row['world_size']} over tp·pp·cp")
    return row


def _check_model(cfg: dict[str, Any], ctx: CompletedTarget) -> list[str]:
    """The layout rule (core.layout.layout_breaches: heads and KV heads over TP, PP ≤ layers, seq_len
    over CP) for the dims the prediction is costed on. Dims given or recorded constrain:
    ValidationFailed naming the field. Dims inferred from model_params do not (recommend's layouts
    are not constrained by them either: a guess does not rule a layout out): the breach is returned
    as a note that asks for the model's own dims."""
    inferred: list[str] = []
    model = resolve_shape(ctx.shape_record(), inferred)
    said = " ".join(inferred)
    notes: list[str] = []
    for b in layout_breaches(tp=cfg["tp"], pp=cfg["pp"], cp=cfg["cp"], num_heads=model.heads,
                             num_kv_heads=model.kv, num_layers=model.layers, seq_len=ctx.seq_len):
        if f"{b.dim}=" in said:
            notes.append(f"{b.dim} {b.dim_value} (inferred from model_params) does not allow {b.field} "
                         f"{cfg[b.field]}: {b.why}; pass your model's dims to check it")
        else:
            raise _fail(b.field, cfg[b.field], f"{b.dim} {b.dim_value} {b.why}")
    return notes


def _batch(row: dict[str, Any], seq: int, body: dict[str, Any], notes: list[str]) -> int:
    """GAS: the one given (checked against a global batch given too), else the global batch over
    DP·MBS·seq, which must be whole and ≥ 1 (422 naming the field otherwise)."""
    per_step = row["dp"] * row["micro_batch_size"] * seq
    gas, gbt = body.get("grad_accum_steps"), body.get("global_batch_tokens")
    if gas is not None:
        if gbt is not None and gbt != gas * per_step:
            raise _fail("global_batch_tokens", gbt, f"dp·micro_batch_size·grad_accum_steps·seq_len = "
                                                    f"{row['dp']}·{row['micro_batch_size']}·{gas}·{seq} = "
                                                    f"{gas * per_step} != {gbt}")
        return int(gas)
    if gbt is None:
        raise _fail("grad_accum_steps", None, "give grad_accum_steps or global_batch_tokens (the batch sets the "
                                              "pipeline bubble and the gradient sync per token)")
    if gbt % per_step or gbt < per_step:
        raise _fail("global_batch_tokens", gbt, f"not a whole number ≥ 1 of dp·micro_batch_size·seq_len = "
                                                f"{row['dp']}·{row['micro_batch_size']}·{seq} = {per_step} tokens")
    notes.append(f"grad_accum_steps={gbt // per_step}: global_batch_tokens over dp·micro_batch_size·seq_len")
    return int(gbt // per_step)


def _model_params(body: dict[str, Any], size_text: str | None, notes: list[str]) -> int:
    """The parameter count to predict for: model_params, else the size text (stored back into
    `body`), else the count from the dims (said in `notes`); ValidationFailed when none is given."""
    params = body.get("model_params")
    if params is None and size_text is not None:
        params = body["model_params"] = parse_model_params(size_text)
    if params is None:
        params = params_from_dims(body)
        if params is None:
            raise _fail("model_params", None, "give model_params or the dims (num_layers, hidden_size, num_heads, "
                                              "vocab_size ...)")
        notes.append(f"model_params {params:,} from the dims given")
    return params


def _record_notes(ctx: CompletedTarget, mem: Any, exact: dict[str, Any] | None,
                  oom: dict[str, Any] | None) -> list[str]:
    """What the records say beside the models: the configuration ran on the target although the
    memory model says it does not fit (the record wins), a recorded OOM implies it does not fit, or
    it was measured in another framework or precision."""
    notes = []
    if exact is not None and mem.fits is False:
        notes.append(f"the memory model predicts {mem.predicted_peak_memory_gib:.1f} GiB, more than the "
                     f"{mem.usable_memory_gib:.1f} GiB usable, yet this configuration ran on the target (run "
                     f"#{exact['first_id']}): the models disagree with the record, and the record wins")
    if oom is not None:
        notes.append(f"a recorded OOM (run #{oom['run_id']}: same TP/PP/CP, no more sharding, no smaller "
                     "micro-batch, no stronger recompute) implies it does not fit")
    if exact is not None and (exact["framework"], exact["precision"]) != (ctx.framework, ctx.precision):
        notes.append(f"measured in {exact['framework']} / {exact['precision']}, predicted for {ctx.framework} / "
                     f"{ctx.precision}")
    return notes


def predict(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    """Prediction for one configuration (module docstring).

    `body`: run-record fields — model_params (int, or a size text "8B" in `model_params_text`) or
    the dims (num_layers, hidden_size, num_heads, num_kv_heads, ffn_hidden_size, vocab_size,
    gated_linear_unit), seq_len, gpu_type, gpus_per_node, nodes, dp, tp, pp, cp, ep, zero_stage,
    micro_batch_size, grad_accum_steps or global_batch_tokens, recompute, precision, framework.
    Returns {"target": the completed target, "config": {CONFIG_FIELDS}, "global_batch_tokens",
    "predicted": {tokens_per_sec_per_gpu, mfu, step_time_s, peak_memory_gib, interval,
    breakdown_s (s: compute, pipeline_bubble, tp_comm, dp_comm, other — the model's terms times the
    evidence's correction, so that they add up to step_time_s), bandwidth_source,
    model_tokens_per_sec_per_gpu (the model before the correction), anchor_factor}, "fits": bool |
    None (a recorded run on the target: True; a recorded OOM implying it: False; else the memory
    model's), "memory": {fits,
    predicted_peak_memory_gib, gpu_memory_gib, usable_memory_gib, p_fits, recorded_oom_run_id,
    breakdown_gib, peak_stage}, "measured": {tokens_per_sec_per_gpu, run_id, n_runs,
    peak_memory_gib, framework, precision} | None, "evidence": [...], "model": the fit's
    description with `extrapolates` and `extrapolation` (reasons), "why", "notes"}.
    Raises ValidationFailed (422) naming the field for an impossible configuration, BadRequest
    (400) for a target that cannot be completed."""
    notes: list[str] = []
    size_text = body.pop("model_params_text", None)
    dims = {f: body.get(f) for f in DIM_FIELDS}
    params = _model_params(body, size_text, notes)
    row = _check_record(body, notes)
    target = rec.Target(model_params=int(params), nodes=row["nodes"], gpus_per_node=row["gpus_per_node"],
                        gpu_type=body.get("gpu_type"), seq_len=body.get("seq_len"), **dims,
                        gated_linear_unit=body.get("gated_linear_unit"), framework=body.get("framework"),
                        precision=body.get("precision"),
                        family=size_text is not None and names_family(size_text) and not any(dims.values()))
    prep = rec.prepare(session, target, need_batch=False, measured_limit=1)
    ctx = prep.ctx
    cfg = {f: row.get(f) for f in CONFIG_FIELDS}
    notes += _check_model(cfg, ctx)
    cfg["grad_accum_steps"] = _batch(row, ctx.seq_len, body, notes)
    ctx.global_batch_tokens = row["dp"] * row["micro_batch_size"] * cfg["grad_accum_steps"] * ctx.seq_len
    items = rec.scored(prep, configs=[cfg])
    if not items:  # the model cannot cost it: say why
        try:
            prep.model.predict(rec._run_record(cfg, ctx), ctx.framework)
        except ValueError as exc:
            msg = str(exc)
            field = msg.split(":", 1)[0] if ":" in msg else "gpu_type"
            raise _fail(field, ctx.field_value(field), msg.split(":", 1)[-1].strip()) from exc
    item = items[0]
    same = [r for r in prep.rows if r["framework"] == ctx.framework and r["precision"] == ctx.precision]
    exact = rec._exact(cfg, ctx, same) or rec._exact(cfg, ctx, prep.rows)
    mem = estimate_memory(rec._run_record(cfg, ctx))
    oom = fits_.oom_implied(cfg, ctx, prep.ooms) if exact is None else None
    shown = fits_.fit_shown(cfg, ctx, prep.rows) if exact is None and oom is None and mem.fits is False else None
    answer = rec.candidate(cfg, ctx, item.predicted, mem, exact, prep.rows,
                           extrapolates=rec.extrapolation(prep, item), shown=shown)
    fits = True if exact is not None or shown is not None else False if oom is not None else mem.fits
    answer["memory"].update(usable_memory_gib=mem.usable_memory_gib, peak_stage=mem.peak_stage,
                            breakdown_gib=mem.breakdown,
                            recorded_oom_run_id=oom["run_id"] if oom is not None else None)
    notes += _record_notes(ctx, mem, exact, oom)
    if exact is None:
        notes += _ran_with_other_defaults(cfg, ctx, prep.rows, body)
    why = answer["extrapolation"]
    model = {**prep.fit.describe(), "extrapolates": bool(why), "extrapolation": why}
    # the model's step-time terms carried to the anchored step time (the evidence's correction scales
    # the whole step: recommend.anchored), so that the breakdown adds up to the predicted step time
    factor = float(item.predicted.get("anchor", {}).get("factor") or 1.0)
    terms = answer["predicted"]["breakdown_s"]
    predicted = {**answer["predicted"], "breakdown_s": {k: v / factor for k, v in terms.items()},
                 "model_tokens_per_sec_per_gpu": item.predicted.get("model_tokens_per_sec_per_gpu",
                                                                    item.predicted["tokens_per_sec_per_gpu"]),
                 "anchor_factor": factor}
    return {"target": rec.target_body(prep), "config": cfg, "global_batch_tokens": ctx.global_batch_tokens,
            "predicted": predicted, "fits": fits, "memory": answer["memory"],
            "measured": answer["measured"], "evidence": answer["evidence"], "model": model, "why": answer["why"],
            "notes": prep.notes + notes}

