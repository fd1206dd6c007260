"""Wire schemas (pydantic). Kept apart from the table rows (service/tables.py).

Field names are the run record's (DESIGN §2). Units are in the names: tokens_per_sec_per_gpu
(tokens/s per GPU), tflops_per_gpu (TFLOP/s per GPU), mfu/hfu (fractions in [0, 1]),
peak_memory_gib (GiB = 2**30 bytes per GPU), step_time_s (seconds per optimizer step).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from core.record import (
    ALL_STATUSES,
    ERROR_CLASSES,
    MAX_TAGS,
    RECOMPUTE,
    REPORTED_STATUSES,
    TAG_MAX_LEN,
    parse_tags,
)

#: every status a run reads as (answers, the status filter); `lost` is derived, never reported
Status = Literal[ALL_STATUSES]  # type: ignore[valid-type]
#: what a client may report: a finished run's status, or `running` to open a run (DESIGN §9)
ReportedStatus = Literal[REPORTED_STATUSES]  # type: ignore[valid-type]
Recompute = Literal[RECOMPUTE]  # type: ignore[valid-type]
ErrorClass = Literal[ERROR_CLASSES]  # type: ignore[valid-type]

INT32_MAX = 2**31 - 1  # INTEGER columns
INT64_MAX = 2**63 - 1  # BIGINT columns
PosInt = Field(default=None, ge=1, le=INT32_MAX)


def as_utc(v: datetime | None) -> datetime | None:
    """A naive (UTC) datetime made timezone-aware, so it serialises as RFC 3339 with +00:00."""
    return v.replace(tzinfo=UTC) if v is not None and v.tzinfo is None else v


def finite_json(value: Any, path: str = "extra") -> Any:
    """`value` unchanged when every number in it (nested dicts and lists included) is finite.

    JSON has no NaN or Infinity, but Python's parser reads `NaN`, `Infinity` and overflowing literals
    such as `1e309` as non-finite floats; they would be stored as text on one backend and refused by
    the other. Raises ValueError naming the path of the first one (e.g. "extra.loss[3]")."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path}: {value!r} is not a finite number (JSON has no NaN or Infinity)")
    elif isinstance(value, dict):
        for k, v in value.items():
            finite_json(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            finite_json(v, f"{path}[{i}]")
    return value


#: a stored (naive UTC) timestamp on the wire: timezone-aware, RFC 3339 with its offset
UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]


class RunIn(BaseModel):
    """One benchmark run as a client reports it. Unknown fields are refused (put them in `extra`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, str_strip_whitespace=True,
                              json_schema_extra={"example": {
                                  "run_key": "sweep42-8b-8n-dp16tp4", "name": "llama3-8b dp16 tp4",
                                  "model_name": "llama3-8b", "model_params": 8030261248, "seq_len": 8192,
                                  "gpu_type": "H100-SXM-80GB", "gpus_per_node": 8, "nodes": 8,
                                  "dp": 16, "tp": 4, "zero_stage": 1, "micro_batch_size": 1,
                                  "grad_accum_steps": 8, "recompute": "selective", "precision": "bf16",
                                  "framework": "nanotron", "status": "success",
                                  "tokens_per_sec_per_gpu": 4100.0, "peak_memory_gib": 61.2}})

    run_key: str | None = Field(default=None, min_length=1, max_length=200,
                                description="client idempotency key; assigned by the server when absent")
    name: str | None = Field(default=None, max_length=2000)
    started_at: datetime | None = Field(default=None, description="when the job ran (ISO 8601; naive = UTC)")
    source: str = Field(default="api", min_length=1, max_length=64)
    sweep: str | None = Field(default=None, min_length=1, max_length=200,
                              description="the sweep (POST /api/v1/sweeps) the run belongs to, by name")
    tags: list[str] | None = Field(default=None, description=f"free labels (at most {MAX_TAGS}, each at most "
                                                             f"{TAG_MAX_LEN} characters); filter GET /runs?tag=")
    model_name: str | None = Field(default=None, max_length=200)
    model_params: int | None = Field(default=None, ge=1, le=INT64_MAX,
                                     description="total parameters, embeddings included")
    num_layers: int | None = PosInt
    hidden_size: int | None = PosInt
    num_heads: int | None = PosInt
    num_kv_heads: int | None = PosInt
    ffn_hidden_size: int | None = PosInt
    vocab_size: int | None = PosInt
    gated_linear_unit: bool | None = Field(
        default=None, description="the MLP: true = gated (SwiGLU/GeGLU, three matrices, as Llama's), false = "
                                  "plain (GPT's GELU, two); Megatron-Core's name. Unknown: null (the models then "
                                  "assume gated and say so)")
    seq_len: int | None = Field(default=None, ge=1, le=INT32_MAX, description="tokens per sample")
    gpu_type: str | None = Field(default=None, max_length=100,
                                 description="canonicalised through the hardware catalog (e.g. H100-SXM-80GB)")
    gpus_per_node: int | None = PosInt
    nodes: int | None = PosInt
    world_size: int | None = Field(default=None, ge=1, le=INT32_MAX, description="nodes × gpus_per_node unless given")
    dp: int | None = PosInt
    tp: int | None = PosInt
    pp: int | None = PosInt
    cp: int | None = PosInt
    ep: int | None = PosInt
    zero_stage: int | None = Field(default=None, ge=0, le=3,
                                   description="ZeRO/FSDP stage: FULL_SHARD=3, SHARD_GRAD_OP=2")
    micro_batch_size: int | None = Field(default=None, ge=1, le=INT32_MAX,
                                         description="samples per micro-batch per DP replica")
    grad_accum_steps: int | None = Field(default=None, ge=1, le=INT32_MAX,
                                         description="micro-batches per optimizer step")
    global_batch_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX,
                                            description="dp·micro_batch_size·grad_accum_steps·seq_len unless given")
    recompute: Recompute | None = None
    precision: str | None = Field(default=None, max_length=32)
    framework: str | None = Field(default=None, max_length=200)
    framework_version: str | None = Field(default=None, max_length=100)
    torch_version: str | None = Field(default=None, max_length=100)
    cuda_version: str | None = Field(default=None, max_length=100)
    nccl_version: str | None = Field(default=None, max_length=100)
    status: ReportedStatus = Field(default="success", description=(
        "a finished run's status, or `running` to open a live run at the start of its job (then heartbeat "
        "it with POST /runs/{run_key}/heartbeat and finish it once with the same run_key and a finished "
        "status); `lost` is never sent: a running run without a heartbeat for lost_after_s reads so"))
    tokens_per_sec_per_gpu: float | None = Field(default=None, ge=0)
    tflops_per_gpu: float | None = Field(default=None, ge=0)
    mfu: float | None = Field(default=None, ge=0, le=1, description="fraction in [0, 1]")
    hfu: float | None = Field(default=None, ge=0, le=1, description="fraction in [0, 1]")
    peak_memory_gib: float | None = Field(default=None, ge=0, description="per GPU, GiB (2**30 bytes)")
    reserved_memory_gib: float | None = Field(default=None, ge=0)
    step_time_s: float | None = Field(default=None, gt=0)
    error_class: ErrorClass | None = None
    error_message: str | None = Field(default=None, max_length=20000)
    extra: dict[str, Any] | None = None

    _finite_extra = field_validator("extra")(classmethod(lambda cls, v: finite_json(v)))

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: list[str] | None) -> list[str] | None:
        """core.record.parse_tags: stripped, empty ones dropped, each once, bounded."""
        return parse_tags(v)

    @field_validator("started_at")
    @classmethod
    def _utc_naive(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is not None:
            try:
                v = v.astimezone(UTC).replace(tzinfo=None)
            except OverflowError as exc:
                raise ValueError(f"{v.isoformat()} is outside the representable UTC range") from exc
        return v


class RunOut(RunIn):
    """A stored run: the reported fields, the derived columns and server bookkeeping."""

    model_config = ConfigDict(extra="ignore", from_attributes=True)

    id: int
    run_key: str
    ingested_at: datetime
    model_size_class: float | None = Field(default=None, description="billions, 2 significant figures")
    is_moe: bool | None = Field(default=None, description="mixture-of-experts (EP > 1, experts in extra, or active "
                             "parameters known): the heatmap keeps MoE and dense models of one size apart")
    mfu_derived: float | None = Field(default=None, description="PaLM-formula MFU from throughput and catalog peak")
    hfu_derived: float | None = None
    mfu_method: str | None = None
    peak_tflops: float | None = Field(default=None, description="catalog dense peak used for mfu_derived, TFLOP/s")
    fingerprint: str | None = None
    retired_at: UtcDatetime | None = Field(
        default=None, description="set when the run was retired (left out of analytics)"
    )
    retired_reason: str | None = None
    mfu: float | None = None  # stored as reported; bounds are checked on input only
    hfu: float | None = None
    status: Status = Field(description="as stored, except a running run whose last heartbeat is older than "
                                       "lost_after_s, which reads `lost`")
    last_heartbeat_at: UtcDatetime | None = Field(
        default=None, description="live runs: when the job was last heard from (opening, heartbeat, steps, finish)")

    @field_validator("started_at", "ingested_at")
    @classmethod
    def _utc_naive(cls, v: datetime | None) -> datetime | None:  # overrides RunIn's: stored naive UTC
        """Stored timestamps are naive UTC; on the wire they carry their offset (RFC 3339)."""
        return as_utc(v)


class StepFigures(BaseModel):
    """The figures of one optimizer step (core/steps.py STEP_METRICS). Units in the names; mfu a fraction."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    step_time_s: float | None = Field(default=None, gt=0, description="seconds for this optimizer step")
    tokens_per_sec_per_gpu: float | None = Field(default=None, ge=0)
    tflops_per_gpu: float | None = Field(default=None, ge=0)
    mfu: float | None = Field(default=None, ge=0, le=1, description="fraction in [0, 1]")
    loss: float | None = None
    grad_norm: float | None = Field(default=None, ge=0)
    learning_rate: float | None = Field(default=None, ge=0)
    peak_memory_gib: float | None = Field(default=None, ge=0, description="per GPU, GiB (2**30 bytes)")
    recorded_at: datetime | None = Field(default=None, description="when the job measured it (ISO 8601; naive = UTC)")

    @field_validator("recorded_at")
    @classmethod
    def _utc_naive(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is not None:
            try:
                v = v.astimezone(UTC).replace(tzinfo=None)
            except OverflowError as exc:
                raise ValueError(f"{v.isoformat()} is outside the representable UTC range") from exc
        return v


class StepIn(StepFigures):
    """One optimizer step of a live run (core/steps.py STEP_FIELDS): its number and figures."""

    step: int = Field(ge=0, le=INT64_MAX, description="optimizer step number")


class StepOut(StepIn):
    """A stored step: as sent, and when it arrived."""

    recorded_at: UtcDatetime | None = None
    received_at: UtcDatetime

    @field_validator("recorded_at")
    @classmethod
    def _utc_naive(cls, v: datetime | None) -> datetime | None:  # stored naive UTC, sent with its offset
        return as_utc(v)


class StoredRuns(BaseModel):
    """Answer to a batch POST: the stored runs in request order, and how many were new."""

    runs: list[RunOut]
    created: int
    existing: int


class StoredRunIds(BaseModel):
    """Answer to a POST sent with `Prefer: return=minimal` (RFC 7240): the ids of the stored
    runs in request order (new and already stored alike), and how many were new."""

    ids: list[int]
    created: int
    existing: int


class RunsPage(BaseModel):
    """One page of runs; pass `next_cursor` as `cursor` for the next page (null at the end)."""

    runs: list[RunOut]
    next_cursor: str | None
    total: int


class ErrorDetail(BaseModel):
    index: int | None = None
    field: str | None = None
    value: Any = None
    message: str


class ErrorInfo(BaseModel):
    code: str
    message: str
    details: list[ErrorDetail] = []


class ErrorBody(BaseModel):
    """The one error body shape of every endpoint."""

    error: ErrorInfo


class Health(BaseModel):
    status: Literal["ok"]
    backend: str
    schema_revision: str | None
    runs: int
    version: str
