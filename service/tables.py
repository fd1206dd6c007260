"""SQLAlchemy 2 table rows. Kept apart from the wire schemas (service/schemas.py).

Column names are the run record's (DESIGN §2). DuckDB has no IDENTITY, so ids come from a
`Sequence`. Timestamps are naive UTC (DuckDB's TIMESTAMPTZ needs pytz on fetch).
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    Index,
    Integer,
    MetaData,
    Sequence,
    String,
    Text,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


RUN_ID_SEQ = Sequence("runs_id_seq", start=1)
TOKEN_ID_SEQ = Sequence("api_tokens_id_seq", start=1)


class Run(Base):
    """One benchmark run: reported fields as reported, derived fields in their own columns."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(BigInteger, RUN_ID_SEQ, primary_key=True,
                                    server_default=RUN_ID_SEQ.next_value())
    run_key: Mapped[str] = mapped_column(String(200), nullable=False)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    ingested_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)

    name: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    source: Mapped[str] = mapped_column(String(64), nullable=False)
    # the sweep the run belongs to (sweeps.name; not a foreign key: a run may name a sweep that another
    # database holds, and an import keeps it) and free labels, a JSON list of strings (migration 0013)
    sweep: Mapped[str | None] = mapped_column(String(200))
    tags: Mapped[list | None] = mapped_column(JSON)

    model_name: Mapped[str | None] = mapped_column(String(200))
    model_params: Mapped[int | None] = mapped_column(BigInteger)
    num_layers: Mapped[int | None] = mapped_column(Integer)
    hidden_size: Mapped[int | None] = mapped_column(Integer)
    num_heads: Mapped[int | None] = mapped_column(Integer)
    num_kv_heads: Mapped[int | None] = mapped_column(Integer)
    ffn_hidden_size: Mapped[int | None] = mapped_column(Integer)
    vocab_size: Mapped[int | None] = mapped_column(Integer)
    gated_linear_unit: Mapped[bool | None] = mapped_column(Boolean)
    seq_len: Mapped[int | None] = mapped_column(Integer)

    gpu_type: Mapped[str | None] = mapped_column(String(100))
    gpus_per_node: Mapped[int | None] = mapped_column(Integer)
    nodes: Mapped[int | None] = mapped_column(Integer)
    world_size: Mapped[int | None] = mapped_column(Integer)

    dp: Mapped[int | None] = mapped_column(Integer)
    tp: Mapped[int | None] = mapped_column(Integer)
    pp: Mapped[int | None] = mapped_column(Integer)
    cp: Mapped[int | None] = mapped_column(Integer)
    ep: Mapped[int | None] = mapped_column(Integer)
    zero_stage: Mapped[int | None] = mapped_column(Integer)
    micro_batch_size: Mapped[int | None] = mapped_column(Integer)
    grad_accum_steps: Mapped[int | None] = mapped_column(Integer)
    global_batch_tokens: Mapped[int | None] = mapped_column(BigInteger)
    recompute: Mapped[str | None] = mapped_column(String(16))
    precision: Mapped[str | None] = mapped_column(String(32))

    framework: Mapped[str | None] = mapped_column(String(200))
    framework_version: Mapped[str | None] = mapped_column(String(100))
    torch_version: Mapped[str | None] = mapped_column(String(100))
    cuda_version: Mapped[str | None] = mapped_column(String(100))
    nccl_version: Mapped[str | None] = mapped_column(String(100))

    status: Mapped[str] = mapped_column(String(16), nullable=False)
    tokens_per_sec_per_gpu: Mapped[float | None] = mapped_column(Double)
    tflops_per_gpu: Mapped[float | None] = mapped_column(Double)
    mfu: Mapped[float | None] = mapped_column(Double)
    hfu: Mapped[float | None] = mapped_column(Double)
    peak_memory_gib: Mapped[float | None] = mapped_column(Double)
    reserved_memory_gib: Mapped[float | None] = mapped_column(Double)
    step_time_s: Mapped[float | None] = mapped_column(Double)
    error_class: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    extra: Mapped[dict | None] = mapped_column(JSON)

    # derived, computed one way for every run (service/derive.py)
    model_size_class: Mapped[float | None] = mapped_column(Double)
    is_moe: Mapped[bool | None] = mapped_column(Boolean, server_default=sa.false())  # core.model.is_moe (0013)
    mfu_derived: Mapped[float | None] = mapped_column(Double)
    hfu_derived: Mapped[float | None] = mapped_column(Double)
    mfu_method: Mapped[str | None] = mapped_column(String(64))
    peak_tflops: Mapped[float | None] = mapped_column(Double)
    fingerprint: Mapped[str | None] = mapped_column(String(64))

    # retired runs (POST /api/v1/runs/retire): kept and queryable, left out of every analytic
    retired_at: Mapped[datetime | None] = mapped_column(DateTime)
    retired_reason: Mapped[str | None] = mapped_column(Text)

    # collective bandwidths the run recorded (all-reduce bus bandwidth, GB/s: nanotron's "AllReduce
    # (GB/s)", "AR Intra-node (GB/s)"), copied from extra at ingest (service/derive.py, migration 0010)
    # so that the throughput fit reads them without parsing JSON
    allreduce_gb_s: Mapped[float | None] = mapped_column(Double)
    ar_intra_node_gb_s: Mapped[float | None] = mapped_column(Double)

    # live runs (DESIGN §9, migration 0013): the last time an open run's job was heard from (its opening,
    # a heartbeat, a step batch, its finish), naive UTC. A `running` run whose last heartbeat is older than
    # lost_after_s reads as `lost` (core/lifecycle.py); NULL for a run that was stored finished.
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime)

    __table_args__ = (
        Index("ux_runs_run_key", "run_key", unique=True),
        Index("ix_runs_heatmap", "model_size_class", "nodes", "status"),
        Index("ix_runs_fingerprint", "fingerprint", "started_at"),
        Index("ix_runs_model_name", "model_name"),
        Index("ix_runs_started_at", "started_at"),
    )


# PostgreSQL-only partial indexes (migrations 0003, 0010): the heatmap's LATERAL top-1 per cell and the
# recommender's recorded-OOM lookup. DuckDB has no partial
# indexes; it answers those queries with arg_min/arg_max scans instead.
Index("ix_runs_best_tps", Run.model_size_class, Run.nodes, Run.tokens_per_sec_per_gpu.desc().nulls_last(),
      func.coalesce(Run.mfu_derived, Run.mfu).desc().nulls_last(), Run.id,
      postgresql_where=Run.status == "success").ddl_if(dialect="postgresql")
Index("ix_runs_best_mfu", Run.model_size_class, Run.nodes, func.coalesce(Run.mfu_derived, Run.mfu).desc().nulls_last(),
      Run.id, postgresql_where=Run.status == "success").ddl_if(dialect="postgresql")
# the best run per cell on a slice (gpu_type, seq_len: the dashboard's default view), ranked by tokens/s (0011)
Index("ix_runs_best_tps_slice", Run.gpu_type, Run.seq_len, Run.model_size_class, Run.nodes,
      Run.tokens_per_sec_per_gpu.desc().nulls_last(), func.coalesce(Run.mfu_derived, Run.mfu).desc().nulls_last(),
      Run.id, postgresql_where=Run.status == "success").ddl_if(dialect="postgresql")
# the heatmap's per-cell counts over the live runs (heatmap._cells_lateral): an index-only scan (0011; is_moe 0013)
Index("ix_runs_cells", Run.model_size_class, Run.is_moe, Run.nodes, Run.status,
      postgresql_include=["gpu_type", "seq_len"],
      postgresql_where=sa.and_(Run.retired_at.is_(None), Run.model_size_class.is_not(None), Run.nodes.is_not(None))
      ).ddl_if(dialect="postgresql")
# a sweep's runs (GET /sweeps/{name}, GET /runs?sweep=): PostgreSQL only — DuckDB cannot drop a column
# whose index was dropped in the same transaction (0013's downgrade), and scans one column fast (0013)
Index("ix_runs_sweep", Run.sweep).ddl_if(dialect="postgresql")
# the open runs (GET /runs?status=running|lost, the dashboard's Live view): a few rows whatever the size
# of the table, ordered by their last heartbeat (0013)
Index("ix_runs_open", Run.last_heartbeat_at, postgresql_include=["id"],
      postgresql_where=Run.status == "running").ddl_if(dialect="postgresql")
# the recommender's recorded OOMs (recommend._oom_rows): an index-only scan (0010). (ix_runs_config, the covering
# index of the per-request configuration aggregate, went with 0018: run_configs holds that aggregate.)
Index("ix_runs_oom", Run.gpu_type, Run.model_size_class, Run.seq_len, Run.dp, Run.tp, Run.pp, Run.cp, Run.zero_stage,
      Run.micro_batch_size, Run.recompute, postgresql_include=["id"],
      postgresql_where=sa.and_(Run.status == "oom", Run.retired_at.is_(None))).ddl_if(dialect="postgresql")


class RunConfig(Base):
    """The per-configuration summary of the successful runs (service/run_configs.py: what it covers, who
    keeps it). Configuration columns as in `runs`; aggregates over the runs of the configuration."""

    __tablename__ = "run_configs"

    config_key: Mapped[str] = mapped_column(String(32), primary_key=True)
    gpu_type: Mapped[str | None] = mapped_column(String(100))
    framework: Mapped[str | None] = mapped_column(String(200))
    precision: Mapped[str | None] = mapped_column(String(32))
    model_params: Mapped[int | None] = mapped_column(BigInteger)
    num_layers: Mapped[int | None] = mapped_column(Integer)
    hidden_size: Mapped[int | None] = mapped_column(Integer)
    num_heads: Mapped[int | None] = mapped_column(Integer)
    num_kv_heads: Mapped[int | None] = mapped_column(Integer)
    ffn_hidden_size: Mapped[int | None] = mapped_column(Integer)
    vocab_size: Mapped[int | None] = mapped_column(Integer)
    gated_linear_unit: Mapped[bool | None] = mapped_column(Boolean)
    seq_len: Mapped[int | None] = mapped_column(Integer)
    nodes: Mapped[int | None] = mapped_column(Integer)
    gpus_per_node: Mapped[int | None] = mapped_column(Integer)
    dp: Mapped[int | None] = mapped_column(Integer)
    tp: Mapped[int | None] = mapped_column(Integer)
    pp: Mapped[int | None] = mapped_column(Integer)
    cp: Mapped[int | None] = mapped_column(Integer)
    ep: Mapped[int | None] = mapped_column(Integer)
    zero_stage: Mapped[int | None] = mapped_column(Integer)
    micro_batch_size: Mapped[int | None] = mapped_column(Integer)
    grad_accum_steps: Mapped[int | None] = mapped_column(Integer)
    recompute: Mapped[str | None] = mapped_column(String(16))
    model_size_class: Mapped[float | None] = mapped_column(Double)
    # aggregates over the configuration's runs: how many, the best tokens/s/GPU, the first (lowest) id,
    # the highest peak memory (GiB), and per recorded bandwidth (GB/s) the sum and count of the runs
    # that recorded it (mean = sum / count)
    n_runs: Mapped[int] = mapped_column(BigInteger, nullable=False)
    tokens_per_sec_per_gpu: Mapped[float] = mapped_column(Double, nullable=False)
    first_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    peak_memory_gib: Mapped[float | None] = mapped_column(Double)
    allreduce_gb_s_sum: Mapped[float] = mapped_column(Double, nullable=False)
    allreduce_gb_s_n: Mapped[int] = mapped_column(BigInteger, nullable=False)
    ar_intra_node_gb_s_sum: Mapped[float] = mapped_column(Double, nullable=False)
    ar_intra_node_gb_s_n: Mapped[int] = mapped_column(BigInteger, nullable=False)


class RunCell(Base):
    """The finished, not retired runs grouped by what the recommender's cell queries read
    (service/run_cells.py: what it covers, who keeps it). Group columns as in `runs` (is_moe NULL read as
    false); aggregates over the group's runs."""

    __tablename__ = "run_cells"

    cell_key: Mapped[str] = mapped_column(String(32), primary_key=True)
    gpu_type: Mapped[str | None] = mapped_column(String(100))
    model_size_class: Mapped[float | None] = mapped_column(Double)
    is_moe: Mapped[bool] = mapped_column(Boolean, nullable=False)
    nodes: Mapped[int | None] = mapped_column(Integer)
    gpus_per_node: Mapped[int | None] = mapped_column(Integer)
    seq_len: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    error_class: Mapped[str | None] = mapped_column(String(64))
    model_params: Mapped[int | None] = mapped_column(BigInteger)
    num_layers: Mapped[int | None] = mapped_column(Integer)
    hidden_size: Mapped[int | None] = mapped_column(Integer)
    num_heads: Mapped[int | None] = mapped_column(Integer)
    num_kv_heads: Mapped[int | None] = mapped_column(Integer)
    ffn_hidden_size: Mapped[int | None] = mapped_column(Integer)
    vocab_size: Mapped[int | None] = mapped_column(Integer)
    gated_linear_unit: Mapped[bool | None] = mapped_column(Boolean)
    framework: Mapped[str | None] = mapped_column(String(200))
    precision: Mapped[str | None] = mapped_column(String(32))
    dp: Mapped[int | None] = mapped_column(Integer)
    tp: Mapped[int | None] = mapped_column(Integer)
    pp: Mapped[int | None] = mapped_column(Integer)
    cp: Mapped[int | None] = mapped_column(Integer)
    ep: Mapped[int | None] = mapped_column(Integer)
    zero_stage: Mapped[int | None] = mapped_column(Integer)
    micro_batch_size: Mapped[int | None] = mapped_column(Integer)
    grad_accum_steps: Mapped[int | None] = mapped_column(Integer)
    recompute: Mapped[str | None] = mapped_column(String(16))
    # how many runs, the lowest id, the best run (service/ranking.best_order on tokens/s/GPU) and what an
    # answer shows of it, the run with the highest tokens/s/GPU > 0 (then the lowest id)
    n_runs: Mapped[int] = mapped_column(BigInteger, nullable=False)
    min_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    best_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    best_tps: Mapped[float | None] = mapped_column(Double)
    best_mfu: Mapped[float | None] = mapped_column(Double)
    best_model_name: Mapped[str | None] = mapped_column(String(200))
    best_source: Mapped[str | None] = mapped_column(String(64))
    best_peak_memory_gib: Mapped[float | None] = mapped_column(Double)
    best_global_batch_tokens: Mapped[int | None] = mapped_column(BigInteger)
    top_id: Mapped[int | None] = mapped_column(BigInteger)


class RunStep(Base):
    """One optimizer step of a live run (DESIGN §9, core/steps.py's STEP_FIELDS): the series behind the
    run page's plot, its jitter and stragglers, and the headline of a run that reports none. Keyed by
    (run_id, step): a step sent twice (a retry, the spool's replay) is stored once. At most
    SCALEBOOK_MAX_STEPS_PER_RUN per run (service/steps.py thins the series evenly beyond it)."""

    __tablename__ = "run_steps"

    run_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    received_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    recorded_at: Mapped[datetime | None] = mapped_column(DateTime)
    step_time_s: Mapped[float | None] = mapped_column(Double)
    tokens_per_sec_per_gpu: Mapped[float | None] = mapped_column(Double)
    tflops_per_gpu: Mapped[float | None] = mapped_column(Double)
    mfu: Mapped[float | None] = mapped_column(Double)
    loss: Mapped[float | None] = mapped_column(Double)
    grad_norm: Mapped[float | None] = mapped_column(Double)
    learning_rate: Mapped[float | None] = mapped_column(Double)
    peak_memory_gib: Mapped[float | None] = mapped_column(Double)


class ApiToken(Base):
    """An API token, stored as a SHA-256 hash; the plain token is shown once at creation."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(BigInteger, TOKEN_ID_SEQ, primary_key=True,
                                    server_default=TOKEN_ID_SEQ.next_value())
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    scope: Mapped[str] = mapped_column(String(16), nullable=False)
    token_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    prefix: Mapped[str] = mapped_column(String(16), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime)

    __table_args__ = (Index("ux_api_tokens_token_hash", "token_hash", unique=True),)


SWEEP_ID_SEQ = Sequence("sweeps_id_seq", start=1)


class Sweep(Base):
    """A sweep (DESIGN §9): a named search for one target's best configuration. Only its definition is
    stored; its progress (runs by status, best so far, what is left) is read from the runs that name it
    (runs.sweep), per request (service/sweeps.py)."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(BigInteger, SWEEP_ID_SEQ, primary_key=True,
                                    server_default=SWEEP_ID_SEQ.next_value())
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    strategy: Mapped[str] = mapped_column(String(16), nullable=False)  # grid | suggest
    budget: Mapped[int] = mapped_column(Integer, nullable=False)  # configurations handed out, at most
    target: Mapped[dict] = mapped_column(JSON, nullable=False)  # model size or dims, cluster, batch, framework …
    grid: Mapped[dict | None] = mapped_column(JSON)  # grid: {field: [values]}; suggest: null
    # suggest: stop when the best expected improvement is below this fraction of the best so far
    min_expected_improvement: Mapped[float | None] = mapped_column(Double)
    description: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (Index("ux_sweeps_name", "name", unique=True),)


LEASE_ID_SEQ = Sequence("sweep_leases_id_seq", start=1)


class SweepLease(Base):
    """One configuration of a sweep handed to an agent (POST /api/v1/sweeps/{name}/next): the run
    `run_key` opened as running for it. The unique index on (sweep, config_key, attempt) is what keeps
    two agents — any number of API processes on one PostgreSQL, or one DuckDB file — from being handed
    the same configuration: the second INSERT of a (sweep, configuration, attempt) does nothing, and
    that agent is offered the next configuration; (sweep, slot, attempt) likewise keeps the budget.
    attempt 2 exists only when attempt 1's run went lost (service/sweep_leases.py)."""

    __tablename__ = "sweep_leases"

    id: Mapped[int] = mapped_column(BigInteger, LEASE_ID_SEQ, primary_key=True,
                                    server_default=LEASE_ID_SEQ.next_value())
    sweep: Mapped[str] = mapped_column(String(200), nullable=False)
    config_key: Mapped[str] = mapped_column(String(200), nullable=False)  # core.rules.config_label
    attempt: Mapped[int] = mapped_column(Integer, nullable=False)  # 1, or 2 for a lost lease's second try
    # the budget slot, 1..budget: unique per (sweep, slot, attempt), so concurrent agents cannot overrun
    # the budget either (migration 0019)
    slot: Mapped[int | None] = mapped_column(Integer)  # always set by the write path (nullable: 0019)
    run_key: Mapped[str] = mapped_column(String(200), nullable=False)
    config: Mapped[dict] = mapped_column(JSON, nullable=False)  # CONFIG_FIELDS
    # the throughput model's figures for the configuration when it was handed out (null: no model yet)
    predicted: Mapped[dict | None] = mapped_column(JSON)
    leased_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)
    agent: Mapped[str | None] = mapped_column(String(200))  # who asked (host:pid), for the record

    __table_args__ = (Index("ux_sweep_leases_config", "sweep", "config_key", "attempt", unique=True),
                      Index("ux_sweep_leases_slot", "sweep", "slot", "attempt", unique=True),
                      Index("ux_sweep_leases_run_key", "run_key", unique=True))
