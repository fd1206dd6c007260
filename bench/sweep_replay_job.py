#!/usr/bin/env python
"""The "job" of bench/sweep_replay.py: runs one leased configuration by looking it up in the real rows.

    SCALEBOOK_RUN_KEY=… SCALEBOOK_CONFIG='{…}' python bench/sweep_replay_job.py RESULTS.json

RESULTS.json is {"key_fields": [...], "results": {json([config values in key_fields order]): finish
record}}, written by bench/sweep_replay.py from the cell's rows of the Ultra-Scale sweep. The job
finishes its run (the one `scalebook agent` opened under SCALEBOOK_RUN_KEY) with the matching record,
as an integration would; a configuration the sweep never ran is finished as failed, saying so.
Standard library and ingest only (what a training environment has).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest.client import Client  # noqa: E402


def main() -> int:
    table = json.loads(Path(sys.argv[1]).read_text())
    config = json.loads(os.environ["SCALEBOOK_CONFIG"])
    key = json.dumps([config[k] for k in table["key_fields"]])
    record = table["results"].get(key) or {
        "status": "failed", "error_message": "replay: the Ultra-Scale sweep has no run of this configuration"}
    result = Client(deadline_s=30.0).push({"run_key": os.environ["SCALEBOOK_RUN_KEY"], **record})
    print(f"replayed {key}: {record['status']} {record.get('tokens_per_sec_per_gpu') or ''} (push {result.status})")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
