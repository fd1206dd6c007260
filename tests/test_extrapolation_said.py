"""/recommend and /suggest say, per answer row, when the prediction extrapolates and from what (issue 25
item 3), on the shipped nanotron sample (the Ultra-Scale Playbook sweep, 1.34B, 1–4 H100 nodes), on
both backends; and the CLI's lines for it."""

from __future__ import annotations

from service.analytics.anchor import SUPPORT_DISTANCE
from service.cli.render import extrapolation_lines

TARGET = {"model_params": "1.34B", "gpu_type": "H100", "seq_len": 4096, "global_batch_tokens": 1_048_576}


def test_recommend_beyond_the_recorded_nodes_says_it_extrapolates(nanotron_client):
    """8 nodes: the sample stops at 4. Every candidate says so, with the fitted range; a candidate whose
    exact layout has no run within the support distance is unsupported and says that too."""
    r = nanotron_client.get("/api/v1/recommend", params={**TARGET, "nodes": 8, "k": 10})
    assert r.status_code == 200, r.text
    cands = r.json()["candidates"]
    assert cands
    for c in cands:
        assert c["extrapolates"] is True
        assert any("8 nodes" in x and "1–4" in x for x in c["extrapolation"]), c["extrapolation"]
        d = c["evidence_distance"]
        assert c["supported"] is (d is not None and d <= SUPPORT_DISTANCE)
        assert (not c["supported"]) is any("no run of this exact layout" in x or "no recorded run" in x
                                           for x in c["extrapolation"]), c


def test_recommend_inside_the_recorded_range_interpolates(nanotron_client):
    """2 nodes lie inside the sample's 1–4: no candidate names the node count as a reason, and a
    supported candidate of a recorded layout family does not extrapolate at all."""
    cands = nanotron_client.get("/api/v1/recommend", params={**TARGET, "nodes": 2, "k": 10}).json()["candidates"]
    assert cands
    assert not any("nodes, outside" in x for c in cands for x in c["extrapolation"])
    plain = [c for c in cands if c["supported"]]
    assert plain and all(c["extrapolates"] is False and c["extrapolation"] == [] for c in plain)


def test_suggest_says_it_extrapolates(nanotron_client):
    r = nanotron_client.get("/api/v1/suggest", params={**TARGET, "nodes": 16, "n": 3})
    assert r.status_code == 200, r.text
    sugg = r.json()["suggestions"]
    assert sugg and all(any("16 nodes" in x and "1–4" in x for x in s["extrapolation"]) for s in sugg)


def test_cli_lines_name_shared_reasons_once():
    rows = [{"extrapolation": ["64 nodes, outside", "far"]}, {"extrapolation": ["64 nodes, outside"]},
            {"extrapolation": ["64 nodes, outside", "never"]}]
    assert extrapolation_lines(rows) == ["  extrapolates (every row): 64 nodes, outside", "  #1 extrapolates: far",
                                         "  #3 extrapolates: never"]
    assert extrapolation_lines([{"extrapolation": []}, {}]) == []


def test_a_precision_never_recorded_is_said_only_where_the_framework_ran(nanotron_client):
    """The sample is nanotron in bf16: asked in fp8, the answer says no nanotron run in fp8 is recorded and the model
    carries its bf16 fit; asked for a framework with no run at all, it says that instead (and where its fit comes
    from), not a precision note about runs that do not exist."""
    notes = nanotron_client.get("/api/v1/recommend", params={**TARGET, "nodes": 2, "precision": "fp8",
                                                             "framework": "nanotron"}).json()["notes"]
    assert any("no successful run of nanotron on H100-SXM-80GB in fp8" in n for n in notes), notes
    notes = nanotron_client.get("/api/v1/recommend", params={**TARGET, "nodes": 2, "precision": "fp8",
                                                             "framework": "torchtitan"}).json()["notes"]
    assert any("framework 'torchtitan': no successful run of it is recorded" in n for n in notes), notes
    assert not any("no successful run of torchtitan on" in n for n in notes), notes
