"""A recorded run of the same layout with no less memory per GPU shows a configuration fits, whatever
the memory model's absolute figure (service/analytics/fits.fit_shown): /predict says so and names the
run; a larger micro-batch, another ZeRO stage under PP or another framework is not shown by it. Both
backends (the `client` fixture)."""

from __future__ import annotations

from service.analytics.memory import estimate_memory

DIMS = {"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 32, "ffn_hidden_size": 14336,
        "vocab_size": 131072}
TARGET = {"model_params": 8_860_000_000, "gpu_type": "H100-SXM-80GB", "seq_len": 4096, "gpus_per_node": 8,
          "framework": "nanotron", "precision": "bf16", **DIMS}
#: 8.86B, TP1 PP4 ZeRO-1 MBS2 on one node (DP2): the layout of the sweep's 8.86B PP4 runs that ran at
#: 75–77 GiB reserved, which the memory model prices above the usable memory
RAN = {**TARGET, "nodes": 1, "dp": 2, "tp": 1, "pp": 4, "cp": 1, "zero_stage": 1, "micro_batch_size": 2,
       "grad_accum_steps": 128, "recompute": "none"}


def _predict(client, **change):
    body = {**TARGET, "nodes": 2, "dp": 4, "tp": 1, "pp": 4, "cp": 1, "zero_stage": 1, "micro_batch_size": 2,
            "grad_accum_steps": 64, "recompute": "none", **change}
    r = client.post("/api/v1/predict", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_recorded_run_shows_a_layout_fits_at_twice_the_nodes(client):
    on_two = {**RAN, "nodes": 2, "dp": 4, "grad_accum_steps": 64}
    assert estimate_memory(on_two).fits is False, "precondition: the memory model says it does not fit"
    before = _predict(client)
    assert before["fits"] is False and before["memory"]["fit_shown_by_run_id"] is None
    stored = client.post("/api/v1/runs", json={"runs": [{**RAN, "source": "api", "run_key": "ran-pp4",
                                                          "status": "success", "tokens_per_sec_per_gpu": 5000.0}]})
    assert stored.status_code == 201, stored.text
    run_id = client.get("/api/v1/runs", params={"limit": 5}).json()["runs"][0]["id"]
    after = _predict(client)
    assert after["fits"] is True
    assert after["memory"]["fit_shown_by_run_id"] == run_id and after["memory"]["p_fits"] == 1.0
    assert f"fits: run #{run_id}" in after["why"]
    # a run shows only what needs no more memory than it did
    assert _predict(client, micro_batch_size=4, grad_accum_steps=32)["fits"] is False  # larger micro-batch
    assert _predict(client, dp=2, nodes=1, grad_accum_steps=128)["memory"]["fit_shown_by_run_id"] is None  # it ran
    assert _predict(client, zero_stage=0)["fits"] is False  # ZeRO-0: the optimizer unsharded
    assert _predict(client, framework="Megatron-LM")["memory"]["fit_shown_by_run_id"] is None
