"""`scalebook import nanotron|table` and `scalebook push` against a live API, on both backends:
every file in the shared data, stored/rejected counts, the rejects file, and re-runs that store
nothing new. Expected rejects are computed from the CSV independently of our parsers."""

from __future__ import annotations

import csv
import json

from typer.testing import CliRunner

from service.cli import app

runner = CliRunner()

#: the shipped nanotron files are the Ultra-Scale Playbook sweep, run on H100 SXM (the files do not say)
NANOTRON = ("import", "nanotron", "--gpu-type", "H100-SXM-80GB")


def cli_json(*args, code: int = 0) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def data_rows(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def expected_table_rejects(rows) -> int:
    """Rows whose published TP·PP·CP·DP differs from the published GPU count (the invariant the
    server enforces), computed from the raw columns (blank TP/PP/CP = 1)."""
    bad = 0
    for r in rows:
        if r["num_gpus"] and r["dp"]:
            product = int(r["dp"])
            for k in ("tp", "pp", "cp"):
                product *= int(r[k] or 1)
            bad += product != int(r["num_gpus"])
    return bad


def published_files(data_dir):
    files = sorted((data_dir / "published").glob("*.csv"))
    assert len(files) >= 10
    return files


def test_import_every_published_table_twice(live_api, data_dir, tmp_path):
    total_stored = 0
    for path in published_files(data_dir):
        rows = data_rows(path)
        rejects = tmp_path / f"{path.stem}.rejects.csv"
        want_rejected = expected_table_rejects(rows)
        code = 1 if want_rejected else 0  # an importer that rejected anything exits 1
        first = cli_json("import", "table", str(path), "--rejects", str(rejects), code=code)
        assert first["read"] == len(rows), path.name
        assert first["rejected"] == want_rejected, path.name
        assert first["stored"] == len(rows) - want_rejected, path.name
        if want_rejected:
            with open(rejects, newline="") as fh:
                written = list(csv.DictReader(fh))
            assert len(written) == want_rejected
            assert all("world_size" in r["reason"] and r["row"] for r in written)
        else:
            assert not rejects.exists()
        again = cli_json("import", "table", str(path), "--rejects", str(rejects), code=code)
        assert (again["stored"], again["already_present"]) == (0, first["stored"]), path.name
        total_stored += first["stored"]
    health = runner.invoke(app, ["heatmap", "--json"])
    assert health.exit_code == 0
    import httpx

    assert httpx.get(f"{live_api}/api/v1/runs", params={"limit": 1}).json()["total"] == total_stored


def test_import_nanotron_sample_twice(live_api, data_dir, tmp_path):
    path = data_dir / "nanotron" / "bench_sample.csv"
    rows = data_rows(path)
    first = cli_json(*NANOTRON, str(path), "--rejects", str(tmp_path / "r.csv"))
    assert first == {**first, "read": len(rows), "stored": len(rows), "rejected": 0, "already_present": 0}
    again = cli_json(*NANOTRON, str(path))
    assert (again["stored"], again["already_present"]) == (0, len(rows))
    import httpx

    statuses = {s: httpx.get(f"{live_api}/api/v1/runs", params={"status": s, "limit": 1}).json()["total"]
                for s in ("success", "oom", "failed")}
    want = {"success": sum(r["status"] == "Success" for r in rows), "oom": sum(r["status"] == "OOM" for r in rows),
            "failed": sum(r["status"] == "Other" for r in rows)}
    assert statuses == want


def test_import_nanotron_rejects_bad_rows(live_api, data_dir, tmp_path):
    src = data_rows(data_dir / "nanotron" / "bench_sample.csv")[:5]
    src[1]["tok/s/gpu"] = "12x"          # unparseable: rejected by the parser
    src[2]["zero_stage"] = "7"           # no such ZeRO stage: rejected by the server
    path = tmp_path / "bench.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(src[0]))
        w.writeheader()
        w.writerows(src)
    rejects = tmp_path / "bench.rejects.csv"
    summary = cli_json(*NANOTRON, str(path), "--rejects", str(rejects), code=1)
    assert (summary["read"], summary["stored"], summary["rejected"]) == (5, 3, 2)
    with open(rejects, newline="") as fh:
        reasons = [r["reason"] for r in csv.DictReader(fh)]
    assert any("tok/s/gpu" in r and "12x" in r for r in reasons)
    assert any("zero_stage" in r for r in reasons)


def test_push_json_and_jsonl(live_api, tmp_path):
    good = {"run_key": "push-1", "model_params": 1_340_000_000, "nodes": 1, "gpus_per_node": 8, "dp": 8,
            "status": "success", "tokens_per_sec_per_gpu": 40000.0, "gpu_type": "H100-SXM-80GB"}
    jsonl = tmp_path / "runs.jsonl"
    jsonl.write_text("\n".join([json.dumps(good), "{not json", json.dumps({**good, "run_key": "push-2", "dp": 5})]))
    rejects = tmp_path / "runs.rejects.csv"
    summary = cli_json("push", str(jsonl), "--rejects", str(rejects), code=1)
    assert (summary["read"], summary["stored"], summary["rejected"]) == (3, 1, 2)
    assert rejects.exists()
    doc = tmp_path / "runs.json"
    doc.write_text(json.dumps({"runs": [good, {**good, "run_key": "push-3"}]}))
    summary = cli_json("push", str(doc))
    assert (summary["stored"], summary["already_present"]) == (1, 1)


def test_cli_recommend_and_heatmap_tables(live_api, data_dir, monkeypatch):
    from service.cli.base import console

    monkeypatch.setattr(console, "width", 200)  # rich fixed its width at import; tables are wide
    cli_json(*NANOTRON, str(data_dir / "nanotron" / "bench_sample.csv"))
    rows = [r for r in data_rows(data_dir / "nanotron" / "bench_sample.csv")
            if r["status"] == "Success" and float(r["nodes"]) == 2]
    best = max(rows, key=lambda r: float(r["tok/s/gpu"]))
    label = f"DP{best['dp']} TP{best['tp']} PP{best['pp']}"
    out = runner.invoke(app, ["recommend", "--model", "1.34B", "--nodes", "2"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "predicted" in out.stdout and "held-out error" in out.stdout
    api = runner.invoke(app, ["recommend", "--model", "1.34B", "--nodes", "2", "--json"])
    first = json.loads(api.stdout)["candidates"][0]
    assert f"{first['predicted']['tokens_per_sec_per_gpu']:,.0f}" in out.stdout
    assert f"#{first['evidence'][0]['run_id']}" in out.stdout
    grid = runner.invoke(app, ["heatmap"], env={"COLUMNS": "200"})
    assert grid.exit_code == 0 and label in grid.stdout and "1.3B" in grid.stdout


def test_cli_reports_unreachable_api(monkeypatch):
    monkeypatch.setenv("SCALEBOOK_API_URL", "http://127.0.0.1:9")
    out = runner.invoke(app, ["heatmap"])
    assert out.exit_code != 0
    assert "cannot reach the scalebook API" in out.output


# ----------------------------------------------------------------- refusing what is not understood
def _runs_total(live_api) -> int:
    import httpx

    return httpx.get(f"{live_api}/api/v1/runs", params={"limit": 1}).json()["total"]


def test_unknown_column_is_refused_with_the_nearest_name(live_api, data_dir, tmp_path):
    src = data_rows(data_dir / "nanotron" / "bench_sample.csv")[:3]
    for row in src:
        row["tokens_per_sec_per_gup"] = row.pop("tok/s/gpu")
    path = tmp_path / "mine.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(src[0]))
        w.writeheader()
        w.writerows(src)
    out = runner.invoke(app, [*NANOTRON, str(path)])
    assert out.exit_code == 1
    assert "'tokens_per_sec_per_gup' (did you mean 'tokens_per_sec_per_gpu'?)" in " ".join(out.output.split())
    assert _runs_total(live_api) == 0  # nothing stored
    mapped = cli_json(*NANOTRON, str(path), "--map", "tokens_per_sec_per_gup=tok/s/gpu")
    assert (mapped["stored"], mapped["rejected"]) == (3, 0)


def test_nanotron_import_without_a_gpu_type_stores_nothing_and_says_why(live_api, data_dir):
    out = runner.invoke(app, ["import", "nanotron", str(data_dir / "nanotron" / "bench_sample.csv")])
    assert out.exit_code == 1
    assert "does not say which GPU it ran on" in " ".join(out.output.split())
    assert _runs_total(live_api) == 0


def test_unknown_table_column_and_extra_columns(live_api, data_dir, tmp_path):
    src = data_rows(data_dir / "published" / "torchtitan_performance.csv")[:2]
    for row in src:
        row["num_node"] = row.pop("num_nodes")
    path = tmp_path / "table.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(src[0]))
        w.writeheader()
        w.writerows(src)
    out = runner.invoke(app, ["import", "table", str(path)])
    assert out.exit_code == 1 and "did you mean 'num_nodes'?" in " ".join(out.output.split())
    assert _runs_total(live_api) == 0
    kept = cli_json("import", "table", str(path), "--extra-columns")
    assert kept["stored"] == 2


def test_push_of_a_csv_says_use_import_runs(live_api, tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("run_key,status\nk1,success\n")
    out = runner.invoke(app, ["push", str(path)])
    assert out.exit_code == 1 and "scalebook import runs" in " ".join(out.output.split())
    assert _runs_total(live_api) == 0


def test_export_then_import_runs_is_the_same_runs(live_api, data_dir, tmp_path):
    """CSV export (`scalebook sql ... --format csv`) -> import runs: every exported run comes back
    as the same reported content (the server answers 'already present', never a 409 conflict)."""
    cli_json(*NANOTRON, str(data_dir / "nanotron" / "bench_sample.csv"))
    for path in sorted((data_dir / "published").glob("*.csv"))[:3]:
        runner.invoke(app, ["import", "table", str(path), "--rejects", str(tmp_path / "r.csv")])
    total = _runs_total(live_api)
    export = runner.invoke(app, ["sql", "select * from runs order by id", "--format", "csv"])
    assert export.exit_code == 0
    path = tmp_path / "export.csv"
    path.write_text(export.stdout)
    back = cli_json("import", "runs", str(path))
    assert (back["read"], back["stored"], back["already_present"], back["rejected"]) == (total, 0, total, 0)
    # the same rows as JSONL, each run with its run_key: also all present
    rows = list(csv.DictReader(open(path, newline="")))
    jsonl = tmp_path / "export.jsonl"
    jsonl.write_text("\n".join(json.dumps({k: v for k, v in r.items() if v != ""}) for r in rows[:20]))
    assert cli_json("import", "runs", str(jsonl))["already_present"] == 20


def test_import_runs_refuses_unknown_columns(live_api, tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("run_key,status,tokens_per_sec_per_gup\nk1,success,100\n")
    out = runner.invoke(app, ["import", "runs", str(path)])
    assert out.exit_code == 1 and "did you mean 'tokens_per_sec_per_gpu'?" in " ".join(out.output.split())
    assert _runs_total(live_api) == 0


def test_import_log_refuses_an_unrecognisable_file(live_api, tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    out = runner.invoke(app, ["import", "log", str(empty), "--rejects", str(tmp_path / "r.csv")])
    assert out.exit_code == 1 and "refused" in out.output
    [reject] = data_rows(tmp_path / "r.csv")
    assert reject["reason"].startswith(f"{empty}: nothing to import")
    assert "found no training metrics" in reject["reason"]
    assert _runs_total(live_api) == 0
