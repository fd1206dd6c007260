"""Framework integrations: one scalebook run per training job, from the hooks of the framework.

    from ingest.integrations import ScalebookCallback           # Hugging Face Trainer
    from ingest.integrations import ScalebookLightningCallback  # Lightning (``lightning.pytorch``)
    from ingest.integrations import ScalebookPLCallback         # Lightning as ``pytorch_lightning``
    from ingest.integrations import ScalebookTracker            # Accelerate ``log_with=[...]``

Each name imports its framework on first access only, so ``import ingest.integrations`` needs the
standard library alone. Shared machinery: :mod:`ingest.integrations.common`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ScalebookCallback", "ScalebookLightningCallback", "ScalebookPLCallback", "ScalebookTracker"]

_WHERE = {
    "ScalebookCallback": "ingest.integrations.hf_trainer",
    "ScalebookLightningCallback": "ingest.integrations.lightning_callback",
    "ScalebookPLCallback": "ingest.integrations.lightning_callback",
    "ScalebookTracker": "ingest.integrations.accelerate_tracker",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ingest.integrations' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
