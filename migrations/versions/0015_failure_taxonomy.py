"""Failure taxonomy of issue 27: stored runs take the four new error classes their messages show.

`error_class` is a free String(64) (no CHECK, no enum), so the new classes need no DDL. This revision
re-labels runs stored under the old taxonomy whose `error_message` is one of the new classes, with the
patterns of ingest/classify.py (8aa000e) narrowed to the messages earlier versions stored under the
old labels; the status is unchanged (core.record.ERROR_CLASS_STATUS gives the same one):

- `oom_gpu` -> `oom_host`: host memory (the allocator's DefaultCPUAllocator, the kernel / cgroup OOM
  killer, Slurm's oom-kill report, srun's "Out Of Memory", std::bad_alloc); status stays `oom`;
- `unknown` -> `divergence`: the loss scale at its minimum, "Loss became infinite or NaN", Megatron's
  "found NaN in local grad norm"; status stays `failed`;
- `unknown` -> `invalid_config`: "is not divisible by", "must be divisible by", "Invalid parallel dims";
- `scheduler_cancelled` -> `node_failure`: Slurm's "... DUE TO NODE FAILURE" and "Node failure on".

Downgrade maps them back (the old vocabulary has none of the four).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 17:10:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

#: (old class, new class, ILIKE patterns of error_message)
_RELABEL = (
    ("oom_gpu", "oom_host", ("%DefaultCPUAllocator%", "%oom-kill%", "%oom_kill%", "%: Out Of Memory%",
                             "%out of memory: kill%process%", "%std::bad_alloc%")),
    ("unknown", "divergence", ("%loss scale already at minimum%", "%Loss became infinite or NaN%",
                               "%found NaN in local grad norm%")),
    ("unknown", "invalid_config", ("%is not divisible by%", "%must be divisible by%", "%Invalid parallel dims%")),
    ("scheduler_cancelled", "node_failure", ("%DUE TO NODE FAILURE%", "%Node failure on%")),
)


def _relabel(old: str, new: str, patterns: tuple[str, ...]) -> None:
    match = " OR ".join(f"error_message ILIKE :p{i}" for i in range(len(patterns)))
    op.execute(sa.text(f"UPDATE runs SET error_class = :new WHERE error_class = :old AND ({match})")
               .bindparams(old=old, new=new, **{f"p{i}": p for i, p in enumerate(patterns)}))


def upgrade() -> None:
    for old, new, patterns in _RELABEL:
        _relabel(old, new, patterns)


def downgrade() -> None:
    for old, new, _ in _RELABEL:
        op.execute(sa.text("UPDATE runs SET error_class = :old WHERE error_class = :new").bindparams(old=old, new=new))
