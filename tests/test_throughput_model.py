"""Unit checks of the throughput model's physical terms (service/analytics/throughput_terms.py) and of
which configurations its fit uses (service/analytics/throughput.competitive)."""

from __future__ import annotations

import pytest

from service.analytics import throughput as th
from service.analytics import throughput_terms as tt

#: a 1.34B-like Llama block with a large vocabulary (its lm_head weighs several layers)
DIMS = {"hidden_size": 2048, "num_layers": 16, "num_heads": 32, "num_kv_heads": 32, "ffn_hidden_size": 8192,
        "vocab_size": 131072, "tie_word_embeddings": True}


def _cfg(**over: object) -> dict:
    cfg = {**DIMS, "model_params": 1_340_000_000, "seq_len": 4096, "nodes": 1, "gpus_per_node": 8,
           "gpu_type": "H100-SXM-80GB", "precision": "bf16", "framework": "nanotron", "dp": 8, "tp": 1, "pp": 1,
           "cp": 1, "zero_stage": 0, "micro_batch_size": 1, "grad_accum_steps": 32}
    cfg.update(over)
    return cfg


def test_stage_imbalance_follows_the_stage_holding_the_lm_head():
    model = tt.model_dims(_cfg())
    assert tt.stage_imbalance(model, 1, 4096, "nanotron") == 1.0
    # Megatron's uniform split: 4 layers per stage, the last one also runs the lm_head
    per_layer = 6.0 * model.layer_params() + 12.0 * model.h * 4096
    head = 6.0 * model.vocab * model.h
    stages = [4 * per_layer] * 3 + [4 * per_layer + head]
    assert tt.stage_imbalance(model, 4, 4096, "megatron-lm") == pytest.approx(max(stages) / (sum(stages) / 4))
    # nanotron gives the first stages more layers to balance the head: closer to even, never below 1
    balanced = tt.stage_imbalance(model, 4, 4096, "nanotron")
    assert 1.0 <= balanced < tt.stage_imbalance(model, 4, 4096, "megatron-lm")


def test_an_uneven_pipeline_is_predicted_slower_than_its_even_twin():
    """Same terms but for r: the step grows by the slowest stage's excess over the steady state."""
    t = tt.terms(_cfg(dp=2, pp=4, micro_batch_size=1, grad_accum_steps=128))
    assert t.stage_imbalance > 1.0
    even = tt.Terms(**{**t.__dict__, "stage_imbalance": 1.0})
    slow, fast = th.step_time(t, th.PRIOR)[0], th.step_time(even, th.PRIOR)[0]
    assert slow > fast


def test_the_input_embedding_costs_no_flops():
    """An untied embedding adds V·h parameters (N) but no matmul: the executed FLOPs are those of
    the tied model, while the model FLOPs (MFU's numerator, 6N + 12·L·h·s) count N."""
    tied = tt.terms(_cfg())
    untied = tt.terms(_cfg(tie_word_embeddings=False, model_params=1_340_000_000 + 131072 * 2048))
    assert untied.hw_flops == pytest.approx(tied.hw_flops)
    assert untied.model_flops > tied.model_flops


def test_the_fit_keeps_the_configurations_that_compete_in_their_cell():
    def row(nodes: int, tps: float, mbs: int) -> dict:
        # one global batch per node count (dp · mbs · gas), as a sweep's cell has
        return _cfg(nodes=nodes, dp=8 * nodes, micro_batch_size=mbs, grad_accum_steps=8 // mbs,
                    tokens_per_sec_per_gpu=tps)

    rows = [row(1, 40_000, 1), row(1, 39_000, 2), row(1, 20_000, 4),   # the last: half its cell's best
            row(2, 30_000, 1), row(2, 29_000, 2)]
    kept = th.competitive([(r, tt.terms(r)) for r in rows])
    assert [(r["nodes"], r["micro_batch_size"]) for r, _ in kept] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    # a cell's best is always kept, however slow against other cells
    assert (2, 1) in {(r["nodes"], r["micro_batch_size"]) for r, _ in kept}


def test_recommend_weighs_a_tight_fit_by_its_odds():
    """p_fits: the memory model's held-out log error as a log-normal spread around its prediction."""
    from types import SimpleNamespace

    from service.analytics import recommend as rec

    def mem(peak: float) -> SimpleNamespace:
        return SimpleNamespace(usable_memory_gib=78.4, predicted_peak_memory_gib=peak)

    assert rec.p_fits(mem(78.4), None) == pytest.approx(0.5)
    assert rec.p_fits(mem(40.0), None) > rec.p_fits(mem(70.0), None) > rec.p_fits(mem(90.0), None)
    assert rec.p_fits(mem(90.0), {"first_id": 1}) == 1.0   # it ran on this very target
    assert rec.p_fits(SimpleNamespace(usable_memory_gib=None, predicted_peak_memory_gib=50.0), None) == 1.0


def test_the_lm_head_sits_where_nanotrons_walk_puts_it():
    """nanotron's build_model walks the blocks in order: when its split leaves trailing stages
    without layers (16 layers over 8 stages: 3/2/3/2/3/2/1/0), the lm_head stays on the stage the walk
    reached after the last layer (stage 6), and that stage — one layer plus the head — sets the pace."""
    from core.model import stage_split

    model = tt.model_dims(_cfg())
    split, head = stage_split(model, 8, balanced=True)
    assert split[-1] == 0 and split[head] > 0 and all(n == 0 for n in split[head + 1:])
    per_layer = 6.0 * model.layer_params() + 12.0 * model.h * 4096
    stages = [n * per_layer for n in split]
    stages[head] += 6.0 * model.vocab * model.h
    assert tt.stage_imbalance(model, 8, 4096, "nanotron") == pytest.approx(max(stages) / (sum(stages) / 8))
    assert stage_split(model, 8, balanced=False)[1] == 7 and stage_split(model, 1, balanced=True)[1] == 0


def test_the_memory_model_keeps_the_lm_head_on_its_stage():
    """The memory model puts the lm_head's parameters where the split puts the head (stage 6 of 8 for
    16 layers), not on the empty last stage, which holds only the fp32 cast and the loss."""
    from service.analytics.memory import estimate_memory

    est = estimate_memory(_cfg(dp=1, pp=8, micro_batch_size=1, grad_accum_steps=64))
    head, empty = est.stage_breakdowns["stage 6"]["params"], est.stage_breakdowns["last"]["params"]
    one_layer_stage = est.stage_breakdowns["stage 5"]["params"]  # 2 layers, no head
    assert head > one_layer_stage and empty < one_layer_stage


def _ranks_per_node_by_layout(dp: int, tp: int, cp: int, pp: int, gpn: int) -> int:
    """The fewest ranks any DP×CP group has on a node, laid out as nanotron does: world ranks reshaped
    to (pp, dp, cp, tp), consecutive ranks on one node."""
    import numpy as np

    ranks = np.arange(pp * dp * cp * tp).reshape(pp, dp, cp, tp)
    groups = ranks.transpose(0, 3, 1, 2).reshape(pp * tp, dp * cp)  # per (pp, tp) rank: its dp×cp group
    return min(min(np.unique(g // gpn, return_counts=True)[1]) for g in groups)


@pytest.mark.parametrize("dp,tp,cp,pp", [(64, 1, 1, 1), (16, 4, 1, 1), (8, 2, 2, 2), (4, 2, 4, 1), (8, 8, 1, 1),
                                         (2, 16, 1, 1), (2, 1, 1, 4), (16, 1, 2, 2), (4, 4, 2, 2)])
def test_dp_ranks_per_node_follows_the_rank_order(dp: int, tp: int, cp: int, pp: int):
    """TP innermost, then CP, DP, PP outermost [nanotron ParallelContext, Megatron-Core]: the gradient
    group (DP × CP) has gpus_per_node / tp ranks per node, at most dp·cp."""
    assert tt.dp_ranks_per_node(dp=dp, tp=tp, cp=cp, gpus_per_node=8) == _ranks_per_node_by_layout(dp, tp, cp, pp, 8)


@pytest.mark.parametrize("recorded", [None, 341.0])
def test_the_dp_all_reduce_across_nodes_does_not_shrink_with_tp(recorded: float | None):
    """Across nodes a DP group gets its ranks' share of each node's network links: with TP 4 the
    gradient buffer per GPU is 1/4 as large and so is the group's bandwidth, so the network time of
    the gradient reduction is the same as with TP 1 (but for the ring's (n−1)/n share)."""
    def dp_time(nodes: int = 8, **over: object) -> float:
        t = tt.terms(_cfg(nodes=nodes, **over), network_gb_s=recorded)
        return t.dp_bytes / t.dp_bw

    tp1, tp4 = dp_time(dp=64, tp=1), dp_time(dp=16, tp=4)
    assert tp4 == pytest.approx(tp1 * (15 / 16) / (63 / 64))
    # inside one node NVLink carries it: the buffer's 1/tp shows in full
    assert dp_time(dp=2, tp=4, nodes=1) < dp_time(dp=8, tp=1, nodes=1) / 3


def test_pipeline_neighbours_cross_nodes_once_the_world_spans_nodes():
    """PP is the outermost rank dimension: on 8 nodes, dp32 pp2 puts its two stages on other nodes."""
    assert tt.terms(_cfg(nodes=8, dp=32, pp=2, grad_accum_steps=8)).pp_inter == 1.0
    assert tt.terms(_cfg(nodes=1, dp=4, pp=2, grad_accum_steps=64)).pp_inter == 0.0
    assert tt.terms(_cfg(nodes=8)).pp_inter == 0.0  # no pipeline


def test_a_plain_mlp_has_two_matrices_and_a_gated_one_three():
    """gated_linear_unit (Megatron-Core's name): GPT-3 175B's dims with GPT's plain GELU MLP (ffn = 4h)
    give its published 175B; the same dims read as a gated MLP would count a third matrix."""
    from core.model import resolve_shape

    gpt3 = {"num_layers": 96, "hidden_size": 12288, "num_heads": 96, "num_kv_heads": 96, "ffn_hidden_size": 4 * 12288,
            "vocab_size": 50257, "tie_word_embeddings": True}
    plain = resolve_shape({**gpt3, "gated_linear_unit": False}, [])
    gated = resolve_shape({**gpt3, "gated_linear_unit": True}, [])
    assert plain.total_params() == pytest.approx(175e9, rel=0.01)
    assert gated.total_params() - plain.total_params() == 96 * 12288 * 4 * 12288
    notes: list[str] = []
    assert resolve_shape(gpt3, notes).gated is True and any("gated_linear_unit" in n for n in notes)
    # the throughput model executes the plain MLP's FLOPs, not the gated one's
    cfg = {**gpt3, "model_params": 175_000_000_000, "seq_len": 2048, "nodes": 64, "gpus_per_node": 8,
           "gpu_type": "A100-SXM-80GB", "precision": "fp16", "dp": 8, "tp": 8, "pp": 8, "micro_batch_size": 1,
           "grad_accum_steps": 192}
    plain_flops = tt.terms({**cfg, "gated_linear_unit": False}).hw_flops
    assert plain_flops < tt.terms({**cfg, "gated_linear_unit": True}).hw_flops


def test_tp_latency_grows_with_the_ring_and_with_the_pipeline():
    """A ring all-reduce over t ranks takes 2(t−1) latency-bound steps (Thakur et al. 2005); a stage that
    also runs pipeline sends pays alpha_tp_pp on each (the sweep's TP×PP layouts)."""
    t2, t8 = tt.terms(_cfg(dp=4, tp=2)), tt.terms(_cfg(dp=1, tp=8))
    assert t2.tp_ring_steps / t2.tp_collectives == 2 and t8.tp_ring_steps / t8.tp_collectives == 14
    assert t8.tp_in_pipeline == 0 and tt.terms(_cfg(dp=2, tp=2, pp=2)).tp_in_pipeline == 1
    assert tt.terms(_cfg(dp=4, pp=2)).tp_in_pipeline == 0  # no TP, nothing to pay
    p = dict(th.PRIOR)
    flat, piped = tt.terms(_cfg(dp=4, tp=2)), tt.terms(_cfg(dp=2, tp=2, pp=2, grad_accum_steps=64))
    assert th.step_time(piped, {**p, "alpha_tp_pp": 1e-3})[2] > th.step_time(piped, {**p, "alpha_tp_pp": 0.0})[2]
    assert th.step_time(flat, {**p, "alpha_tp_pp": 1e-3})[2] == th.step_time(flat, {**p, "alpha_tp_pp": 0.0})[2]


def test_tp_across_nodes_gets_the_nodes_links_not_one_nic():
    """A TP group spanning nodes holds every GPU of its nodes: its all-reduce runs at the full-node
    network bandwidth (recorded, else the catalog's per-GPU line rate × gpus_per_node × efficiency)."""
    t = tt.terms(_cfg(nodes=2, dp=1, tp=16, grad_accum_steps=256))
    # NCCL's latency model: 2·n_nodes of the ring's 2(t−1) steps cross the network (4 of 30 here)
    assert t.tp_inter * t.tp_ring_steps == pytest.approx(2 * 2 * t.tp_collectives)
    assert tt.terms(_cfg(nodes=4, dp=1, tp=32, grad_accum_steps=256)).tp_inter == pytest.approx(4 / 31)
    assert tt.terms(_cfg(dp=1, tp=8)).tp_inter == 0.0
    assert t.tp_bw == pytest.approx(50e9 * 8 * tt.CATALOG_NETWORK_EFFICIENCY)
    assert tt.terms(_cfg(nodes=2, dp=1, tp=16, grad_accum_steps=256), network_gb_s=300.0).tp_bw == pytest.approx(300e9)


def test_memory_bound_work_runs_at_the_catalogs_hbm_bandwidth():
    """The elementwise work, an unfused attention core's scores and the optimizer update are priced in
    bytes at the GPU's HBM bandwidth: the same step costs more on an A100 (2.0 TB/s) than on an H100 (3.35)."""
    from core import hardware

    h100, a100 = tt.terms(_cfg()), tt.terms(_cfg(gpu_type="A100-SXM-80GB"))
    assert h100.hbm_bw == hardware.hbm_bytes_per_s("H100-SXM-80GB") == 3.35e12
    assert a100.hbm_bw == pytest.approx(2.039e12)
    assert h100.score_elems == 0  # FlashAttention unless the record says otherwise
    unfused = tt.terms(_cfg(flash_attention=False))
    assert unfused.score_elems == pytest.approx(unfused.tokens_per_gpu * 16 * 32 * 4096)
    # ZeRO-1 shards the optimizer update over DP
    assert tt.terms(_cfg(zero_stage=1)).opt_params == pytest.approx(tt.terms(_cfg()).opt_params / 8)


def test_the_network_reference_is_the_smallest_multi_node_reading():
    """The recorded all-reduce bandwidth halves with each doubling of nodes on the sweep (a latency-bound
    test message): the cluster's bandwidth is read where it is least latency-bound."""
    rows = [{"gpu_type": "H100-SXM-80GB", "nodes": n, "allreduce_gb_s": bw}
            for n, bw in ((1, 450.0), (2, 340.0), (2, 350.0), (4, 160.0), (8, 95.0))]
    bw, how = th.network_reference(rows, "H100-SXM-80GB")
    assert bw == 345.0 and "2 nodes" in how
    assert th.network_reference(rows, "A100-SXM-80GB")[0] is None


def test_the_interval_widens_with_the_distance_to_the_nearest_run_of_the_layout():
    from service.analytics.anchor import SUPPORT_DISTANCE, UNSUPPORTED_LOWER, interval_halves

    near, far = interval_halves(0.05, 1.0, 0.0), interval_halves(0.05, 1.0, 1.5)
    assert near == (0.05, 0.05) and far[0] > near[0] and far[1] > near[1]
    assert interval_halves(0.05, 0.25, 0.0)[0] == pytest.approx(0.025)  # evidence left a quarter of the variance
    lower, upper = interval_halves(0.05, 1.0, None)  # never recorded: unsupported
    assert lower >= UNSUPPORTED_LOWER > upper
    assert interval_halves(0.05, 1.0, SUPPORT_DISTANCE + 0.1)[0] >= UNSUPPORTED_LOWER


def test_a_cell_is_one_target_at_one_global_batch():
    """cell_key includes the tokens per optimizer step: a configuration at half the global batch
    competes in its own cell (it is its best there), not against the full-batch runs."""
    full = _cfg(micro_batch_size=1, grad_accum_steps=32, tokens_per_sec_per_gpu=40_000)
    half = _cfg(micro_batch_size=1, grad_accum_steps=16, tokens_per_sec_per_gpu=20_000)
    assert th.global_batch_tokens(full) == 8 * 1 * 32 * 4096
    assert th.cell_key(full) != th.cell_key(half)
    kept = th.competitive([(r, tt.terms(r)) for r in (full, half)])
    assert len(kept) == 2


def test_a_pathologically_slow_run_anchors_nothing():
    """anchor.evidence_rows: a run below ANCHOR_FRACTION of its cell's best is not evidence; one
    above it is; rows without a measurement are never evidence."""
    from service.analytics import anchor

    best = _cfg(micro_batch_size=1, tokens_per_sec_per_gpu=40_000)
    ok = _cfg(micro_batch_size=2, grad_accum_steps=16, tokens_per_sec_per_gpu=0.6 * 40_000)
    hung = _cfg(micro_batch_size=4, grad_accum_steps=8, tokens_per_sec_per_gpu=0.4 * 40_000)
    unmeasured = _cfg(micro_batch_size=8, grad_accum_steps=4, tokens_per_sec_per_gpu=None)
    kept = anchor.evidence_rows([best, ok, hung, unmeasured])
    assert [r["micro_batch_size"] for r in kept] == [1, 2]


def test_a_small_models_narrow_matmuls_wait_for_the_cpus_kernel_launches():
    """A 350M GPT-like model on 8 A100s at TP8 and one 1,024-token sequence per micro-batch: a layer pass is
    shorter on the GPU (its TP collectives included) than the CPU's launches (κ = 0.6 ms for 60 kernels, and
    κ_tp for the TP region), so the step is at least the CPU's time; the 1.34B model at TP1 and 4,096 tokens
    is GPU-bound and its step barely notices the CPU."""
    assert th.LAUNCH_S_PER_LAYER == pytest.approx(th.KERNELS_PER_LAYER_PASS * th.KERNEL_DISPATCH_S)
    k = th.LAUNCH_SMOOTHING
    small = tt.terms(_cfg(hidden_size=1024, num_layers=24, num_heads=16, num_kv_heads=16, ffn_hidden_size=4096,
                          vocab_size=50257, model_params=355_000_000, gated_linear_unit=False, seq_len=1024,
                          gpu_type="A100-SXM-80GB", framework="megatron-lm", dp=1, tp=8, grad_accum_steps=64))
    p = dict(th.PRIOR)
    cpu = th.LAUNCH_S_PER_LAYER * small.layer_passes + th.TP_LAUNCH_S_PER_LAYER * small.tp_layer_passes
    _, compute, tp, _, _, _ = th.step_time(small, p)
    busy = compute + tp  # the smooth maximum of the GPU's time (its TP collectives with it) and the CPU's
    assert cpu > (busy ** k - cpu ** k) ** (1 / k)  # the CPU's launches take longer than the GPU's work
    big = tt.terms(_cfg())
    compute = th.step_time(big, p)[1]
    assert compute < 1.01 * (compute ** k - (th.LAUNCH_S_PER_LAYER * big.layer_passes) ** k) ** (1 / k)


def test_a_tensor_parallel_layer_at_micro_batch_1_waits_for_the_cpu_whatever_the_tp_degree(monkeypatch):
    """κ_tp (throughput.TP_LAUNCH_S_PER_LAYER), the CPU time of a TP layer's autograd functions and collective
    calls, is a floor under the GPU's work and its TP collectives: the 1.34B model at micro-batch 1 on 8 H100s
    takes the floor's time per layer pass at TP4 and TP8 alike — the sweep's TP2–TP8 layouts at micro-batch 1
    run at one pace whatever the TP degree, where the GPU's share of the work halves and the ring's 2(t−1)
    steps grow. Without the floor both would be predicted faster than it; TP1 has no TP region to pay for, and
    micro-batch 16 gives the GPU enough work to hide it."""
    p = dict(th.PRIOR)
    floor = th.LAUNCH_S_PER_LAYER + th.TP_LAUNCH_S_PER_LAYER

    def per_pass(t: tt.Terms) -> float:
        _, compute, tp, _, _, _ = th.step_time(t, p)
        return (compute + tp) / t.layer_passes

    tp4, tp8 = tt.terms(_cfg(dp=2, tp=4, grad_accum_steps=128)), tt.terms(_cfg(dp=1, tp=8, grad_accum_steps=256))
    wide = tt.terms(_cfg(dp=1, tp=8, micro_batch_size=16, grad_accum_steps=16))
    assert tp8.tp_layer_passes == tp8.layer_passes and tt.terms(_cfg()).tp_layer_passes == 0
    assert tt.terms(_cfg(recompute="full", dp=1, tp=8)).tp_layer_passes == pytest.approx(4 / 3 * 16 * 32)
    with_floor = per_pass(tp4), per_pass(tp8), per_pass(wide)
    assert min(with_floor[:2]) >= floor and with_floor[1] == pytest.approx(with_floor[0], rel=0.02)
    monkeypatch.setattr(th, "TP_LAUNCH_S_PER_LAYER", 0.0)
    assert per_pass(tp4) < floor and per_pass(tp8) < floor
    assert per_pass(wide) == pytest.approx(with_floor[2], rel=1e-3)
    assert th.step_time(tt.terms(_cfg()), p)[0] == th.step_time(tt.terms(_cfg()), th.PRIOR)[0]


def test_the_gradient_reduction_hides_behind_the_last_backward_where_the_framework_overlaps_it():
    """nanotron reduces the gradients bucket by bucket during the last micro-batch's backward
    (throughput_terms.grad_reduce_overlap): only what outlasts that backward is exposed, so its DP term
    is below the same reduction taken after the backward (as Megatron-DeepSpeed takes it), by no more
    than the window (2/3 of one micro-batch's stage time), and a layout without DP has nothing to hide."""
    over = {"nodes": 8, "dp": 64, "grad_accum_steps": 4}
    nano = tt.terms(_cfg(**over))
    after = tt.terms(_cfg(framework="Megatron-DeepSpeed", **over))
    assert nano.dp_overlap == pytest.approx(2 / 3) and after.dp_overlap == 0.0
    assert tt.terms(_cfg(dp=1, tp=8, grad_accum_steps=256)).dp_overlap == 0.0
    assert tt.terms(_cfg(recompute="full", **over)).dp_overlap == pytest.approx(3 / 4)
    _, compute, _, dp_nano, _, _ = th.step_time(nano, th.PRIOR)
    # the same terms with the reduction taken after the backward: the overlap alone
    _, _, _, dp_after, _, _ = th.step_time({**nano.__dict__, "dp_overlap": 0.0}, th.PRIOR)
    window = (2 / 3) * compute / nano.micro_batches
    assert dp_after - window <= dp_nano < dp_after
