"""Throughput model: predicted tokens/s/GPU and MFU of a configuration nobody ran (DESIGN §4).

Step time of one optimizer step on one GPU, decomposed as in the Ultra-Scale Playbook [UP] and
Megatron-LM [NA21] (the physical terms and their sources: service/analytics/throughput_terms.py):

    t = τ · r + (τ + t_tp) · (pp − r)/m                    1F1B: (m−1)·τ_max + Σ τ_stage [NA21 §2.2]: the slowest
                                                          stage (r = τ_max/τ_mean ≥ 1) sets the pace; with even
                                                          stages (r = 1) the bubble is (p−1)/(m+p−1) of the step
        + t_tp                                            exposed TP collectives [NA21 §3.2], [UP TP/SP]
        + smoothmax(g·a_dp·dp_bytes, W) − W + g·a_zero·zero_gather_bytes,  g = (1 + a_dp_n·log2 n_dp)/dp_bw,
          W = ov · τ/m                                    the gradient reduction hidden behind the last micro-batch's
                                                          backward (ov: 2/3, 3/4 with full recompute; 0 where the
                                                          framework reduces after it: grad_reduce_overlap)
                                                          exposed DP / ZeRO gradient sync [UP DP, ZeRO], growing
                                                          with the nodes n_dp its group spans (ring / tree depth)
        + OPTIMIZER_BYTES · opt_params / hbm              the optimizer update, memory-bound, sharded by ZeRO
        + A_CP · cp_bytes / cp_bw                         exposed ring-attention exchange [UP CP]
        + pp_bytes / pp_bw                                pipeline point-to-point sends [NA21 §2.2]
        + α_pp_x · 2(m + pp − 1) · [stages on other nodes] their latency on the 1F1B critical path
    t_tp = a_tp · tp_bytes / tp_bw + (α_tp + α_tp_pp·[tp>1, pp>1]) · 2(tp−1) · n_tp + α_tp_x · 2·n_nodes · n_tp
                                                          volume, and a latency per ring step (Hockney α–β;
                                                          Thakur et al. 2005: 2(t−1) steps per all-reduce),
                                                          more on the 2·n_nodes steps that cross the network
                                                          when TP spans n_nodes > 1 (NCCL's tuning model)
    τ = smoothmax(t_gpu + t_tp, κ · layer passes + κ_tp · TP layer passes) − t_tp
                                                          one GPU's mean stage: the GPU's work (its TP
                                                          collectives with it), or the CPU's kernel launches
                                                          when they take longer (κ, κ_tp set:
                                                          LAUNCH_S_PER_LAYER, TP_LAUNCH_S_PER_LAYER)
    t_gpu = hw_flops / (eff · peak) + (b_act·n_act + b_logit·n_logit + b_score·n_score) / hbm
    eff = e_max · hs/(hs + k_h)                           achieved fraction of the dense peak in the matmuls

hw_flops: the matmul FLOPs the GPU executes (the input embedding is a lookup, not a matmul; a gated MLP
has three matrices, a plain one two: core/model.ModelShape). hs = h/tp, the K/N of the GPU's matmuls:
narrow matmuls reach a smaller fraction of peak ([UP] "the GEMMs get smaller" under TP; the saturating
form is the usual occupancy curve). n_act = tokens·L·h, n_logit = tokens·V and, without FlashAttention,
n_score = tokens·L·a·s per GPU: the memory-bound elementwise work around the matmuls (norms, the MLP's
activation, rotary, residual adds over the h-wide activations; softmax and cross-entropy over the
V-wide logits; an unfused attention core's scores), whose time is the bytes moved over the HBM
bandwidth (core/hardware.HBM) — the roofline's memory-bound side (Williams, Waterman & Patterson 2009,
CACM 52(4)); Korthikanti et al. 2022 (arXiv 2205.05198) §4 count these tensors. b_act, b_logit, b_score
are the bytes moved per element, fitted; their weight falls as h grows (elementwise ∝ L·h against
matmuls ∝ L·h²): small models reach a lower MFU. κ is the CPU time to launch one layer's forward and
backward kernels (PyTorch's eager mode launches each kernel from Python, and the GPU idles when its
kernels are shorter: the reason for CUDA graphs, PyTorch "CUDA Graphs" docs): it binds for small
models and micro-batches only. κ_tp is what a tensor-parallel layer's CPU adds to it: the TP region's
autograd functions and collective calls (TP_LAUNCH_S_PER_LAYER). The GPU's TP collectives run while the
CPU launches, so they sit under the floor with the GPU's work (t_tp inside the maximum): a TP layer at
micro-batch 1 takes the floor's time whatever the TP degree, as the sweep's do (bench/RESULTS.md, "Issue 25,
fifth pass").
α_tp_pp is the TP ring step's latency inside a pipelined stage, fitted apart: on the Ultra-Scale sweep
TP × PP layouts pay ~4 ms per layer per micro-batch and per TP rank beyond the first, independent of
the node count and of the micro-batch (bench/RESULTS.md, issue 25), which α_tp alone cannot describe.
A_CP is fixed at 0.3 (most of the ring exchange overlaps the attention [UP CP]) for lack of CP runs
to fit it on.
The pipeline bubble is not fitted: 1F1B's schedule gives it exactly, (p − r)·τ on top of m·r·τ [NA21
§2.2]. Fitted (a factor a_bubble on it, until 2026-11-26), it took 0.91 on the whole sweep and 0.76 on
its 1–2-node cells, where many micro-batches keep the bubble a few % of the step and so say little about
it; the model then priced deep pipelines too cheaply the further it extrapolated in nodes (fixed global
batch: fewer micro-batches per pipeline, a larger bubble): fitted on ≤ 2 nodes, ln(measured/predicted)
fell by 0.43 per unit of bubble share at 4–8 nodes, 0.23 with the bubble as 1F1B gives it
(bench/RESULTS.md, "Issue 25, third pass").

Then tokens/s/GPU = (global batch tokens / world size) / t and MFU = model FLOPs / (t · peak)
[PaLM appendix B]. The parameters (PARAMS) are fitted by least squares on log(tokens/s)
(scipy.optimize.least_squares, robust loss) to the user's own successful, not retired runs with a
known precision, per GPU type and framework, aggregated per configuration in SQL (each
configuration's best recorded tokens/s/GPU: slower repeats are contention, a configuration is as
fast as it has been shown to run), keeping those that compete in their cell (COMPETITIVE_FRACTION).
The cluster's network is read once from its runs: their recorded all-reduce bus bandwidth at the
smallest multi-node count (network_reference), else the catalog's link bandwidths (core/hardware.LINKS).

Held-out error: the leave-one-out residuals of the fit, r_i/(1−h_ii) with h the hat matrix of the
linearised problem (Cook & Weisberg 1982, ch. 3; exact for linear least squares, first-order
for nonlinear), reported as the median |predicted/real − 1| and used for the interval (which
recommend.predicted_for widens with the distance to the evidence: anchor.interval_halves).
Too few configurations (< MIN_CONFIGS) → PRIOR (the fit on the Ultra-Scale Playbook sweep's
H100 nanotron runs; see PRIOR), and the answer says so.
"""

from __future__ import annotations

import math
import operator
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sqlalchemy as sa
from scipy.optimize import least_squares
from sqlalchemy.orm import Session

from core import hardware
from core.frameworks import engine_family
from service import run_configs
from service.analytics.numdiff import finite_difference_jacobian
from service.analytics.throughput_terms import CATALOG_NETWORK_EFFICIENCY, OPTIMIZER_BYTES, Terms, terms, terms_table
from service.db import fetch_ordered
from service.tables import Run

PARAMS = ("e_max", "k_h", "a_tp", "alpha_tp", "alpha_tp_pp", "alpha_tp_x", "a_dp", "a_dp_n", "a_zero", "alpha_pp_x",
          "b_act", "b_logit", "b_score")
#: the documented prior: the fit on the Ultra-Scale Playbook sweep (all 12 cells of bench_calibration.csv,
#: H100 nanotron, pre-fix pipeline runs retired as bench/recommend_loo.py does), rounded; used when a
#: group has too few configurations, and as the fit's starting point. k_h keeps 37: the GEMM-width term is
#: weakly identified on the sweep (h/tp ≥ 256 everywhere; the full fit drives it to ~0, fits on subsets
#: anywhere from 10 to 70), and the fallback keeps a GEMM-width effect (e = 0.93·e_max at h/tp = 512).
#: alpha_tp_x and b_score stay at values set by hand (no competitive run of the sweep has TP across
#: nodes, none runs without FlashAttention): 30 µs more on each ring step that crosses the network — NCCL
#: charges the network's latency to 2·n_nodes of an all-reduce's 2(t−1) steps (src/graph/tuning.cc; its own
#: figure for a network ring step is 14 µs, hwLat[NET][Ring][Simple]); 30 µs was read off the sweep's TP16
#: layouts over 2 nodes when every one of the 30 steps paid it, and is kept: vTrain's leave-one-size-out
#: error is 9.8–9.9 % anywhere from 14 to 60 µs (bench/RESULTS.md, issue 25 third pass) — and 45 bytes
#: per score element (Korthikanti et al.'s
#: 5 bytes stored per score element, written and read by the softmax and dropout forward, twice that
#: backward). Refitted 2026-11-26 with the gradient reduction's overlap (W in the docstring): a_dp, a_zero
#: grew (3.3 → 5.5, 3.8 → 5.7: the reduction's own time, part of it now hidden), a_tp, e_max, b_act with them.
#: Refitted 2026-11-27 with the TP layer's CPU floor (TP_LAUNCH_S_PER_LAYER, the launch floor's exponent 16), the
#: same way (PRIOR_WEIGHT 0, k_h free, then rounded): alpha_tp 2.2e-5 → 1.7e-5 (the floor, not the ring's latency,
#: now explains TP at micro-batch 1), a_tp 0.88 → 0.97, a_zero 5.7 → 6.8, a_dp 5.5 → 5.1, a_dp_n 0.06 → 0.03,
#: e_max, alpha_tp_pp, alpha_pp_x, b_act, b_logit by ≤ 7 %
PRIOR = {"e_max": 0.64, "k_h": 37.0, "a_tp": 0.97, "alpha_tp": 1.7e-5, "alpha_tp_pp": 3.5e-5, "alpha_tp_x": 3e-5,
         "a_dp": 5.1, "a_dp_n": 0.03, "a_zero": 6.8, "alpha_pp_x": 0.98e-3, "b_act": 663.0,
         "b_logit": 82.0, "b_score": 45.0}
_LOWER = {"e_max": 0.05, "k_h": 0.0, "a_tp": 0.0, "alpha_tp": 0.0, "alpha_tp_pp": 0.0, "alpha_tp_x": 0.0, "a_dp": 0.0,
          "a_dp_n": 0.0, "a_zero": 0.0, "alpha_pp_x": 0.0, "b_act": 0.0, "b_logit": 0.0,
          "b_score": 0.0}
#: e_max ≤ 0.9: no dense bf16 GEMM reaches more of the datasheet peak (NVIDIA's own H100 GEMM benchmarks
#: reach ~75–80 %); the bytes per element are bounded by a few hundred passes over the tensor
_UPPER = {"e_max": 0.9, "k_h": 4e3, "a_tp": 3.0, "alpha_tp": 0.01, "alpha_tp_pp": 0.05, "alpha_tp_x": 0.5,
          "a_dp": 10.0, "a_dp_n": 3.0, "a_zero": 10.0, "alpha_pp_x": 0.5, "b_act": 5000.0,
          "b_logit": 2000.0, "b_score": 500.0}
A_CP = 0.3
#: exponent of the smooth maximum of the GPU's time and the CPU's launch time (the GPU cannot run ahead
#: of the kernels the CPU has not launched yet): (gpu¹⁶ + cpu¹⁶)^(1/16) is within 4.4 % of max(gpu, cpu) at
#: equality and within 0.1 % once one is 1.5 times the other. Nearly a hard maximum, as the sweep's TP8
#: layouts at micro-batch 1 show: 4.63 ms per layer pass for the 1.34B model and 4.42 ms for the 8.86B one,
#: whose GPU work, its TP collectives with it, is 1.7 times as long (predicted 3.5 against 2.1 ms; a smooth
#: maximum of exponent 4, 19 % above the maximum at equality, puts the larger one 7 % above the floor, of
#: exponent 16 0.1 %). Was 4 while only κ (0.6 ms, binding nowhere in the fitted data) used it; at 4 the TP
#: floor's shoulder raised the competitive layouts near it (3.57B TP2 at micro-batch 1) and the fits lowered
#: α_tp to 0 to pay for it (bench/RESULTS.md, "Issue 25, fifth pass")
LAUNCH_SMOOTHING = 16.0
#: exponent of the smooth maximum of the gradient reduction's time and the backward window it hides behind
#: (throughput_terms.grad_reduce_overlap): exposed = max(reduce, window) − window, smoothed as LAUNCH_SMOOTHING
#: is so that the fit has a gradient where the two meet (exponent 8: the same counts, bench/RESULTS.md)
OVERLAP_SMOOTHING = 4.0
#: kernels one transformer layer launches per forward + backward pass in eager PyTorch (Megatron-LM's GPT
#: layer with its fused kernels, counted from the layer's structure in megatron/model/transformer.py):
#: forward ~20 — two norms, the QKV, output, MLP-up and MLP-down GEMMs, the attention core (scores GEMM,
#: fused scale-mask-softmax, dropout, context GEMM, the permute copy), the fused bias-GELU, two fused
#: bias-dropout-adds, two TP collectives — and a backward of about twice as many (two GEMMs per forward
#: GEMM, the elementwise gradients, the gradient accumulation into main_grad): 60. A full recompute's extra
#: forward is counted by layer_passes' 4/3.
KERNELS_PER_LAYER_PASS = 60
#: CPU time to dispatch one kernel from eager PyTorch: Python, autograd recording, the ATen dispatcher and
#: cudaLaunchKernel, ~10 µs per op (PyTorch "CUDA Graphs" documentation and Nguyen et al. 2021, "Accelerating
#: PyTorch with CUDA Graphs", PyTorch blog: launch overhead dominates small kernels; He 2022, "Making Deep
#: Learning Go Brrrr From First Principles": the overhead-bound regime)
KERNEL_DISPATCH_S = 1e-5
#: κ, the CPU time to launch one layer's forward and backward kernels: KERNELS_PER_LAYER_PASS ×
#: KERNEL_DISPATCH_S = 0.6 ms (was 0.3 ms, "~30 kernels", which counted the forward's kernels for both
#: passes). Set, not fitted: fitted to the Ultra-Scale sweep it took 3.8 ms, a per-micro-batch penalty that
#: explained noise and made micro-batch 1 lose every near-tie (leave-one-cell-out 9 of 12 against 12 of 12
#: without it, bench/RESULTS.md); its H100 kernels and vTrain's A100 ones are long enough that 0.6 ms never
#: binds on a competitive configuration there (bench/RESULTS.md, "Issue 25, third pass": every figure
#: unchanged), while a small model's narrow matmuls on a few GPUs (h/tp of a few hundred, a micro-batch of
#: 1–2 sequences: a layer pass of a few hundred µs on the GPU) wait for the CPU
LAUNCH_S_PER_LAYER = KERNELS_PER_LAYER_PASS * KERNEL_DISPATCH_S
#: κ_tp, the CPU time a tensor-parallel layer pass takes beyond κ (throughput_terms: tp_layer_passes). With TP
#: every sharded linear runs inside Python autograd functions that split, gather or reduce its input and output
#: (nanotron src/nanotron/parallel/tensor_parallel/functional.py, distributed_differentiable_primitives.py;
#: Megatron-LM megatron/core/tensor_parallel/mappings.py and layers.py: _CopyToModelParallelRegion,
#: _ReduceFromModelParallelRegion, LinearWithGradAccumulationAndAsyncCommunication), each collective a
#: torch.distributed call through ProcessGroupNCCL (its work object, the CUDA events that order the NCCL stream
#: against the compute stream) — CPU work per call whatever the tensor's size, and more Python per layer than
#: the GPU's kernels need at micro-batch 1: the eager-mode overhead CUDA graphs remove (PyTorch "CUDA Graphs"
#: docs; Nguyen et al. 2021, "Accelerating PyTorch with CUDA Graphs", PyTorch blog: Megatron-style BERT / GPT
#: training CPU-bound at small batches). Measured, not counted: on the Ultra-Scale sweep (H100, nanotron) every
#: TP2–TP8 layout at micro-batch 1 that is not GPU-bound takes 4.3–4.6 ms per layer pass (step time over layer
#: passes: 1.34B TP2 / TP4 / TP8 4.37 / 4.45 / 4.63 ms, 3.57B TP4 / TP8 4.31 / 4.41, 8.86B TP8 4.42) whatever
#: the model and the TP degree, where their GPU work differs 2.3× and the ring's 2(t−1) steps 7×: a floor of
#: ~4.4 ms, κ + 3.8 ms. Fitted as a parameter on all 12 cells it takes the same 3.8 ms (3.8–3.9 on the 1-node
#: and ≤ 2-node cells). Set, not fitted, as κ is: fitted, each held-in fit moved its other parameters with it
#: and the ≤ 2-node fit lost a cell of the > 2-node holdout (bench/RESULTS.md, "Issue 25, fifth pass"). The same
#: floor is charged to every framework (Megatron-LM's TP region has the same structure): vTrain's Megatron-DeepSpeed
#: runs on A100s cannot say otherwise — the nearest, 3.6B at TP8 and micro-batch 2, is predicted 4.7 ms per layer
#: pass on the GPU (measured: 6.9 ms), and every other one at ≥ 5.5 ms.
TP_LAUNCH_S_PER_LAYER = 3.8e-3
MIN_CONFIGS = 8
#: a parameter is fitted only when at least MIN_SUPPORT fitted configurations exercise its term (the Terms
#: field that multiplies it is non-zero); otherwise no run says anything about it and it stays at the PRIOR
#: (e.g. α_tp_x without a competitive configuration whose TP spans nodes)
MIN_SUPPORT = 3
_SUPPORT = {"a_tp": "tp_bytes", "alpha_tp": "tp_collectives", "alpha_tp_pp": "tp_in_pipeline",
            "alpha_tp_x": "tp_inter", "a_dp": "dp_bytes", "a_dp_n": "dp_nodes_log2", "a_zero": "zero_gather_bytes",
            "alpha_pp_x": "pp_inter", "b_score": "score_elems"}
#: the fit uses the configurations that compete: those within 30 % of the best tokens/s/GPU of their cell
#: (same GPU type, framework, precision, model, seq_len, nodes × gpus per node). A configuration far slower
#: than its cell's best is slow for reasons no term here models — a degraded or contended network, a
#: pipeline engine that hangs, an allocator thrashing near the memory limit, TP stretched over the
#: network — and fitting it bends the parameters that rank the fast ones (on the sweep, keeping them gave
#: a per-layer "launch" constant of 2.4 ms that predicted micro-batch 1 20 % slower than micro-batch 2 where
#: the runs differ by ±2 %: bench/RESULTS.md, issue 16). What the recommender answers is which of the
#: competitive configurations is best.
COMPETITIVE_FRACTION = 0.7
#: robust (Cauchy) loss of the fit on log(tokens/s), scale 10 %: residuals far beyond it barely count, so a few
#: pathological runs (a hung pipeline at 1/40 of its siblings) do not drag the fit
ROBUST_SCALE = 0.1
ROBUST_LOSS = "cauchy"
#: weight of the PRIOR in the fit (a maximum a posteriori estimate): every fitted parameter adds the residual
#: PRIOR_WEIGHT × (p − p₀)/p₀ to the data's log residuals — a Gaussian prior on its relative deviation from the
#: PRIOR of σ = ROBUST_SCALE / PRIOR_WEIGHT = 20 % in the robust loss's units, which a parameter the runs
#: identify leaves at once (the Cauchy loss caps its pull), while one they hardly constrain stays near its
#: physical value instead of taking whatever value absorbs the noise: fitted on vTrain's 18B–175B runs
#: without it, b_score (unfused attention's bytes per score element) went to 102, costing the 3.6B model's
#: scores 2.1 s of a 3.6 s step; k_h and b_act, nearly collinear (both ∝ h per token), swung between 0 and 78
#: and between 825 and 1,450. Measured (bench/vtrain_accuracy.py, bench/recommend_holdout.py): vTrain
#: leave-one-size-out mean error 11.7 % → 10.4 %, groups 2 → 3 of 4; the sweep's >2-node holdout 5 → 6 of 6,
#: leave-one-cell-out unchanged (12 of 12). Gelman et al., "Bayesian Data Analysis" (3rd ed.) §14.8: a
#: weakly informative prior as regularisation of a least-squares fit.
PRIOR_WEIGHT = 0.5
#: default relative half-width of the interval when the fit has no held-out residuals (prior)
PRIOR_SPREAD = 0.35

#: configuration columns the fit aggregates by (plus the hardware and the model): run_configs' key
CONFIG_COLS = run_configs.CONFIG_COLS


def step_time(t: dict[str, Any] | Terms, p: dict[str, Any]) -> Any:
    """Step time in seconds (see the module docstring) for terms `t` (one Terms, or as_arrays of
    many) under parameters `p`. Returns (total, compute, tp, dp, bubble, other) — floats or arrays."""
    g = t if isinstance(t, dict) else t.__dict__
    eff = p["e_max"] * g["h_shard"] / (g["h_shard"] + p["k_h"])
    gpu = (g["hw_flops"] / (eff * g["peak_flops"])
           + (p["b_act"] * g["act_elems"] + p["b_logit"] * g["logit_elems"] + p["b_score"] * g["score_elems"])
           / g["hbm_bw"])
    cpu = LAUNCH_S_PER_LAYER * g["layer_passes"] + TP_LAUNCH_S_PER_LAYER * g["tp_layer_passes"]
    tp = (p["a_tp"] * g["tp_bytes"] / g["tp_bw"]
          + (p["alpha_tp"] + p["alpha_tp_pp"] * g["tp_in_pipeline"] + p["alpha_tp_x"] * g["tp_inter"])
          * g["tp_ring_steps"])
    # the GPU's work and its TP collectives run while the CPU launches them: the longer of the two, smoothed
    # (max·(1 + (min/max)^k)^(1/k), the same as (a^k + b^k)^(1/k) without overflow at k = 16)
    busy = gpu + tp
    top, low = np.maximum(busy, cpu), np.minimum(busy, cpu)
    mean = top * (1.0 + (low / top) ** LAUNCH_SMOOTHING) ** (1.0 / LAUNCH_SMOOTHING) - tp
    r = g["stage_imbalance"]
    compute = mean * r
    bubble = (mean + tp) * (g["pp"] - r) / g["micro_batches"]
    grow = (1.0 + p["a_dp_n"] * g["dp_nodes_log2"]) / g["dp_bw"]
    # the gradients' reduction runs behind the last micro-batch's backward; the part that outlasts it is
    # exposed: max(reduce, window) − window, smoothed as the launch floor is (throughput_terms.grad_reduce_overlap)
    reduce = grow * p["a_dp"] * g["dp_bytes"]
    window = g["dp_overlap"] * mean / g["micro_batches"]
    exposed = (reduce ** OVERLAP_SMOOTHING + window ** OVERLAP_SMOOTHING) ** (1.0 / OVERLAP_SMOOTHING) - window
    dp = exposed + grow * p["a_zero"] * g["zero_gather_bytes"] + OPTIMIZER_BYTES * g["opt_params"] / g["hbm_bw"]
    other = (A_CP * g["cp_bytes"] / g["cp_bw"] + g["pp_bytes"] / g["pp_bw"]
             + p["alpha_pp_x"] * g["pp_messages"] * g["pp_inter"])
    return compute + bubble + tp + dp + other, compute, tp, dp, bubble, other


@dataclass
class Fit:
    """A fitted (or prior) parameter set and what it rests on.

    status: "fitted" | "prior"; reason: why the prior (or a transfer) was used; group: the
    (gpu_type, framework) fitted on; n_configurations / n_runs: what the fit saw; n_not_competitive:
    configurations left out as slower than COMPETITIVE_FRACTION of their cell's best; run_ids: one run
    per fitted configuration (its first); loo_median_rel_err: median |pred/real − 1| held out;
    loo_log_q80: 80th percentile of |log(pred/real)| held out (the interval's half-width);
    loo_log_sigma: 1.4826 × median |log(pred/real)| held out (a robust σ, for /suggest)."""

    params: dict[str, float]
    status: str
    group: dict[str, Any]
    n_configurations: int = 0
    n_runs: int = 0
    run_ids: list[int] = field(default_factory=list)
    loo_median_rel_err: float | None = None
    loo_log_q80: float = PRIOR_SPREAD
    loo_log_sigma: float = PRIOR_SPREAD / 1.2816
    reason: str | None = None
    n_not_competitive: int = 0
    network_gb_s: float | None = None

    def describe(self) -> dict[str, Any]:
        """The fit as the API shows it."""
        return {"status": self.status, "gpu_type": self.group.get("gpu_type"),
                "framework": self.group.get("framework"), "n_configurations": self.n_configurations,
                "n_not_competitive": self.n_not_competitive, "competitive_fraction": COMPETITIVE_FRACTION,
                "n_runs": self.n_runs, "fitted_on_run_ids": self.run_ids[:50],
                "loo_median_rel_err": self.loo_median_rel_err, "interval_rel_half_width": math.expm1(self.loo_log_q80),
                "params": {k: float(f"{v:.4g}") for k, v in self.params.items()}, "reason": self.reason}


def config_terms(row: dict[str, Any], network_gb_s: float | None = None) -> Terms | None:
    """Terms of an aggregated configuration row (its recorded intra-node bandwidth used; the
    cluster's network reference `network_gb_s`, network_reference), None if incomplete."""
    try:
        return terms(row, network_gb_s=network_gb_s, intra_bw_recorded=row.get("ar_intra_gb_s"))
    except (ValueError, ZeroDivisionError):
        return None


def rows_terms(rows: list[dict[str, Any]], network_gb_s: float | None = None) -> tuple[dict[str, Any], list[int]]:
    """config_terms of many configuration rows at once (throughput_terms.terms_table): ({Terms field:
    array over the costed rows}, the indices in `rows` of those costed; config_terms' None left out)."""
    return terms_table(rows, network_gb_s=network_gb_s, intra_bw_recorded=[r.get("ar_intra_gb_s") for r in rows])


def network_reference(rows: list[dict[str, Any]], gpu_type: str | None) -> tuple[float | None, str]:
    """The cluster's full-node all-reduce bus bandwidth across nodes (GB/s) as `gpu_type`'s runs
    recorded it: the median of their recorded all-reduce bandwidth (allreduce_gb_s) at the smallest
    node count above 1 that recorded one — the least latency-bound reading (the sweep's halves with
    every doubling of nodes, while the gradient reduction's own time grows far less: throughput_terms,
    dp_nodes_log2). (None, why) when none recorded it: the catalog's line rate is used, at
    CATALOG_NETWORK_EFFICIENCY, and the reason says it is the best case — NCCL's achieved bus bandwidth stays below
    the line rate (nvidia/nccl-tests doc/PERFORMANCE.md) and a cluster may have less than the catalog's reference
    system (vTrain's: 800 Gb/s per node, its README, against DGX A100's 8 × 200 Gb/s). Fitting it from the runs
    instead was tried and not kept: without a recorded bandwidth a slow network and a framework's slow TP across nodes
    look the same (bench/RESULTS.md, "Issue 25, sixth pass", the network where no run records it)."""
    by_nodes: dict[int, list[float]] = {}
    for r in rows:
        if r["gpu_type"] == gpu_type and (r.get("nodes") or 0) > 1 and r.get("allreduce_gb_s"):
            by_nodes.setdefault(int(r["nodes"]), []).append(float(r["allreduce_gb_s"]))
    if not by_nodes:
        return None, (f"catalog network line rate at {CATALOG_NETWORK_EFFICIENCY:.0%}, the best case: a cluster's "
                      "network may be slower (no run recorded its all-reduce bandwidth across nodes)")
    n = min(by_nodes)
    return statistics.median(by_nodes[n]), f"the all-reduce bandwidth recorded at {n} nodes (median)"


def global_batch_tokens(r: dict[str, Any]) -> int | None:
    """dp · micro_batch_size · grad_accum_steps · seq_len of a configuration row (tokens per optimizer
    step), None when one is unknown."""
    try:
        return int(r["dp"]) * int(r["micro_batch_size"]) * int(r["grad_accum_steps"]) * int(r["seq_len"])
    except (KeyError, TypeError, ValueError):
        return None


def cell_key(r: dict[str, Any]) -> tuple:
    """The cell a configuration row competes in: GPU type, framework, precision, model, seq_len, nodes,
    gpus per node (the question "what is best for this target?" is asked per cell)."""
    return (*map(r.get, _CELL_FIELDS), global_batch_tokens(r))


_CELL_FIELDS = ("gpu_type", "framework", "precision", "model_params", "num_layers", "hidden_size", "seq_len", "nodes",
                "gpus_per_node")


def competitive(usable: list[tuple[dict[str, Any], Any]]) -> list[tuple[dict[str, Any], Any]]:
    """The rows within COMPETITIVE_FRACTION of their cell's best tokens/s/GPU (each cell's best is kept)."""
    best: dict[tuple, float] = {}
    keys = [cell_key(r) for r, _ in usable]
    for (r, _), key in zip(usable, keys):
        best[key] = max(best.get(key, 0.0), float(r["tokens_per_sec_per_gpu"]))
    return [(r, t) for (r, t), key in zip(usable, keys)
            if float(r["tokens_per_sec_per_gpu"]) >= COMPETITIVE_FRACTION * best[key]]


def fit(rows: list[dict[str, Any]], group: dict[str, Any], network_gb_s: float | None = None, *,
        terms_of: Any = None, scipy_jacobian: bool = False) -> Fit:
    """Least-squares fit of the parameters to configuration rows (load_configs' dicts with
    `tokens_per_sec_per_gpu`, `n_runs`, `first_id`): those that compete in their cell (competitive()),
    costed with the cluster's network reference `network_gb_s` (GB/s, network_reference; None: the
    catalog's; `terms_of(rows)` replaces rows_terms(rows, network_gb_s) when given: Model.terms_table).
    Fewer than MIN_CONFIGS such rows → the PRIOR, with the reason. The Jacobian is scipy's two-point
    finite difference, its perturbed residuals evaluated in one array pass (finite_difference_jacobian;
    `scipy_jacobian`: scipy's own loop, the same floats — tests)."""
    table, kept = (terms_of or (lambda rs: rows_terms(rs, network_gb_s)))(rows)
    # (row, its position in `table`) of the measured, costed rows
    costed = [(rows[i], j) for j, i in enumerate(kept) if rows[i].get("tokens_per_sec_per_gpu")]
    usable = competitive(costed)
    n_runs = sum(int(r.get("n_runs") or 1) for r, _ in usable)
    ids = [int(r["first_id"]) for r, _ in usable if r.get("first_id") is not None]
    slow = len(costed) - len(usable)
    if len(usable) < MIN_CONFIGS:
        return Fit(dict(PRIOR), "prior", group, len(usable), n_runs, ids, n_not_competitive=slow,
                   network_gb_s=network_gb_s,
                   reason=f"{len(usable)} usable configuration(s) < {MIN_CONFIGS}: the documented prior "
                          "(fit on the Ultra-Scale Playbook sweep, H100 nanotron) is used")
    take = np.array([j for _, j in usable], dtype=int)
    arr = {k: v[take] for k, v in table.items() if k != "dp_bw_source"}
    y = np.log(np.array([r["tokens_per_sec_per_gpu"] for r, _ in usable], dtype=float))

    held = {k for k, f in _SUPPORT.items() if np.count_nonzero(arr[f]) < MIN_SUPPORT}
    free = [k for k in PARAMS if k not in held]  # the held ones stay at the PRIOR, outside the optimisation

    def params(x: np.ndarray) -> dict[str, float]:
        return {**PRIOR, **{k: float(v) for k, v in zip(free, x)}}

    p0 = np.array([PRIOR[k] for k in free])
    pull = np.divide(PRIOR_WEIGHT, p0, out=np.zeros_like(p0), where=p0 > 0)  # a PRIOR of 0 pulls nothing

    def residuals_many(xs: np.ndarray) -> np.ndarray:
        """The residuals under each row of `xs` (parameter vectors), one row each: step_time elementwise
        with each parameter a column, so every residual is the same float as under that vector alone."""
        columns: dict[str, Any] = {**PRIOR, **{k: xs[:, j:j + 1] for j, k in enumerate(free)}}
        total = step_time(arr, columns)[0]
        data = np.broadcast_to(np.log(arr["tokens_per_gpu"] / total) - y, (len(xs), len(y)))
        return np.concatenate([data, pull * (xs - p0)], axis=1)

    def residuals(x: np.ndarray) -> np.ndarray:
        return residuals_many(x[None, :])[0]

    lo, hi = np.array([_LOWER[k] for k in free]), np.array([_UPPER[k] for k in free])
    start = np.clip(np.array([PRIOR[k] for k in free]), lo, hi)
    jacobian = "2-point" if scipy_jacobian else (lambda x: finite_difference_jacobian(residuals_many, x, lo, hi))
    res = least_squares(residuals, start, jac=jacobian, bounds=(lo, hi), x_scale=np.maximum(start, 1e-4),
                        method="trf", loss=ROBUST_LOSS, f_scale=ROBUST_SCALE, max_nfev=200)
    n = len(y)  # the data's rows of the residual vector (the prior's rows follow them)
    jac = res.jac
    hat = np.einsum("ij,jk,ik->i", jac[:n], np.linalg.pinv(jac.T @ jac), jac[:n])
    loo = res.fun[:n] / np.clip(1.0 - hat, 0.05, None)
    return Fit(params(res.x), "fitted", group, len(usable), n_runs, ids, n_not_competitive=slow,
               network_gb_s=network_gb_s,
               loo_median_rel_err=float(np.median(np.abs(np.expm1(loo)))),
               loo_log_q80=float(np.quantile(np.abs(loo), 0.8)),
               loo_log_sigma=float(1.4826 * np.median(np.abs(loo))))


#: configuration rows' recorded bandwidth averages: (row key, runs column — copied from extra at ingest)
_BANDWIDTH_AVGS = (("allreduce_gb_s", Run.allreduce_gb_s), ("ar_intra_gb_s", Run.ar_intra_node_gb_s))


#: the parallelism degrees a configuration needs known to be costed, fitted on or adapted: a run that
#: leaves one of them NULL (not stated, not determined by tp·pp·cp·dp = world_size) is skipped
LAYOUT_DEGREES = ("dp", "tp", "pp", "cp")


def _fit_filter(exclude: sa.ColumnElement | None) -> list[sa.ColumnElement | sa.TextClause]:
    """The runs the fit reads: run_configs' MEMBERSHIP (one copy of the rule), less `exclude`."""
    where: list[sa.ColumnElement | sa.TextClause] = [sa.text(run_configs.MEMBERSHIP_SQL)]
    if exclude is not None:
        where.append(sa.not_(exclude))
    return where


#: configuration rows' recorded bandwidth means from run_configs: (row key, summary column prefix)
_BANDWIDTH_AVGS_SUMMARY = (("allreduce_gb_s", "allreduce_gb_s"), ("ar_intra_gb_s", "ar_intra_node_gb_s"))


def read_configs(session: Session, *, exclude: sa.ColumnElement | None = None) -> tuple[list[dict[str, Any]], int]:
    """(load_configs' rows, count_unknown_layout's count): the per-configuration summary run_configs
    (service/run_configs.py, kept in the write transaction), in CONFIG_COLS order — with `exclude`,
    the same aggregate computed from `runs` per call (tests). A configuration with an unknown degree
    is counted, then left out."""
    if exclude is not None:
        return _read_rows(session, _aggregate_runs(exclude))
    sums = ", ".join(f"{col}_sum, {col}_n" for _, col in _BANDWIDTH_AVGS_SUMMARY)
    sql = (f"SELECT {', '.join(CONFIG_COLS)}, n_runs, tokens_per_sec_per_gpu, first_id, peak_memory_gib, {sums} "
           "FROM run_configs")
    # ordered by the configuration, strings by code point (DuckDB's VARCHAR order, PostgreSQL's under a C
    # collation), NULLs last: fetch_ordered (DuckDB: numpy's lexsort of its columns, not its 24-column ORDER BY,
    # ~5 ms for ~1,700 rows, nor Python's sorts, ~6 ms; PostgreSQL: Python's sorts, cheaper than its ORDER BY)
    fetched = fetch_ordered(session, sql, CONFIG_COLS)
    keys = [*CONFIG_COLS, "n_runs", "tokens_per_sec_per_gpu", "first_id", "peak_memory_gib"]
    width = len(keys)
    rows: list[dict[str, Any]] = []
    for r in fetched:
        row = dict(zip(keys, r))
        for i, (key, _) in enumerate(_BANDWIDTH_AVGS_SUMMARY):
            total, n = r[width + 2 * i], r[width + 2 * i + 1]
            row[key] = total / n if n else None
        rows.append(row)
    return _finish_rows(rows)


def _aggregate_runs(exclude: sa.ColumnElement | None) -> sa.Select:
    """run_configs' aggregate computed from `runs` (the runs `exclude` chooses left out)."""
    cols = [getattr(Run, c) for c in CONFIG_COLS]
    return (sa.select(*cols, sa.func.count().label("n_runs"),
                      sa.func.max(Run.tokens_per_sec_per_gpu).label("tokens_per_sec_per_gpu"),
                      sa.func.min(Run.id).label("first_id"),
                      sa.func.max(Run.peak_memory_gib).label("peak_memory_gib"),
                      *(sa.func.avg(col).label(key) for key, col in _BANDWIDTH_AVGS))
            .where(*_fit_filter(exclude)).group_by(*cols).order_by(*cols))


def _read_rows(session: Session, query: sa.Select) -> tuple[list[dict[str, Any]], int]:
    result = session.execute(query)
    keys = list(result.keys())  # (row._mapping builds the key list again for every row)
    return _finish_rows([dict(zip(keys, r)) for r in result])


def _finish_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """(the rows with every degree known, the runs of those without one)."""
    out, unknown = [], 0
    degrees = operator.itemgetter(*LAYOUT_DEGREES)
    for row in rows:
        if None in degrees(row):
            unknown += row["n_runs"]
            continue
        # a float mean depends in its last bits on the order of summation (a parallel aggregate, the
        # summary's running sums): rounded here so that the same runs always give the same fit
        for key, _ in _BANDWIDTH_AVGS:
            if (value := row[key]) is not None:
                row[key] = round(float(value), 6)
        out.append(row)
    return out, unknown


def load_configs(session: Session, *, exclude: sa.ColumnElement | None = None) -> list[dict[str, Any]]:
    """Successful, not retired runs with a known precision, a tokens/s/GPU and known dp, tp, pp, cp
    (LAYOUT_DEGREES), aggregated per configuration (CONFIG_COLS) in SQL: n_runs, best
    tokens_per_sec_per_gpu, first run id, mean recorded all-reduce bandwidths (GB/s, the runs'
    allreduce_gb_s / ar_intra_node_gb_s columns, as `allreduce_gb_s` / `ar_intra_gb_s`; None when
    no run recorded them). Thousands of rows for a million runs. `exclude`: an extra SQL condition
    on runs to leave out (tests, bench). Runs with an unknown degree are left out (never read as
    1): count_unknown_layout says how many; read_configs gives both from one scan."""
    return read_configs(session, exclude=exclude)[0]


def count_unknown_layout(session: Session, *, exclude: sa.ColumnElement | None = None) -> int:
    """How many runs load_configs would read but for an unknown (NULL) dp, tp, pp or cp: skipped
    as fit data and as layouts to adapt."""
    return read_configs(session, exclude=exclude)[1]


def skipped_note(n: int) -> str | None:
    """The note that says `n` runs with an unknown degree were skipped (None when n is 0)."""
    if not n:
        return None
    return (f"{n} successful run(s) with an unknown parallelism degree (dp, tp, pp or cp not stated) "
            "skipped: not used as fit data nor as layouts to adapt")


class Model:
    """Fits per (gpu_type, framework) over one request's configuration rows, made on demand.

    Built per request from load_configs (the database is the only state; nothing is kept)."""

    def __init__(self, rows: list[dict[str, Any]]):
        self.rows = rows
        self._fits: dict[tuple, Fit] = {}
        self._net: dict[str | None, tuple[float | None, str]] = {}
        self._intra: dict[str | None, float | None] = {}
        self._tables: dict[float | None, tuple[dict[str, Any], dict[int, int]]] = {}
        self._ids = set(map(id, rows))

    def terms_table(self, rows: list[dict[str, Any]], network_gb_s: float | None) -> tuple[dict[str, Any], list[int]]:
        """rows_terms(rows, network_gb_s) for rows of this request, taken from one rows_terms of all its
        rows per network reference (the fit, the anchoring and the evidence cost the same recorded rows)."""
        if network_gb_s not in self._tables:
            table, kept = rows_terms(self.rows, network_gb_s)
            self._tables[network_gb_s] = table, {id(self.rows[i]): j for j, i in enumerate(kept)}
        table, at = self._tables[network_gb_s]
        if not self._ids.issuperset(map(id, rows)):  # not rows of this request
            return rows_terms(rows, network_gb_s)
        pos = [at.get(id(r), -1) for r in rows]
        kept = [i for i, j in enumerate(pos) if j >= 0]
        take = np.array([pos[i] for i in kept], dtype=int)
        return {k: v[take] for k, v in table.items()}, kept

    def network(self, gpu_type: str | None) -> tuple[float | None, str]:
        """network_reference of `gpu_type` over the request's rows (once per GPU type)."""
        if gpu_type not in self._net:
            self._net[gpu_type] = network_reference(self.rows, gpu_type)
        return self._net[gpu_type]

    def intra(self, gpu_type: str | None) -> float | None:
        """Median recorded intra-node all-reduce bus bandwidth (GB/s) of `gpu_type`'s runs, None → catalog."""
        if gpu_type not in self._intra:
            vals = [float(r["ar_intra_gb_s"]) for r in self.rows
                    if r["gpu_type"] == gpu_type and r.get("ar_intra_gb_s")]
            self._intra[gpu_type] = statistics.median(vals) if vals else None
        return self._intra[gpu_type]

    def fit_for(self, gpu_type: str | None, framework: str | None) -> Fit:
        """The fit for a target GPU type and framework: the runs of that pair; else the same
        framework on the GPU type with the most configurations (transferred through the peak and
        link-bandwidth ratios of the catalog, and said so); else one fit of the runs of every framework of
        the same engine family on one GPU type (core.frameworks.engine_family: Megatron-LM,
        Megatron-DeepSpeed, NeMo … share Megatron's tensor- and pipeline-parallel layers; _family_fit),
        the target's GPU type first, then the one with the most configurations, and said so; else the
        prior. Each carry (GPU type, framework) widens the interval ×1.5."""
        key = (gpu_type, framework)
        if key in self._fits:
            return self._fits[key]
        same = [r for r in self.rows if r["gpu_type"] == gpu_type and r["framework"] == framework]
        net = self.network(gpu_type)[0]
        result = fit(same, {"gpu_type": gpu_type, "framework": framework}, net,
                     terms_of=lambda rs: self.terms_table(rs, net))
        if result.status == "prior":
            by_gpu: dict[str, list[dict[str, Any]]] = {}
            for r in self.rows:
                if r["framework"] == framework and r["gpu_type"] != gpu_type:
                    by_gpu.setdefault(r["gpu_type"], []).append(r)
            if by_gpu:
                other = max(by_gpu, key=lambda g: (len(by_gpu[g]), g))
                moved = self._carried(by_gpu[other], other, framework)
                if moved.status == "fitted":
                    moved.reason = (f"{len(same)} configuration(s) of {framework} on {gpu_type}: fitted on "
                                    f"{other} runs and carried to {gpu_type} through the catalog's peak "
                                    "FLOP/s, HBM and link bandwidths")
                    result = moved
        if result.status == "prior":
            result = self._family_fit(gpu_type, framework, len(same)) or result
        self._fits[key] = result
        return result

    def _carried(self, rows: list[dict[str, Any]], gpu_type: str, framework: str | None, carries: int = 1) -> Fit:
        """fit() of `rows` (one GPU type and framework) with the interval widened ×1.5 per carry."""
        net = self.network(gpu_type)[0]
        out = fit(rows, {"gpu_type": gpu_type, "framework": framework}, net,
                  terms_of=lambda rs: self.terms_table(rs, net))
        if out.status == "fitted":
            out.loo_log_q80 *= 1.5 ** carries
            out.loo_log_sigma *= 1.5 ** carries
        return out

    def _family_fit(self, gpu_type: str | None, framework: str | None, n_same: int) -> Fit | None:
        """fit_for's last carry: one fit of the runs of every framework of `framework`'s engine family on one
        GPU type (the target's own runs among them), the target's GPU type first, then the one with the most
        configurations; group["frameworks"] lists the frameworks fitted on (group["framework"] names them).
        None when the family has no such runs that fit."""
        family = engine_family(framework)
        if family is None:
            return None
        by_gpu: dict[str, list[dict[str, Any]]] = {}
        for r in self.rows:
            if r["framework"] and engine_family(r["framework"]) == family:
                by_gpu.setdefault(r["gpu_type"], []).append(r)
        for gpu in sorted(by_gpu, key=lambda g: (g != gpu_type, -len(by_gpu[g]), g)):
            rows = by_gpu[gpu]
            names = sorted({r["framework"] for r in rows})
            if gpu == gpu_type and names == [framework]:
                continue  # the target's own runs alone: fitted above
            label = names[0] if len(names) == 1 else f"{family} family ({', '.join(names)})"
            moved = self._carried(rows, gpu, label, carries=1 if gpu == gpu_type else 2)
            if moved.status == "fitted":
                moved.group["frameworks"] = names
                moved.reason = (f"{n_same} configuration(s) of {framework} on {gpu_type}: fitted on the runs of "
                                f"{label} on {gpu} (one engine family, {family}: its tensor- and pipeline-parallel "
                                "layers)" + ("" if gpu == gpu_type else
                                             f", carried to {gpu_type} through the catalog's peak FLOP/s, HBM and "
                                             "link bandwidths"))
                return moved
        return None

    def predict(self, cfg: dict[str, Any], framework: str | None) -> dict[str, Any]:
        """Prediction for configuration `cfg` (run-record fields, with the target's model, seq_len,
        nodes, gpus_per_node, gpu_type, precision): tokens_per_sec_per_gpu, mfu, step_time_s, the
        step-time breakdown (s), interval [lo, hi] of tokens/s/GPU (the fit's held-out 80 % error;
        recommend.predicted_for widens it for extrapolation), the fit it came from.
        Raises ValueError when the config cannot be costed (unknown GPU, missing seq_len)."""
        out = self.predict_many([cfg], framework)[0]
        if out is None:  # terms() says why
            gpu = hardware.canonical_gpu_type(cfg.get("gpu_type"))
            terms(cfg, network_gb_s=self.network(gpu)[0], intra_bw_recorded=self.intra(gpu))
            raise ValueError("the configuration cannot be costed")
        return out

    def predict_many(self, cfgs: list[dict[str, Any]], framework: str | None) -> list[dict[str, Any] | None]:
        """predict() of each configuration in `cfgs`, computed as arrays (terms_table, step_time) per GPU
        type; None for one predict() refuses."""
        out: list[dict[str, Any] | None] = [None] * len(cfgs)
        by_gpu: dict[str | None, list[int]] = {}
        for i, cfg in enumerate(cfgs):
            by_gpu.setdefault(hardware.canonical_gpu_type(cfg.get("gpu_type")), []).append(i)
        for gpu, idx in by_gpu.items():
            f = self.fit_for(gpu, framework)
            network, bw_source = self.network(gpu)
            intra = self.intra(gpu)
            t, kept = terms_table([cfgs[i] for i in idx], network_gb_s=network, intra_bw_recorded=[intra] * len(idx))
            total, compute, tp, dp, bubble, other = step_time(t, f.params)
            tps = t["tokens_per_gpu"] / total
            mfu = t["model_flops"] / (total * t["peak_flops"])
            lo, hi = math.exp(-f.loo_log_q80), math.exp(f.loo_log_q80)
            # the bandwidth's source is said where the prediction crosses nodes
            shows = ((t["dp_nodes_log2"] != 0) | (t["tp_inter"] != 0)).tolist()
            fit_of = (f.group.get("gpu_type"), f.group.get("framework"), f.status)
            for k, tps_k, mfu_k, total_k, compute_k, bubble_k, tp_k, dp_k, other_k, shows_k in zip(
                    kept, tps.tolist(), mfu.tolist(), total.tolist(), compute.tolist(), bubble.tolist(), tp.tolist(),
                    dp.tolist(), other.tolist(), shows):
                out[idx[k]] = {"tokens_per_sec_per_gpu": tps_k, "mfu": mfu_k, "step_time_s": total_k,
                               "breakdown_s": {"compute": compute_k, "pipeline_bubble": bubble_k, "tp_comm": tp_k,
                                               "dp_comm": dp_k, "other": other_k},
                               "interval": [tps_k * lo, tps_k * hi],
                               "bandwidth_source": bw_source if shows_k else None, "fit": fit_of}
        return out
