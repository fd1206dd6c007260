"""The physical terms of one training step, before any fitted parameter (DESIGN §4, throughput model).

For one configuration on one GPU type this computes, per GPU and per optimizer step: the FLOPs,
the bytes each collective moves, the link bandwidth it moves them over, and the pipeline bubble.
service/analytics/throughput.py turns these terms into a step time with a handful of fitted
parameters. Sources, cited again at each formula:

- [UP]  The Ultra-Scale Playbook (Tazi et al. 2025, https://huggingface.co/spaces/nanotron/ultrascale-playbook):
        "Data Parallelism" (ring all-reduce of the gradients, overlap with the backward pass),
        "ZeRO" (stage 1/2: reduce-scatter + all-gather, same volume as an all-reduce; stage 3: one
        more all-gather of the parameters in the backward pass), "Tensor Parallelism" and
        "Sequence Parallelism" (per layer, forward and backward, two all-reduces — or all-gather +
        reduce-scatter pairs — of the s·b·h activations), "Context Parallelism" (ring attention:
        K/V blocks passed around the ring), "Pipeline Parallelism" (1F1B bubble).
- [NA21] Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
        Using Megatron-LM", arXiv 2104.04473: §2.2 the 1F1B bubble fraction (p−1)/(m+p−1) of the
        step, §3.2 TP communication 4 all-reduces per layer per micro-batch in forward+backward,
        §3.3 the end-to-end FLOPs per iteration 96·B·s·l·h²(1 + s/6h + V/16lh) ≈ (6N + 12·l·h·s)
        per token, and the recomputation's extra forward pass (8N instead of 6N).
- [PaLM] Chowdhery et al. 2022, arXiv 2204.02311, appendix B: model FLOPs per token 6N + 12·L·h·s
        (core.model.flops_per_token, the one copy of that rule).
- [RANKS] The rank order of the process groups: nanotron's ParallelContext lays the world out as
        (ep, pp, dp, cp, tp), TP innermost and PP outermost (huggingface/nanotron
        src/nanotron/parallel/context.py, `parallel_order`); Megatron-Core's default order
        "tp-cp-ep-dp-pp" is the same for dense models. Consecutive ranks share a node.
- NCCL's performance notes (NVIDIA/nccl-tests doc/PERFORMANCE.md): ring all-reduce moves
        2(n−1)/n of the buffer through each GPU's link ("bus bandwidth"); all-gather and
        reduce-scatter (n−1)/n. Recorded bandwidths (nanotron's bench "AllReduce (GB/s)") are
        bus bandwidths and are used as such.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from core import hardware
from core.frameworks import is_nanotron
from core.model import ModelShape, flops_per_token, resolve_shape, stage_split
from core.record import get_field

_BF16 = 2
_FP32 = 4


@dataclass(frozen=True)
class Terms:
    """Per GPU, per optimizer step. FLOPs in FLOP, bytes in bytes, bandwidths in bytes/s.

    hw_flops: FLOPs the GPU executes (model FLOPs, plus the recomputed forward with full
        recompute); model_flops: 6N + 12·L·h·s per token share (for MFU);
    peak_flops: dense peak at the run's precision (hardware catalog);
    mb_tokens: tokens in one micro-batch on one GPU (b·s/cp) — the M of its matmuls;
    h_shard: hidden size over TP — the N/K of its matmuls;
    micro_batches: m = GAS; layers_local: L/pp; pp: pipeline depth;
    tp_bytes, tp_bw: TP collective volume through each GPU's link and the link's bandwidth;
    tp_collectives: how many TP collectives the step launches (each pays a latency: Hockney's
        α–β model, Hockney 1994, "The communication challenge for MPP");
    dp_bytes, dp_bw: DP/ZeRO collective volume and bandwidth; across nodes, the group's share of
        each node's links (dp_ranks_per_node() = k): k / gpus_per_node of the cluster's full-node
        bus bandwidth (terms' network_gb_s; a group with 2 ranks per node gets 2/8 of it);
    dp_nodes_log2: log2 of the nodes the gradient-reduction group spans (0 inside a node): the
        reduction's time grows with it beyond what its bus bandwidth says (the ring's 2(n−1)
        latency-bound steps, NCCL's tree depth log2 n; Thakur et al. 2005), faster than its
        recorded bandwidth says (bench/RESULTS.md, "Measurements behind the throughput terms"), so
        the bandwidth is read once per cluster and this growth is fitted (throughput.py: a_dp_n);
    zero_gather_bytes: ZeRO-1/2's all-gather of the updated bf16 parameter shards after the
        optimizer step — apart from dp_bytes (the gradients' reduce-scatter), as it cannot overlap
        the backward pass as DDP's bucketed reduction does ([UP "ZeRO-1"]: "an all-gather after the
        optimizer step");
    tp_inter: the share of a TP ring all-reduce's 2(t−1) steps that cross the network when the TP group
        spans nodes (tp > gpus_per_node), else 0.0: NCCL's latency model charges the network's latency to
        2·n_nodes of those steps and NVLink's to the rest (NVIDIA/nccl src/graph/tuning.cc,
        ncclTopoTuneModel: ring latency (nsteps − nInterSteps)·intraLat + nInterSteps·interLat,
        nInterSteps = 2·nNodes for an all-reduce) — n_nodes/(t − 1): 2/15 for TP16 over 2 nodes (Hockney's
        α differs per link); the throughput model's α_tp_x is paid on those steps only;
    cp_bytes, cp_bw, pp_bytes, pp_bw: context-parallel ring and pipeline point-to-point traffic;
    pp_messages: point-to-point transfers on the 1F1B critical path, 2·(m + pp − 1) (one forward
        activation and one backward gradient per micro-batch through the pipeline's fill and
        drain: [NA21 §2.2], the same (m + p − 1) slots that give the bubble);
    pp_inter: 1.0 when pipeline neighbours sit on other nodes, else 0.0: PP is the outermost
        dimension of the rank order [RANKS], so some stage boundary crosses nodes as soon as the
        world spans more than one node (a node holds consecutive stages only while dp·cp·tp is
        below gpus_per_node, and the 1F1B critical path runs through every boundary). An
        approximation: every message and all of pp_bytes are then charged to the network, also
        when only some of the p − 1 boundaries cross (2 nodes, dp4 pp4: 1 of 3);
    stage_imbalance: the slowest pipeline stage's FLOPs over the mean stage's, r ≥ 1 (1 without
        PP): stage_imbalance();
    act_elems, logit_elems: elements of the h-wide activations over all layers (tokens·L·h) and of
        the V-wide logits (tokens·V) per GPU per step, the memory-bound elementwise work around the
        matmuls (throughput.py: b_act, b_logit bytes moved per element); per GPU, as TP (with
        sequence parallelism) and PP split them with the tokens; × 4/3 with full recompute (the
        recomputed forward moves them again: forward 1, backward 2, recompute 1);
    score_elems: attention-score elements (tokens·L·a·s, causal half not skipped) per GPU per step
        when the attention core is NOT fused (no FlashAttention, Dao et al. 2022): the s×s scores
        are written, masked, softmaxed (and dropped out) in HBM, [K22 §4.1]'s 5·a·s bytes per token
        per layer of stored activations; 0 with FlashAttention, which keeps them on chip;
    hbm_bw: the GPU's HBM bandwidth, bytes/s (hardware catalog, datasheets), which the
        memory-bound work runs at (the roofline's memory-bound side, Williams et al. 2009);
    opt_params: parameters whose optimizer update this GPU runs: N/(tp·pp), over dp·cp with ZeRO ≥ 1
        (ZeRO §5: each rank steps its own shard) — a memory-bound pass of OPTIMIZER_BYTES each;
    layer_passes: layer forward+backward passes per GPU per step, L/pp × m (× 4/3 with full
        recompute): the unit of the per-layer CPU launch time (throughput.py: LAUNCH_S_PER_LAYER);
    tp_layer_passes: those of the layer passes that run tensor-parallel (layer_passes with tp > 1, else 0):
        the unit of the TP region's own CPU time (throughput.py: TP_LAUNCH_S_PER_LAYER);
    dp_overlap: the share of the last micro-batch's stage time the gradient reduction hides behind: its
        backward, 2/3 of a layer pass (twice the forward's FLOPs [NA21 §3.3]), 3/4 with full recompute (the
        recomputed forward runs inside it); 0 without DP or where the framework reduces after the backward
        (grad_reduce_overlap);
    tokens_per_gpu: global batch tokens / world size.
    """

    hw_flops: float
    model_flops: float
    peak_flops: float
    mb_tokens: float
    h_shard: float
    micro_batches: int
    layers_local: float
    pp: int
    tp_bytes: float
    tp_bw: float
    tp_collectives: float
    tp_ring_steps: float
    tp_in_pipeline: float
    tp_inter: float
    dp_bytes: float
    dp_bw: float
    zero_gather_bytes: float
    cp_bytes: float
    cp_bw: float
    pp_bytes: float
    pp_bw: float
    pp_messages: float
    pp_inter: float
    stage_imbalance: float
    act_elems: float
    logit_elems: float
    score_elems: float
    hbm_bw: float
    opt_params: float
    layer_passes: float
    tp_layer_passes: float
    dp_nodes_log2: float
    dp_overlap: float
    tokens_per_gpu: float
    dp_bw_source: str


def _int(cfg: dict[str, Any], key: str, default: int = 1) -> int:
    value = cfg.get(key)
    return default if value in (None, "") else int(value)


#: the record fields resolve_shape reads (core/model.py)
_SHAPE_FIELDS = ("model_params", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size",
                 "vocab_size", "gated_linear_unit", "tie_word_embeddings")


def model_dims(cfg: dict[str, Any]) -> ModelShape:
    """The model's dims (reported, else inferred from model_params as the memory model does). The
    same dims give the same shape: resolved once per distinct dims (_shape) — a request costs
    thousands of configurations of a handful of models. Callers must not mutate it."""
    return _shape(_dims(cfg))


def _dims(cfg: dict[str, Any]) -> tuple:
    """The record's values of _SHAPE_FIELDS, as get_field reads them."""
    values = tuple(map(cfg.get, _SHAPE_FIELDS))
    # get_field's reading (extra, NaN as None) only where it can differ from the plain values: a record with
    # extra or a float value (the configuration rows and candidates of a request have neither)
    if cfg.get("extra") is not None or any(map(float.__instancecheck__, values)):  # (isinstance(v, float))
        values = tuple(get_field(cfg, k) for k in _SHAPE_FIELDS)
    return values


@functools.lru_cache(maxsize=1024)
def _shape(values: tuple) -> ModelShape:
    return resolve_shape(dict(zip(_SHAPE_FIELDS, values)), [])


def stage_imbalance(model: ModelShape, pp: int, seq: int, framework: str | None) -> float:
    """r = FLOPs of the slowest pipeline stage / mean stage FLOPs (1.0 without PP).

    The stages are split as the framework splits them (core.model.stage_split, the
    one copy of that rule: nanotron's build_model balances its own cost estimate, 4·a·d·h + 3·ffn·h
    per layer against V·h for the lm_head; otherwise Megatron's uniform split of the layers); the
    lm_head runs on the stage the split puts it on (core.model.stage_split: nanotron's walk can leave
    trailing stages without layers, the head then sits before them; Megatron's last stage). Each
    stage's true FLOPs per token, forward and backward, are 6·(layer params) + 12·h·s per layer
    [PaLM appendix B] and 6·V·h for the lm_head. In 1F1B the
    slowest stage sets the pace of the steady state ([NA21 §2.2]; PipeDream, Narayanan et al. 2019,
    SOSP: "the throughput of the pipeline is bounded by its slowest stage"), so a small model with a
    large vocabulary split over many stages runs at the pace of the stage holding the lm_head.
    """
    if pp <= 1:
        return 1.0
    nanotron = is_nanotron(framework)
    layers, head = stage_split(model, pp, balanced=nanotron)
    per_layer = 6.0 * model.layer_params() + 12.0 * model.h * seq
    stage = [n * per_layer for n in layers]
    stage[head] += 6.0 * model.vocab * model.h
    return max(stage) / (sum(stage) / pp)


#: achieved fraction of the catalog's per-GPU network line rate in a full-node all-reduce across nodes,
#: used when no run of the GPU type recorded its all-reduce bandwidth across nodes: the Ultra-Scale
#: sweep's recorded full-node all-reduce bus bandwidth at 2 nodes (median 341 GB/s) over 8 × its 400 Gb/s
#: (50 GB/s) NICs: 0.85. It keeps the PRIOR, fitted with the recorded reference, on the same scale.
CATALOG_NETWORK_EFFICIENCY = 0.85

#: bytes the optimizer step moves per parameter it updates: mixed-precision Adam (Kingma & Ba 2015;
#: Micikevicius et al. 2018, arXiv 1710.03740) reads the fp32 master weight, fp32 gradient and two fp32
#: moments (16 B), writes the master weight and the moments back (12 B) and the bf16 working copy (2 B),
#: and the gradient-norm clipping reads the gradient once more (4 B): 34 B, at HBM speed (memory-bound,
#: about 1 FLOP per byte)
OPTIMIZER_BYTES = 34.0


def grad_reduce_overlap(framework: str) -> float:
    """1.0 where the framework's data-parallel gradient reduction runs behind the LAST micro-batch's
    backward (bucket by bucket, as the backward produces the gradients), else 0.0.

    [UP "Data Parallelism"], "First optimization: overlap gradient synchronization with backward pass" and
    "bucketing"; PyTorch DDP (Li et al. 2020, "PyTorch Distributed", VLDB 13(12) §3.2.3: an all-reduce per
    bucket as soon as its gradients are ready; with gradient accumulation only the micro-batch that
    syncs reduces, no_sync on the others, §3.2.4). nanotron (the default when no framework is named, as
    elsewhere in this module) reduces this way: its DDP comm hook fp32_accum_hook launches each bucket's
    all_reduce_coalesced / reduce_scatter_coalesced asynchronously in the backward of the micro-batch that
    syncs ([NT] optim/gradient_accumulator.py; parallel/data_parallel/utils.py ddp_trigger_sync_in_bwd).
    Megatron-DeepSpeed (vTrain's runs) does not: DeepSpeed's pipeline schedule issues ReduceGrads after
    the last backward (deepspeed/runtime/pipe/schedule.py, TrainSchedule); other frameworks are taken not
    to unless they say so (Megatron-LM's overlap_grad_reduce defaults to False)."""
    return 1.0 if is_nanotron(framework) else 0.0


def dp_ranks_per_node(dp: Any, tp: Any, cp: Any, gpus_per_node: Any) -> Any:
    """How many ranks of one gradient-reduction group share a node: the group is DP × CP (ZeRO and the
    gradient all-reduce run over dp·cp ranks; nanotron's `dp_cp_pg`), and under the rank order [RANKS]
    (TP innermost, then CP, then DP, PP outermost; consecutive ranks on one node) it has
    gpus_per_node / tp ranks on each node — at most dp·cp, at least 1 (TP filling or spanning the
    node). Assumes dp·cp·tp divides, or is a multiple of, gpus_per_node (power-of-two layouts); a
    pipeline stage that straddles a node boundary is not modelled.

    Why it matters: a DP group's all-reduce across nodes moves about twice its buffer through the
    network per node whatever k is — NCCL's ring crosses each node boundary once per channel, its
    tree reduces inside the node first — and spreads it over the links of the group's k GPUs on
    the node (one NIC per GPU, as core/hardware.LINKS assumes: a rail-optimised node). So the
    group's bus bandwidth across nodes is k GPUs' worth of links: k × the catalog's per-GPU
    network bandwidth (at CATALOG_NETWORK_EFFICIENCY), or k / gpus_per_node of a recorded
    full-node all-reduce bandwidth (NVIDIA nccl-tests doc/PERFORMANCE.md, bus bandwidth; the
    Ultra-Scale Playbook's "Data Parallelism" on the all-reduce leaving the node). The recorded
    figure is taken as that of a fixed full-node group — an assumption. Consequence: the network
    time of the gradient reduction per GPU does not fall with TP (its buffer is 1/tp as large, and
    so is its share of the links). The measurements behind it, and what it changed in the fit:
    bench/RESULTS.md, "Measurements behind the throughput terms".
    """
    # (elementwise over arrays of configurations too: the array branch of terms_table)
    return np.where(tp >= gpus_per_node, 1, np.maximum(1, np.minimum(dp * cp, gpus_per_node // tp)))


def world_layout(cfg: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """(dp, tp, pp, cp, gpus_per_node) of a config; dp from the world size when missing."""
    return _world_layout(*map(cfg.get, _LAYOUT_FIELDS))


#: the fields world_layout reads, in _world_layout's argument order
_LAYOUT_FIELDS = ("dp", "tp", "pp", "cp", "gpus_per_node", "nodes")
#: the values _int reads as "not given" (its default)
_UNSET = (None, "")


def _world_layout(dp: Any, tp: Any, pp: Any, cp: Any, gpn: Any, nodes: Any) -> tuple[int, int, int, int, int]:
    """world_layout of a config's dp, tp, pp, cp, gpus_per_node and nodes values (_int's reading: None or ""
    is 1, 8 GPUs per node)."""
    tp = 1 if tp in _UNSET else int(tp)
    pp = 1 if pp in _UNSET else int(pp)
    cp = 1 if cp in _UNSET else int(cp)
    gpn = 8 if gpn in _UNSET else int(gpn)
    dp = dp or max(1, ((1 if nodes in _UNSET else int(nodes)) * gpn) // (tp * pp * cp))
    return int(dp), tp, pp, cp, gpn


#: the numeric inputs of one configuration (_inputs), one array each in _Step
_INPUTS = ("h", "layers", "heads", "kv", "head_dim", "vocab", "layer_params", "dp", "tp", "pp", "cp", "gpn",
           "n_params", "zero", "peak", "mbs", "gas", "seq", "full_recompute", "flash", "stage_imbalance",
           "nvlink_gb_s", "network_gb_s", "hbm_bw", "intra_recorded")


@dataclass(frozen=True)
class _Step:
    """The validated inputs of many configurations (_inputs), one float64 array per field: the model's
    shape (h, layers, heads, kv, head_dim, vocab, one block's parameters), the layout (dp, tp, pp, cp over
    gpn GPUs per node), N parameters, the ZeRO stage, the dense peak (FLOP/s), micro-batch b, GAS m, seq s,
    full recompute and FlashAttention (1.0 / 0.0), the pipeline's stage_imbalance, the GPU's catalog
    NVLink and per-GPU network (GB/s) and HBM bandwidth (bytes/s), the recorded intra-node all-reduce
    bandwidth (GB/s, NaN: none); and the framework's name (lower case) per configuration. The formulas
    below read these arrays elementwise (np.where for a branch), one configuration or thousands alike."""

    h: Any
    layers: Any
    heads: Any
    kv: Any
    head_dim: Any
    vocab: Any
    layer_params: Any
    dp: Any
    tp: Any
    pp: Any
    cp: Any
    gpn: Any
    n_params: Any
    zero: Any
    peak: Any
    mbs: Any
    gas: Any
    seq: Any
    full_recompute: Any
    flash: Any
    stage_imbalance: Any
    nvlink_gb_s: Any
    network_gb_s: Any
    hbm_bw: Any
    intra_recorded: Any
    framework: list[str]

    @property
    def world(self) -> Any:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def tokens_per_gpu(self) -> Any:
        return self.dp * self.mbs * self.gas * self.seq / self.world

    @property
    def layers_local(self) -> Any:
        return self.layers / self.pp

    @property
    def act_bytes(self) -> Any:
        """One micro-batch's b·s·h bf16 activations on one GPU (s/cp with CP)."""
        return self.mbs * self.seq / self.cp * self.h * _BF16


@functools.lru_cache(maxsize=4096)
def _imbalance(dims: tuple, pp: int, seq: int, framework: str | None) -> float:
    """stage_imbalance of the shape of `dims` (_dims), once per distinct (dims, pp, seq, framework): a
    request asks it of thousands of configurations of a handful of models and layouts (a pure function
    of its arguments)."""
    return stage_imbalance(_shape(dims), pp, seq, framework)


@functools.lru_cache(maxsize=1024)
def _shape_values(dims: tuple) -> tuple:
    """(h, layers, heads, kv, head_dim, vocab, one block's parameters, total parameters) of the shape
    of `dims` (_dims), once per distinct dims."""
    m = _shape(dims)
    return m.h, m.layers, m.heads, m.kv, m.head_dim, m.vocab, m.layer_params(), m.total_params()


@functools.lru_cache(maxsize=256)
def _gpu(gpu_type: str | None, precision: str | None) -> tuple[float, float, float, float]:
    """(dense peak FLOP/s at the precision, HBM bytes/s, NVLink and per-GPU network GB/s) of a GPU type from
    the catalog; ValueError naming what the catalog lacks (the catalog is fixed: one look-up per distinct
    pair)."""
    acc = hardware.lookup(gpu_type)
    if acc is None:
        raise ValueError(f"gpu_type: {gpu_type!r} is not in the hardware catalog")
    canonical = hardware.canonical_precision(precision)
    peak_tflops = hardware.peak_tflops(acc.name, canonical)
    if not peak_tflops:  # never costed against another precision's peak
        raise ValueError(f"precision {canonical!r}: the catalog has no {acc.name} peak for it")
    return peak_tflops * 1e12, hardware.hbm_bytes_per_s(acc.name), acc.nvlink_gb_s, acc.network_gb_s


def _inputs(cfg: dict[str, Any], intra_bw_recorded: float | None) -> tuple:
    """The validated inputs of `cfg` in _INPUTS order, and its framework; ValueError naming the missing
    or uncostable field."""
    # (thousands of rows a request: every field read once, world_layout's rule on the values read)
    gpu_type, precision, seq, mbs, gas, framework, flash, params, zero, recompute, *layout = map(cfg.get, _INPUT_FIELDS)
    peak, hbm, nvlink, network = _gpu(gpu_type, precision)
    if not seq:
        raise ValueError("seq_len: required")
    if not mbs or not gas:
        raise ValueError("micro_batch_size and grad_accum_steps: required")
    dims = _dims(cfg)
    shape = _shape_values(dims)
    dp, tp, pp, cp, gpn = _world_layout(*layout)
    flash = True if flash is None else bool(flash) if not isinstance(flash, str) else flash.lower() in ("1", "true")
    return (*shape[:7], dp, tp, pp, cp, gpn, params or shape[7], 0 if zero in _UNSET else int(zero),
            peak, mbs, gas, seq, recompute == "full", flash,
            _imbalance(dims, pp, int(seq), framework), nvlink, network, hbm,
            math.nan if not intra_bw_recorded else intra_bw_recorded), str(framework or "").lower()


#: the fields _inputs reads, world_layout's (_LAYOUT_FIELDS) last
_INPUT_FIELDS = ("gpu_type", "precision", "seq_len", "micro_batch_size", "grad_accum_steps", "framework",
                 "flash_attention", "model_params", "zero_stage", "recompute", *_LAYOUT_FIELDS)


def _flop_terms(st: _Step) -> dict[str, Any]:
    """FLOPs [PaLM][NA21 §3.3]: per token (6N + 12·L·h·s); full recompute adds one forward pass
    (2N + 4·L·h·s: [NA21] "8N instead of 6N"); the work is split evenly over all world GPUs."""
    fpt, _ = flops_per_token(st.n_params, st.layers, st.h, st.seq)
    # ... but the GPU executes the matmuls only: the input embedding is a lookup, so an untied
    # embedding's V·h parameters, which N counts, cost no FLOPs (the lm_head's V·h do) [NA21 §3.3:
    # the logit layer's 6·B·s·h·V, no term for the embedding lookup]
    matmul_params = st.layers * st.layer_params + st.vocab * st.h
    hfpt = np.where(st.full_recompute, flops_per_token(matmul_params, st.layers, st.h, st.seq, recompute_full=True)[0],
                    flops_per_token(matmul_params, st.layers, st.h, st.seq)[0])
    tokens_per_gpu = st.tokens_per_gpu
    return {"hw_flops": hfpt * tokens_per_gpu, "model_flops": fpt * tokens_per_gpu, "peak_flops": st.peak,
            "mb_tokens": st.mbs * st.seq / st.cp, "h_shard": st.h / st.tp, "micro_batches": st.gas,
            "layers_local": st.layers_local, "pp": st.pp, "tokens_per_gpu": tokens_per_gpu,
            "stage_imbalance": st.stage_imbalance}


def _tp_terms(st: _Step, intra: Any, full_node_inter: Any) -> dict[str, Any]:
    """TP [NA21 §3.2][UP "Tensor Parallelism"]: per layer and micro-batch 2 collectives forward,
    2 backward (3 forward with full recompute), each over the b·s·h bf16 activations (s/cp with
    CP); ring all-reduce moves 2(t−1)/t of it through every link (NCCL)."""
    tp, gas, layers_local = st.tp, st.gas, st.layers_local
    n_coll = np.where(st.full_recompute, 6, 4)
    tp_bytes = np.where(tp > 1, n_coll * 2 * (tp - 1) / tp * st.act_bytes * layers_local * gas, 0.0)
    tp_collectives = np.where(tp > 1, n_coll * layers_local * gas, 0.0)
    # a TP group that spans nodes holds every GPU of its nodes: its all-reduce crosses the network
    # over all of the node's links, the bus bandwidth of a full-node all-reduce
    return {"tp_bytes": tp_bytes, "tp_bw": np.where(tp <= st.gpn, intra, full_node_inter),
            "tp_collectives": tp_collectives,
            # a ring all-reduce (or reduce-scatter + all-gather pair) over t ranks takes 2(t−1)
            # sequential steps, each paying the link latency α (Thakur, Rabenseifner & Gropp 2005,
            # IJHPCA 19(1), §4: T = 2(p−1)α + 2(p−1)/p·nβ)
            "tp_ring_steps": tp_collectives * 2 * (tp - 1),
            "tp_in_pipeline": np.where((st.pp > 1) & (tp > 1), 1.0, 0.0),
            "tp_layer_passes": np.where(tp > 1, layers_local * gas * np.where(st.full_recompute, 4.0 / 3.0, 1.0), 0.0),
            # NCCL: 2·n_nodes of the ring's 2(t−1) steps cross the network (tuning.cc, nInterSteps)
            "tp_inter": np.where(tp > st.gpn, (tp // st.gpn) / (tp - 1), 0.0)}


def _dp_terms(st: _Step, full_node_inter: Any, network_gb_s: float | None) -> dict[str, Any]:
    """DP / ZeRO [UP "Data Parallelism", "ZeRO"] over dp·cp ranks, once per step, of the local
    gradients (N/(tp·pp)): volumes, the bandwidth they move at, the optimizer's share."""
    dp, tp, cp, pp, gpn, zero = st.dp, st.tp, st.cp, st.pp, st.gpn, st.zero
    # The gradients' dtype is the accumulation buffer's: nanotron accumulates in fp32 by default and
    # its DDP hook reduces the fp32 buffers [NT optim/gradient_accumulator.py, fp32_accum_hook:
    # all_reduce_coalesced / reduce_scatter_coalesced of the fp32 grads]; other frameworks reduce the
    # bf16 grads unless told otherwise (Megatron grad_reduce_in_fp32=False).
    # ZeRO-0: ring all-reduce, 2(n−1)/n of the buffer; ZeRO-1/2: reduce-scatter, (n−1)/n of it
    # ("replace an all_reduce with a reduce_scatter", ibid.), then after the optimizer step an
    # all-gather of the updated bf16 params, (n−1)/n·2Ψ [UP "ZeRO-1"]; ZeRO-3: reduce-scatter plus
    # the params all-gathered in the forward and again in the backward (ZeRO §7: 1.5× DP's volume)
    n_dp = dp * cp
    local = st.n_params / (tp * pp)
    names = sorted(set(st.framework))  # each framework's rules read once, not per row
    grad_bytes = np.array([_FP32 if is_nanotron(fw) else _BF16 for fw in names])[
        np.searchsorted(names, st.framework)]
    overlaps = np.array([grad_reduce_overlap(fw) for fw in names])[np.searchsorted(names, st.framework)]
    share = np.where(n_dp > 1, (n_dp - 1) / n_dp, 0.0)
    dp_bytes = np.select([zero == 0, zero == 3],
                         [2 * share * local * grad_bytes, share * local * (grad_bytes + 2 * _BF16)],
                         share * local * grad_bytes)
    crosses = tp * cp * dp > gpn
    recorded = ~np.isnan(st.intra_recorded)
    # across nodes, the group's share of its nodes' network links (dp_ranks_per_node): k GPUs' worth
    dp_bw = np.where(crosses, full_node_inter / gpn * dp_ranks_per_node(dp, tp, cp, gpn),
                     np.where(recorded, st.intra_recorded, st.nvlink_gb_s) * 1e9)
    source = np.where(crosses, "recorded network" if network_gb_s else "catalog network",
                      np.where(recorded, "recorded intra-node", "catalog NVLink"))
    return {"dp_bytes": dp_bytes, "dp_bw": dp_bw, "dp_bw_source": source,
            "zero_gather_bytes": np.where((zero == 1) | (zero == 2), share * local * _BF16, 0.0),
            "dp_nodes_log2": np.where(crosses, np.log2(np.where(crosses, tp * cp * dp / gpn, 1.0)), 0.0),
            # the share of the last micro-batch's stage time the bucketed reduction hides behind: its backward,
            # 2/3 of a layer pass, 3/4 with full recompute, where the framework overlaps it (grad_reduce_overlap)
            "dp_overlap": np.where(n_dp > 1, overlaps * np.where(st.full_recompute, 0.75, 2.0 / 3.0), 0.0),
            # each rank steps its own shard under ZeRO ≥ 1 (ZeRO §5)
            "opt_params": local / np.where(zero >= 1, n_dp, 1)}


def _cp_pp_terms(st: _Step, intra: Any) -> dict[str, Any]:
    """Context-parallel ring and pipeline point-to-point traffic."""
    tp, pp, cp, gas = st.tp, st.pp, st.cp, st.gas
    # CP [UP "Context Parallelism"]: ring attention passes each K,V block around the ring,
    # (cp−1) steps of b·(s/cp)·2·kv_dim bf16 per layer forward, twice that backward
    kv_dim = st.kv * st.head_dim
    cp_bytes = np.where(cp > 1, 3 * (cp - 1) * st.mbs * st.seq / cp * 2 * kv_dim * _BF16 * st.layers_local * gas, 0.0)
    # PP [NA21 §2.2]: each micro-batch's activations cross every stage boundary forward and
    # their gradients backward (point-to-point); PP is the outermost rank dimension [RANKS], so a
    # boundary crosses nodes as soon as the world spans more than one node
    pp_inter = (pp > 1) & (st.world > st.gpn)
    network = st.network_gb_s * 1e9
    return {"cp_bytes": cp_bytes, "cp_bw": np.where(tp * cp <= st.gpn, intra, network),
            "pp_bytes": np.where(pp > 1, 2 * st.act_bytes / tp * gas, 0.0),
            "pp_bw": np.where(pp_inter, network, intra),
            # ... and each of those transfers is a blocking send/recv pair on the critical path of
            # 1F1B: 2·(m + p − 1) of them per step, each paying the link's latency (Hockney α–β)
            "pp_messages": np.where(pp > 1, 2.0 * (gas + pp - 1), 0.0), "pp_inter": np.where(pp_inter, 1.0, 0.0)}


def _memory_bound_terms(st: _Step) -> dict[str, Any]:
    """Memory-bound work [throughput.py]: elementwise passes over the h-wide activations and the
    V-wide logits, the unfused attention core's scores (none with FlashAttention: the record's
    flash_attention None or true), the per-layer launches; all at HBM speed."""
    tokens_per_gpu = st.tokens_per_gpu
    redo = np.where(st.full_recompute, 4.0 / 3.0, 1.0)
    return {"act_elems": tokens_per_gpu * st.layers * st.h * redo, "logit_elems": tokens_per_gpu * st.vocab,
            "score_elems": np.where(st.flash, 0.0, tokens_per_gpu * st.layers * st.heads * st.seq / st.cp * redo),
            "hbm_bw": st.hbm_bw, "layer_passes": st.layers_local * st.gas * redo}


def terms_table(cfgs: list[dict[str, Any]], *, network_gb_s: float | None = None,
                intra_bw_recorded: list[float | None] | None = None) -> tuple[dict[str, Any], list[int]]:
    """terms() of many configurations at once: ({Terms field: numpy array over the costed
    configurations}, the indices in `cfgs` of those costed). A configuration terms() would refuse
    (ValueError: a missing field; a degree or dim of 0) is left out. `intra_bw_recorded`: each
    configuration's recorded intra-node bandwidth (GB/s, None: the catalog's), default none."""
    rows, frameworks, kept = [], [], []
    for i, cfg in enumerate(cfgs):
        try:
            values, fw = _inputs(cfg, intra_bw_recorded[i] if intra_bw_recorded is not None else None)
        except (ValueError, ZeroDivisionError):
            continue
        rows.append(values)
        frameworks.append(fw)
        kept.append(i)
    cols = np.array(rows, dtype=float).reshape(len(rows), len(_INPUTS)).T
    st = _Step(**dict(zip(_INPUTS, cols)), framework=frameworks)
    with np.errstate(divide="ignore", invalid="ignore"):  # branches np.where leaves out divide by 0
        # the node's NVLink as the run measured it (its intra-node all-reduce bus bandwidth), else the
        # catalog's: a run whose intra-node collectives crawled pays for it in its TP, CP and pipeline
        # traffic too, not only in its DP all-reduce
        intra = np.where(np.isnan(st.intra_recorded), st.nvlink_gb_s, st.intra_recorded) * 1e9
        # a full-node all-reduce across nodes: recorded, else the catalog's per-GPU link × gpus_per_node
        # at CATALOG_NETWORK_EFFICIENCY
        full_node_inter = (network_gb_s or st.network_gb_s * st.gpn * CATALOG_NETWORK_EFFICIENCY) * 1e9
        out = {**_flop_terms(st), **_tp_terms(st, intra, full_node_inter),
               **_dp_terms(st, full_node_inter, network_gb_s), **_cp_pp_terms(st, intra), **_memory_bound_terms(st)}
        # a configuration with a degree or dim of 0 (terms() divides by it) is not costed
        finite = np.logical_and.reduce([np.isfinite(v) for k, v in out.items() if k != "dp_bw_source"])
    if not finite.all():
        out = {k: v[finite] for k, v in out.items()}
        kept = [i for i, ok in zip(kept, finite) if ok]
    return out, kept


def terms(cfg: dict[str, Any], *, network_gb_s: float | None = None,
          intra_bw_recorded: float | None = None) -> Terms:
    """The step's physical terms for config `cfg` (run-record field names: model_params or dims,
    seq_len, nodes, gpus_per_node, gpu_type, precision, framework, dp, tp, pp, cp, zero_stage,
    micro_batch_size, grad_accum_steps, recompute, flash_attention), phase by phase: FLOPs, TP,
    DP/ZeRO, CP and PP traffic, memory-bound work (terms_table of one configuration).

    network_gb_s: the cluster's full-node all-reduce bus bandwidth across nodes (GB/s), as its runs
    recorded it (throughput.network_reference: nanotron's "AllReduce (GB/s)" at the smallest
    multi-node count); None → the catalog's per-GPU line rate × gpus_per_node ×
    CATALOG_NETWORK_EFFICIENCY. intra_bw_recorded: the intra-node all-reduce bus bandwidth the runs
    measured ("AR Intra-node (GB/s)"); None → the catalog's NVLink. Raises ValueError naming a
    missing field (no seq_len, unknown gpu_type, micro_batch_size or grad_accum_steps missing).
    """
    _inputs(cfg, intra_bw_recorded)  # raises ValueError naming the field
    table, kept = terms_table([cfg], network_gb_s=network_gb_s, intra_bw_recorded=[intra_bw_recorded])
    if not kept:
        raise ZeroDivisionError("a parallelism degree or model dimension of 0")
    one: dict[str, Any] = {k: (str(v[0]) if k == "dp_bw_source" else int(v[0]) if k in ("micro_batches", "pp")
                               else float(v[0])) for k, v in table.items()}
    return Terms(**one)


def as_arrays(rows: list[Terms]) -> dict[str, Any]:
    """Terms of many configurations as numpy arrays (one per field), for the vectorised fit."""
    fields = [f for f in Terms.__dataclass_fields__ if f != "dp_bw_source"]
    return {f: np.array([getattr(t, f) for t in rows], dtype=float) for f in fields}
