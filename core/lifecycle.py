"""The live-run lifecycle (DESIGN §9), standard library only: when a running run reads as lost.

A job opens its run (`status: running`), heartbeats, and finishes it once with a terminal status
(core.record.STATUSES). Nothing of ours wakes up to mark a silent job: `lost` is derived whenever the
run is read, from `last_heartbeat_at` and the clock —

    lost  ⇔  stored status is `running`  and  last_heartbeat_at < now − lost_after_s

— so a lost run that heartbeats again reads as running again. The service's SQL form of the same rule
is service/lifecycle.py (it takes `lost_cutoff` from here).

The default threshold, 300 s, is Weights & Biases' practice (W&B marks a run crashed after about five
minutes without a heartbeat from its process; W&B documentation, run states): long enough for a checkpoint write or a
slow evaluation between heartbeats of a healthy job, short enough that a hung sweep is seen the same hour.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from core.record import LOST, RUNNING

#: default `lost_after_s` (setting SCALEBOOK_LOST_AFTER_S), seconds
DEFAULT_LOST_AFTER_S = 300.0

#: how often the agents heartbeat by default, seconds: several heartbeats fit in DEFAULT_LOST_AFTER_S,
#: so one late or dropped heartbeat never reads as lost
DEFAULT_HEARTBEAT_S = 30.0


def lost_cutoff(now: datetime, lost_after_s: float) -> datetime:
    """The instant before which a last heartbeat means lost: `now − lost_after_s` (same tz-ness as `now`).
    Raises ValueError for a threshold that is not positive."""
    if not lost_after_s > 0:
        raise ValueError(f"lost_after_s must be positive, got {lost_after_s!r}")
    return now - timedelta(seconds=lost_after_s)


def read_status(status: str, last_heartbeat_at: datetime | None, now: datetime, lost_after_s: float) -> str:
    """The status a run reads as at `now`: LOST for a RUNNING run whose last heartbeat (naive UTC, as
    stored, like `now`) is older than `lost_after_s` seconds — or that never heartbeat at all —
    otherwise the stored `status` unchanged."""
    if status != RUNNING:
        return status
    if last_heartbeat_at is None or last_heartbeat_at < lost_cutoff(now, lost_after_s):
        return LOST
    return RUNNING
