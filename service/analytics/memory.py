"""Per-GPU peak memory model: does a parallel training configuration fit on its GPUs?

Units: bytes inside, GiB (2**30 bytes) in every public number. Sources (cited again at each formula):

- [UP]   Ultra-Scale Playbook, "Memory usage in Transformers" and "ZeRO" sections
         (https://huggingface.co/spaces/nanotron/ultrascale-playbook): mixed precision keeps bf16
         params 2Ψ, bf16 grads 2Ψ, fp32 master weights 4Ψ, Adam moments 8Ψ (+4Ψ fp32 grad buffer).
- [ZeRO] Rajbhandari et al. 2019, arXiv 1910.02054, §5: stage 1 shards optimizer states (with the
         fp32 master copy) over DP, stage 2 also gradients, stage 3 also parameters.
- [K22]  Korthikanti et al. 2022, arXiv 2205.05198, §4: activations per layer s·b·h·(34 + 5·a·s/h)
         bytes; with tensor + sequence parallelism all of it is divided by t; selective recompute
         drops the 5·a·s/h attention-core term; full recompute keeps only the 2·s·b·h layer input.
         FlashAttention (Dao et al. 2022, arXiv 2205.14135) never materialises the s×s scores, so
         the 5·a·s/h term is absent without any recompute.
- [NT]   nanotron source (huggingface/nanotron): FP32GradientAccumulator (optim/gradient_accumulator.py:
         full fp32 grad buffer even under ZeRO-1, fp32 master weights sharded by ZeRO),
         _ShardedCrossEntropy (parallel/tensor_parallel/functional.py), build_model's cost-balanced
         pipeline split (models/base.py), OneForwardOneBackwardPipelineEngine, and trainer.py's
         log_memory(), which calls torch.cuda.reset_peak_memory_stats() after the forward/backward
         pass: the bench CSV's "Mem Alloc (GB)" is therefore the peak of the *post-backward* phase
         (grad sync + optimizer step), not the step peak. `optimizer_step_gib` predicts that figure.
- [1F1B] Narayanan et al. 2021, arXiv 2104.04473, §2.2: with 1F1B, stage r of p keeps at most p−r
         micro-batches of activations in flight (the first stage p).

Calibration and hold-out checks: bench/memory_accuracy.py on the Ultra-Scale Playbook sweep sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.frameworks import is_nanotron
from core.hardware import canonical_precision, lookup
from core.model import ModelShape, resolve_shape, stage_split
from core.model import assume as _default
from core.record import flag_field as _flag
from core.record import get_field as _get
from core.record import positive_int_field as _pos_int

GIB = 2**30


@dataclass(frozen=True)
class MemoryConstants:
    """The model's few physical constants (GiB unless stated). bench/memory_accuracy.py refits
    `fragmentation` on subsets of the sweep to show it transfers (hold-out by node count).

    cuda_context_nccl_gib: memory the PyTorch allocator never sees: CUDA context and kernels
        (~0.5 GiB on H100), cuBLAS workspaces, NCCL buffers (communicators × channels × 4 MiB).
    framework_misc_gib: small tensors besides the model (rotary tables, batch, losses): the
        residual of the sweep's post-backward memory (bench/RESULTS.md, as above).
    fragmentation: reserved/allocated factor of memory allocated and freed within a step
        (activations, logits, transient buffers; persistent model states are allocated once and
        do not fragment), so that the prediction is a reserved-memory figure. Measured on the
        sweep, not fitted to OOM labels (bench/RESULTS.md, "Measurements behind the memory model").
    usable_fraction: of the catalog memory (GiB-as-marketed): an "80 GB" H100 has 79.6 GiB and
        the driver keeps some; 0.98 leaves ~78.4 GiB.
    logits_bytes_per_vocab: bytes per token per (vocab/TP) entry at the loss peak — nanotron
        casts the bf16 logits to an fp32 copy and _ShardedCrossEntropy subtracts the max into a
        second fp32 tensor (exp/softmax then in place): 4 + 4 = 8.
    """

    cuda_context_nccl_gib: float = 2.0
    framework_misc_gib: float = 0.07
    fragmentation: float = 1.44
    usable_fraction: float = 0.98
    logits_bytes_per_vocab: float = 8.0


DEFAULT_CONSTANTS = MemoryConstants()
_BF16 = 2
_FP32 = 4


@dataclass
class MemoryEstimate:
    """Predicted per-GPU peak memory of one training step (GiB = 2**30 bytes).

    predicted_peak_memory_gib: peak over pipeline stages and step phases, CUDA context/NCCL and
    allocator fragmentation included (comparable with total HBM); breakdown sums to it; fits:
    predicted ≤ usable_memory_gib (gpu_memory_gib × usable_fraction), None if memory unknown.
    optimizer_step_gib: allocated memory of the first stage (rank 0) after backward — what
    nanotron's bench CSV logs as "Mem Alloc (GB)" [NT]; peak_stage is "only"/"first"/"last"/"stage k".
    """

    predicted_peak_memory_gib: float
    gpu_memory_gib: float | None
    fits: bool | None
    breakdown: dict[str, float]
    assumptions: list[str]
    usable_memory_gib: float | None = None
    peak_stage: str = "only"
    peak_phase: str = "forward_backward"
    stage_peaks_gib: dict[str, float] = field(default_factory=dict)
    stage_breakdowns: dict[str, dict[str, float]] = field(default_factory=dict)
    optimizer_step_gib: float = 0.0


#: breakdown keys, in display order
COMPONENTS = ("params", "grads", "fp32_grad_accum", "master_weights", "optimizer_states",
              "activations", "logits_loss", "communication_buffers", "framework_overhead",
              "allocator_fragmentation", "cuda_context_nccl")


def _activation_bytes_per_token(model: ModelShape, seq: int, tp: int, sp: bool, recompute: str,
                                flash: bool, op_sac: bool = False) -> tuple[float, float]:
    """(bytes kept per token per layer, bytes of one layer's full activations per token), one GPU.

    [K22] §4.1 derivation applied to a Llama block (RMSNorm, GQA, SwiGLU, no dropout), bf16:
      replicated across TP unless sequence parallel: 2 norm inputs + 2 column-linear inputs = 8h;
      TP-sharded: q,k,v 2(q_dim + 2·kv_dim), attention output 2·q_dim, SwiGLU gate/up output 4·ffn,
      silu(gate) 2·ffn, product 2·ffn (down-proj input) — a plain GELU MLP (gated_linear_unit
      False) keeps its up-proj output 2·ffn and gelu output 2·ffn (down-proj input); without
      FlashAttention + 5·a·s (K22's 5as/h term × h). For GPT's 4h-GeLU block (ffn = 4h) this gives
      8h + 8h + 16h = 32h, K22's 34h less its two 1-byte dropout masks.
    selective: also recompute the attention core and the MLP's elementwise outputs (−4·ffn gated,
      −2·ffn plain);
    op_sac (torchtitan's selective_ac_option="op"): keep the layer input, the attention output
    and every other matmul output (wq, wv, w1, w2 of the 7); full: keep only the layer input 2h
    (K22 "full recompute"), recompute one layer at a time.
    """
    h, qd, kvd, f = model.h, model.heads * model.head_dim, model.kv * model.head_dim, model.ffn
    replicated = 8 * h
    mlp, mlp_recomputed = (8 * f, 4 * f) if model.gated else (4 * f, 2 * f)
    sharded = 2 * (qd + 2 * kvd) + 2 * qd + mlp
    core = 0 if flash else 5 * model.heads * seq
    full_layer = (replicated / tp if sp else replicated) + (sharded + core) / tp
    if recompute == "full":
        kept = 2 * h / tp if sp else 2 * h
    elif recompute == "selective" and op_sac:
        layer_input = 2 * h / tp if sp else 2 * h
        kept = layer_input + (2 * qd + 2 * kvd + 2 * f + 2 * h + 2 * qd) / tp  # wq wv w1 w2 + attn out
    elif recompute == "selective":
        kept = (replicated / tp if sp else replicated) + (sharded - mlp_recomputed) / tp
    else:
        kept = full_layer
    return kept, full_layer


@dataclass(frozen=True)
class _Step:
    """One request's validated inputs (_read_step): the model's shape, seq (tokens), the degrees,
    the ZeRO stage, micro-batch, GAS, recompute mode, canonical precision, framework (lower case)
    and what it implies (nanotron's buffers), fp32 gradient accumulation, sequence parallelism,
    FlashAttention, and the all-forward-all-backward pipeline engine."""

    model: ModelShape
    seq: int
    dp: int
    tp: int
    pp: int
    cp: int
    zero: int
    mbs: int
    gas: int
    recompute: str
    precision: str | None
    framework: str
    nanotron: bool
    fp32_accum: bool
    sp: bool
    flash: bool
    afab: bool


def _read_step(run: dict, notes: list[str]) -> _Step:
    """The inputs estimate_memory reads off `run`, each default it takes said in `notes`. Raises
    ValueError naming the field when a value is missing or out of range."""
    model = resolve_shape(run, notes)
    seq = _pos_int(run, "seq_len")
    if seq is None:
        raise ValueError("seq_len: required to size activations")
    # a degree the request leaves out is the unsharded case, 1 (the /memory API's documented
    # default), and said so in notes; this is a prediction for a request, never applied to a stored run
    dp, tp, pp, cp, ep = (_pos_int(run, k) or 1 for k in ("dp", "tp", "pp", "cp", "ep"))
    notes += [f"{k}=1 (not given)" for k in ("dp", "tp", "pp", "cp") if _get(run, k) is None]
    if ep > 1:
        notes.append("ep ignored: dense model assumed (MoE experts not modelled)")
    zero = _get(run, "zero_stage")
    try:
        zero = 0 if zero in (None, "") else int(float(zero))
    except (TypeError, ValueError):
        raise ValueError(f"zero_stage: not a number: {zero!r}") from None
    if not 0 <= zero <= 3:
        raise ValueError(f"zero_stage: must be 0-3, got {zero}")
    mbs = _default(_pos_int(run, "micro_batch_size"), 1, notes, "micro_batch_size=1")
    gas = _default(_pos_int(run, "grad_accum_steps"), pp, notes, "grad_accum_steps>=pp (pipeline filled)")
    recompute = _get(run, "recompute") or ("full" if _flag(run, "recompute_layer") else None)
    recompute = str(_default(recompute, "none", notes, "recompute=none")).strip().lower()
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute: must be none/selective/full, got {recompute!r}")
    precision = canonical_precision(_default(_get(run, "precision"), "bf16", notes, "precision=bf16 (mixed)"))
    framework = str(_get(run, "framework") or "").lower()
    nanotron = is_nanotron(framework)
    if not framework:
        notes.append("framework=nanotron (its ZeRO all-gather staging and DDP buckets counted)")
    # fp32 gradient accumulation unless reported: nanotron's default (accumulate_grad_in_fp32), and
    # Megatron-LM's for bf16 (arguments.py turns accumulate_allreduce_grads_in_fp32 on with --bf16);
    # with fp16 Megatron keeps fp16 main grads (the loss scaler guards their range)
    fp32_accum = False if precision == "fp32" else _default(
        _flag(run, "accumulate_grad_in_fp32"), precision != "fp16", notes,
        "accumulate_grad_in_fp32=False (fp16: Megatron keeps fp16 grads)" if precision == "fp16"
        else "accumulate_grad_in_fp32=True (nanotron's default; Megatron's with bf16)")
    tp_mode = str(_get(run, "tp_mode") or "").upper()
    sp_flag = _flag(run, "sequence_parallel")
    if sp_flag is None and tp_mode:
        sp_flag = tp_mode in ("REDUCE_SCATTER", "SP")  # nanotron: REDUCE_SCATTER = sequence parallel
    if sp_flag is None and tp > 1:
        notes.append("sequence parallelism on with TP (nanotron tp_mode REDUCE_SCATTER)")
    engine = str(_get(run, "pp_engine") or "1f1b").lower().replace("_", "")
    return _Step(model=model, seq=seq, dp=dp, tp=tp, pp=pp, cp=cp, zero=zero, mbs=mbs, gas=gas, recompute=recompute,
                 precision=precision, framework=framework, nanotron=nanotron, fp32_accum=fp32_accum,
                 sp=tp > 1 and sp_flag is not False, flash=_flag(run, "flash_attention") is not False,
                 afab="afab" in engine or "allforwardallbackward" in engine)


@dataclass
class _PerParam:
    """Bytes per local parameter [UP] [ZeRO], nanotron specifics [NT]: the persistent model states
    (`persistent`, by COMPONENTS key), the bf16 grads alive at the end of a backward
    (`transient_grad`), the ZeRO all-gather staging of the optimizer step (`staging`), and the
    working weights' dtype size (`p_bytes`)."""

    persistent: dict[str, float]
    transient_grad: float
    staging: float
    p_bytes: int


def _bytes_per_param(st: _Step, notes: list[str]) -> _PerParam:
    """Model-state bytes per local parameter (_PerParam) under the step's precision and ZeRO stage."""
    zero, pp, nanotron, fp32_accum = st.zero, st.pp, st.nanotron, st.fp32_accum
    p_bytes, master = (_FP32, 0) if st.precision == "fp32" else (_BF16, _FP32)
    if st.precision == "fp8":
        notes.append("fp8 counted as bf16 weights + fp32 master (fp8 weight caches not counted)")
    shard = st.dp * st.cp  # ZeRO / distributed optimizer shards over the DP×CP group (Megatron-Core)
    zdiv = lambda stage: shard if zero >= stage else 1  # noqa: E731
    per_param = {
        "params": p_bytes / zdiv(3),
        # fp32 grad buffer for the whole model (nanotron keeps it unsharded under ZeRO-1 [NT]);
        # bf16 .grad tensors then exist only at the end of each backward pass (transient)
        "fp32_grad_accum": _FP32 / zdiv(2) if fp32_accum else 0.0,
        "grads": 0.0 if fp32_accum else p_bytes / zdiv(2),
        "master_weights": master / zdiv(1),
        "optimizer_states": 2 * _FP32 / zdiv(1),  # Adam first and second moments, fp32 [UP]
    }
    # nanotron adds the bf16 .grad tensors into the fp32 buffer only after loss.backward()
    # returns (FP32GradientAccumulator.backward [NT]): 2Ψ bf16 grads alive at the end of each
    # backward. Under DDP (ZeRO-0, DP > 1) they are views of DDP's persistent bf16 buckets.
    # Megatron-style frameworks accumulate into main_grad inside the backward hooks (no transient).
    transient_grad = p_bytes / zdiv(2) if (nanotron and fp32_accum) else 0.0
    if nanotron and fp32_accum and zero == 0 and shard > 1:
        per_param["grads"], transient_grad = p_bytes, 0.0
    # nanotron ZeRO all_gather_coalesced of the updated params during the optimizer step: flat
    # input Ψ/N plus flat output and its unflatten copy 2Ψ, in bf16 -> 4Ψ + 2Ψ/N bytes [NT];
    # the sweep's ZeRO-1 rows measure 10Ψ + 14Ψ/N = (2 + 4 + 4) + (12 + 2)/N bytes
    staging = 2 * p_bytes + p_bytes / shard if (nanotron and zero in (1, 2) and shard > 1) else 0.0
    if zero == 3 and pp > 1:  # FSDP under PP keeps the stage unsharded between micro-batches
        per_param["params"] += p_bytes  # (torchtitan: reshard_after_forward=False with PP, grad
        per_param["grads"] += p_bytes   # sync only on the last micro-batch)
        notes.append("ZeRO-3 with PP: unsharded bf16 params and grads kept across micro-batches")
    return _PerParam(per_param, transient_grad, staging, p_bytes)


#: a stage's peak: (bytes, breakdown in bytes by COMPONENTS key, "forward_backward" or "optimizer_step")
_Peak = tuple[float, dict[str, float], str]


def _stage_peaks(st: _Step, pb: _PerParam, c: MemoryConstants) -> tuple[dict[str, _Peak], float]:
    """Each pipeline stage's peak over the step's three candidate moments (the loss of the newest
    micro-batch, the end of a backward, the optimizer step), named "only"/"first"/"last"/"stage k";
    and the first stage's allocated memory at the optimizer step (bytes, nanotron's "Mem Alloc")."""
    model, tp, pp, gas = st.model, st.tp, st.pp, st.gas
    # the lm_head's stage (its fp32 cast and the loss run on the last one: the logits are counted there)
    layer_split, head_stage = stage_split(model, pp, balanced=st.nanotron)
    kept, full_layer = _activation_bytes_per_token(model, st.seq, tp, st.sp, st.recompute, st.flash,
                                                   op_sac="torchtitan" in st.framework)
    tokens_mb = st.mbs * st.seq / st.cp    # tokens of one micro-batch on one GPU (CP splits s)
    emb_params = model.vocab * model.h / tp  # vocab-parallel embedding / lm_head [K22 §3]
    layer_local = (model.layer_params() - 2 * model.h) / tp + 2 * model.h  # norms replicated
    # nanotron keeps MemoryBuffer all-gather buffers (2 × bf16 s·b·h) once TP > 1 with SP [NT];
    # ZeRO-3 gathers the weights of the current and the prefetched layer [ZeRO §5.3]
    comm = 2 * _BF16 * tokens_mb * model.h if (st.sp and st.nanotron) else 0.0
    comm += 2 * pb.p_bytes * layer_local if st.zero == 3 else 0.0
    stages: dict[str, _Peak] = {}
    opt_first = 0.0
    for r, n_layers in enumerate(layer_split):
        first, last = r == 0, r == pp - 1
        params = n_layers * layer_local + (emb_params if first else 0.0)
        if r == head_stage:  # final norm; untied lm_head, or nanotron's tied copy, on the head's stage
            params += model.h + (emb_params if (pp > 1 or not model.tied) else 0.0)
        persistent = {k: v * params for k, v in pb.persistent.items()}
        persistent["framework_overhead"] = c.framework_misc_gib * GIB
        in_flight = gas if st.afab else min(pp - r, gas)  # [1F1B]: stage r holds ≤ pp−r micro-batches
        act_mb = kept * n_layers * tokens_mb
        recomputed = (full_layer - kept) * tokens_mb if n_layers else 0.0  # one layer rebuilt
        # loss peak of the newest micro-batch + the fp32 softmax each other in-flight one keeps [NT]
        logits = (c.logits_bytes_per_vocab + _FP32 * (in_flight - 1)) * model.vocab / tp * tokens_mb if last else 0.0
        phases = {  # transient memory at the three candidate peak moments
            # loss of the newest micro-batch: all in-flight activations + logits [K22][NT]
            "forward_backward": {"activations": in_flight * act_mb + recomputed,
                                 "logits_loss": logits, "communication_buffers": comm},
            # end of a backward: its bf16 grads alive, one micro-batch fewer in flight
            "backward_end": {"activations": max(0, in_flight - 1) * act_mb,
                             "transient_grads": pb.transient_grad * params,
                             "communication_buffers": comm},
            "optimizer_step": {"communication_buffers": comm + pb.staging * params},
        }
        best, opt = _phase_peak(persistent, phases, c)
        if first:
            opt_first = opt
        stages["only" if pp == 1 else "first" if first else "last" if last else f"stage {r}"] = best
    return stages, opt_first


def _phase_peak(persistent: dict[str, float], phases: dict[str, dict[str, float]],
                c: MemoryConstants) -> tuple[_Peak, float]:
    """The largest of one stage's candidate moments (persistent states + that moment's transients,
    their fragmentation, the CUDA context), and its allocated memory at the optimizer step."""
    best: _Peak | None = None
    opt = 0.0
    for phase, transient in phases.items():
        dynamic = sum(transient.values())
        parts = dict(persistent)
        parts["grads"] += transient.pop("transient_grads", 0.0)
        parts.update(transient)
        parts["allocator_fragmentation"] = (c.fragmentation - 1.0) * dynamic
        parts["cuda_context_nccl"] = c.cuda_context_nccl_gib * GIB
        total = sum(parts.values())
        if best is None or total > best[0]:
            best = (total, parts, "optimizer_step" if phase == "optimizer_step" else "forward_backward")
        if phase == "optimizer_step":
            opt = total - parts["allocator_fragmentation"] - parts["cuda_context_nccl"]
    assert best is not None  # phases is never empty
    return best, opt


def estimate_memory(run: dict, gpu_memory_gib: float | None = None, *,
                    constants: MemoryConstants = DEFAULT_CONSTANTS) -> MemoryEstimate:
    """Predict the per-GPU peak memory of a training step from run-record fields (DESIGN §2), in
    phases: the inputs (_read_step), bytes per parameter (_bytes_per_param), each pipeline stage's
    peak (_stage_peaks), the largest against the GPU's usable memory.

    `run` may carry model dims, parallelism (dp, tp, pp, cp, ep, zero_stage), micro_batch_size,
    grad_accum_steps, seq_len, recompute, precision, gpu_type, framework and `extra` (tp_mode,
    accumulate_grad_in_fp32, tie_word_embeddings, pp_engine, sequence_parallel, flash_attention).
    gpu_memory_gib defaults to the hardware catalog's memory for run["gpu_type"]. A parallelism degree
    left out is taken as 1 (the unsharded case, the /memory request's documented default) and named
    in notes; callers pass requests and candidate layouts, never a stored run with a NULL degree.
    Raises ValueError naming the field when the estimate is impossible.
    """
    notes: list[str] = []
    st = _read_step(run, notes)
    c = constants
    stages, opt_first = _stage_peaks(st, _bytes_per_param(st, notes), c)
    peak_stage = max(stages, key=lambda k: stages[k][0])
    _, parts, phase = stages[peak_stage]
    breakdown = {k: parts.get(k, 0.0) / GIB for k in COMPONENTS}
    predicted = sum(breakdown.values())
    if gpu_memory_gib is None:
        acc = lookup(_get(run, "gpu_type"))
        gpu_memory_gib = acc.memory_gib if acc else None
        if acc is None:
            notes.append("gpu memory unknown (gpu_type not in the catalog): fits not decided")
    usable = gpu_memory_gib * c.usable_fraction if gpu_memory_gib is not None else None
    return MemoryEstimate(
        predicted_peak_memory_gib=predicted,
        gpu_memory_gib=gpu_memory_gib,
        fits=None if usable is None else predicted <= usable,
        breakdown=breakdown,
        assumptions=notes,
        usable_memory_gib=usable,
        peak_stage=peak_stage,
        peak_phase=phase,
        stage_peaks_gib={k: v[0] / GIB for k, v in stages.items()},
        stage_breakdowns={k: {n: v[1].get(n, 0.0) / GIB for n in COMPONENTS} for k, v in stages.items()},
        optimizer_step_gib=opt_first / GIB,
    )
