"""run_cells, the finished runs grouped for the recommender's cell questions (service/run_cells.py, migration
0020; issue 25 item 4), on both backends: the best and top runs of a group merge by the ranking rule
whatever the order the runs arrive in, and every cell question answered from it (the runs measured on a
target and the cell's counts, recorded OOMs, configurations recorded on the target, the best recorded run)
equals the same question asked of `runs` (the queries these readers replaced). The write paths' exactness
(batches, single runs, resends, retire, un-retire, delete, concurrent writers, outside SQL + rebuild) is
tested with run_configs' in tests/test_run_configs.py."""

from __future__ import annotations

import math

import pytest
import sqlalchemy as sa

from core.record import HOST_MEMORY_OOM_CLASSES
from core.rules import CONFIG_FIELDS
from service import retire, run_cells, store
from service.analytics import on_target
from service.analytics import recommend as rec
from service.analytics import suggest as sg
from service.analytics.heatmap import MOE
from service.analytics.on_target import DIM_FIELDS, config_key, config_value
from service.analytics.target import CompletedTarget
from service.cli import benchmark as benchtool
from service.lifecycle import FINISHED
from service.tables import Run


@pytest.fixture(scope="module")
def synthetic() -> list[dict]:
    return list(benchtool.generate_runs(800, seed=11))


def _group_runs(base: dict, values: list[tuple[float | None, float | None]], tag: str) -> list[dict]:
    """Runs of one group (base's configuration, no precision: no derived MFU, the reported one ranks)."""
    out = []
    for i, (tps, mfu) in enumerate(values):
        r = {k: v for k, v in base.items() if k not in ("tflops_per_gpu", "hfu", "mfu", "tokens_per_sec_per_gpu")}
        out.append({**r, "run_key": f"{tag}-{i}", "precision": None, "status": "success",
                    "tokens_per_sec_per_gpu": tps, "mfu": mfu})
    return out


@pytest.mark.parametrize("order", ["batch", "forward", "backward"])
def test_best_and_top_merge_by_the_ranking_rule(database, synthetic, order):
    base = next(r for r in synthetic if r["status"] == "success")
    runs = _group_runs(base, [(None, 0.9), (100.0, None), (100.0, 0.4), (90.0, 0.95), (100.0, 0.4), (None, None)],
                       f"tie-{order}")
    if order == "batch":
        store.ingest(database, runs)
    else:
        for r in runs if order == "forward" else runs[::-1]:
            store.ingest(database, [r])
    with database.session() as s:
        assert run_cells.stored(s) == run_cells.recompute(s)
        ids = dict(s.execute(sa.text("SELECT run_key, id FROM runs")).all())
        [row] = s.execute(sa.text("SELECT n_runs, min_id, best_id, best_tps, best_mfu, top_id FROM run_cells")).all()
    tied = sorted(ids[f"tie-{order}-{i}"] for i in (2, 4))  # 100 tokens/s at MFU 0.4: the better MFU, then id
    assert row == (6, min(ids.values()), tied[0], 100.0, 0.4,
                   min(ids[f"tie-{order}-{i}"] for i in (1, 2, 4)))  # top: the highest tokens/s, then the lower id


def _measured_from_runs(session, cell: on_target.Cell, precision: str | None) -> on_target.Measured:
    """on_target.measured as it read `runs` before run_cells (reference)."""
    gpu = Run.gpu_type.is_(None) if cell.gpu_type is None else Run.gpu_type == cell.gpu_type
    conds = [cell.size_filter(), MOE == cell.moe, Run.nodes == cell.nodes, gpu, Run.retired_at.is_(None), FINISHED,
             sa.or_(Run.gpus_per_node.is_(None), Run.gpus_per_node == cell.gpus_per_node)]
    seq = Run.seq_len.is_(None) if cell.seq_len is None else Run.seq_len == cell.seq_len
    cols = ["id", "model_name", "model_params", "model_size_class", *DIM_FIELDS, "gated_linear_unit", "seq_len",
            "gpu_type", "gpus_per_node", "nodes", *CONFIG_FIELDS, "global_batch_tokens", "precision", "framework",
            "source", "tokens_per_sec_per_gpu", "mfu", "mfu_derived", "peak_memory_gib"]
    mfu = sa.func.coalesce(Run.mfu_derived, Run.mfu)
    result = session.execute(sa.select(*(getattr(Run, c) for c in cols)).where(*conds, seq, Run.status == "success")
                             .order_by(Run.tokens_per_sec_per_gpu.desc().nulls_last(), mfu.desc().nulls_last(), Run.id))
    rows = [r for r in (dict(zip(cols, x)) for x in result) if not on_target._conflicts(r, cell.dims)]
    seen: dict[tuple, dict] = {}
    for r in rows:
        key = (r["model_params"], r["model_size_class"], *(r[d] for d in DIM_FIELDS), r["gated_linear_unit"],
               r["framework"], r["precision"], config_key(r))
        if key in seen:
            seen[key]["n_runs"] += 1
        else:
            seen[key] = {**r, "n_runs": 1}
    asked = cell.model_params

    def order(item):
        i, r = item
        n = r["model_params"] or (r["model_size_class"] or 0) * 1e9
        return (r["precision"] != precision, round(abs(math.log(n / asked)) if n else math.inf, 6), i)

    ranked = [r for _, r in sorted(enumerate(seen.values()), key=order)]
    out = on_target.Measured([on_target._entry(r) for r in ranked[:50]], n_success=len(rows),
                             n_configurations=len(ranked))
    for seq_len, status, n in session.execute(sa.select(Run.seq_len, Run.status, sa.func.count()).where(*conds)
                                              .group_by(Run.seq_len, Run.status)):
        if seq_len == cell.seq_len:
            if status == "oom":
                out.n_oom += n
            elif status != "success":
                out.n_failed += n
        elif status == "success":
            out.other_seq_lens[seq_len] = out.other_seq_lens.get(seq_len, 0) + n
    return out


def test_cell_questions_agree_with_runs(database, synthetic):
    store.ingest(database, synthetic)
    with database.session(write=True) as s:  # some retired runs, which no answer may count
        retire.retire(s, None, {"nodes": 2}, "test")
        retire.unretire(s, None, {"nodes": 2, "gpu_type": "H100-SXM-80GB"})
    with database.session() as s:
        cells = s.execute(sa.text(
            "SELECT model_size_class, nodes, gpu_type, seq_len, gpus_per_node, count(*) FROM runs "
            "WHERE status = 'success' AND model_size_class IS NOT NULL AND gpu_type IS NOT NULL "
            "AND seq_len IS NOT NULL GROUP BY 1, 2, 3, 4, 5 ORDER BY 6 DESC LIMIT 8")).all()
        assert len(cells) == 8
        checked = 0
        for size, nodes, gpu, seq, gpn, _ in cells:
            for family, asked in ((False, int(round(size * 1e9))), (True, int(round(size)) * 10**9 or 10**9)):
                cell = on_target.Cell(asked, family, nodes, gpn or 8, gpu, seq)
                got = on_target.measured(s, cell, precision="bf16", limit=50)
                assert got == _measured_from_runs(s, cell, "bf16"), (cell, got)
                checked += got.n_success
            ctx = CompletedTarget(model_params=int(size * 1e9), nodes=nodes, gpus_per_node=gpn or 8, gpu_type=gpu,
                                  seq_len=seq, precision="bf16", size_class=size)
            same = [Run.gpu_type == gpu, Run.model_size_class == size, Run.seq_len == seq]
            oom_cols = [Run.gpu_type, Run.model_size_class, Run.seq_len, Run.dp, Run.tp, Run.pp, Run.cp,
                        Run.zero_stage, Run.micro_batch_size, Run.recompute]
            ooms = s.execute(sa.select(*oom_cols, sa.func.min(Run.id)).where(
                Run.status == "oom", Run.retired_at.is_(None), *same,
                sa.or_(Run.error_class.is_(None), Run.error_class.not_in(sorted(HOST_MEMORY_OOM_CLASSES))))
                .group_by(*oom_cols)).all()
            assert sorted(tuple(o.values()) for o in rec._oom_rows(s, ctx)) == sorted(tuple(o) for o in ooms)
            on_cell = [*same, Run.nodes == nodes, Run.retired_at.is_(None)]
            recorded = s.execute(sa.select(*(getattr(Run, f) for f in CONFIG_FIELDS)).distinct()
                                 .where(*on_cell, FINISHED)).all()
            assert rec.recorded_on_target(s, ctx) == {
                tuple(config_value(dict(zip(CONFIG_FIELDS, r)), f) for f in CONFIG_FIELDS) for r in recorded}
            best = s.execute(sa.select(Run.id, Run.tokens_per_sec_per_gpu, *(getattr(Run, f) for f in CONFIG_FIELDS))
                             .where(*on_cell, Run.status == "success", Run.tokens_per_sec_per_gpu > 0)
                             .order_by(Run.tokens_per_sec_per_gpu.desc(), Run.id).limit(1)).first()
            assert sg.best_recorded(s, ctx) == (None if best is None else {
                "id": best[0], "tokens_per_sec_per_gpu": best[1], "config": dict(zip(CONFIG_FIELDS, best[2:]))})
    assert checked > 100
