"""scalebook's training-side agent: push client + spool, parsers, failure classifier, torch recorder.

Imports with the standard library alone. ``Recorder`` is loaded lazily, so ``import ingest`` never
imports torch (only ``from ingest import Recorder`` / ``ingest.Recorder`` does).
"""

from ingest.client import Client, PushError, PushResult, SyncResult

__all__ = ["Client", "PushError", "PushResult", "Recorder", "SyncResult"]


def __getattr__(name: str):
    if name == "Recorder":
        from ingest.recorder import Recorder

        return Recorder
    raise AttributeError(f"module 'ingest' has no attribute {name!r}")
