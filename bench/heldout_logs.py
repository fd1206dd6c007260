"""Issue 27's held-out figures: the log reader and the failure classifier on material they were never
tuned on (``bench/data/heldout/``: public excerpts, each with its source URL, labelled by hand and
frozen in git before the reader and the rules were changed for issue 27).

Logs (``logs.json``): a log is *right* when it is refused exactly where the label says ``refused``
and otherwise stored with the labelled ``status`` (and ``error_class`` where labelled). Each labelled
fact is *stated*; it is *stored* when the record has the field, and *wrong* when the stored value is
not the labelled one -- a config fact must be equal, a metric must lie within the [min, max] of the
values the excerpt prints (0.5 % slack for the printed rounding), in run-record units (MFU a
fraction, memory GiB, step time s).

Lines (``failure_lines.csv``, frozen before issue 27's rules ran on them; ``failure_lines_2.csv``, a second
set frozen after the second round of development rules and before they ran on it;
``failure_lines_3.csv``, 27 lines from 25 further repositories, frozen in its own commit before the
third round of rules was written -- lines whose repository's SHA-1 mod 100 < 32 went here, the rest
to the development split ``issue27-dev3`` of tests/data/failures/labelled_lines.csv; an empty label
means "not an error line"; ``failure_lines_4.csv``, 14 lines from 14 more repositories, collected and
frozen after the third round's rules were final): ``classify_line`` against the hand label.

Usage: python bench/heldout_logs.py [--details]   (prints the figures; --details lists every miss)
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.classify import classify_line  # noqa: E402
from ingest.parsers.logs import LogNotRecognised, parse_log  # noqa: E402

DATA = ROOT / "bench" / "data" / "heldout"
SLACK = 0.005


def fact_ok(want: Any, got: Any) -> bool:
    """Whether a stored value is the labelled one (see the module docstring)."""
    if isinstance(want, list):
        lo, hi = want
        return isinstance(got, (int, float)) and lo * (1 - SLACK) <= got <= hi * (1 + SLACK)
    return bool(got == want)


def score_logs(details: bool) -> dict[str, Any]:
    """Status right / facts stated, stored, wrong over logs.json."""
    manifest = json.loads((DATA / "logs.json").read_text(encoding="utf-8"))["logs"]
    out = {"logs": len(manifest), "right": 0, "stated": 0, "stored": 0, "wrong": 0,
           "frameworks": len({m["framework"] for m in manifest})}
    for item in manifest:
        text = (DATA / "logs" / item["file"]).read_text(encoding="utf-8")
        try:
            record: dict[str, Any] | None = parse_log(text)
        except LogNotRecognised as exc:
            record, why = None, str(exc)
        if record is None:
            right = item["expect"] == "refused"
            got = f"refused ({why[:80]})"
        else:
            right = (item["expect"] == "stored" and record.get("status") == item.get("status")
                     and ("error_class" not in item or record.get("error_class") == item["error_class"]))
            got = f"{record.get('status')}/{record.get('error_class')}"
        out["right"] += right
        if details and not right:
            print(f"  status  {item['file']}: want {item['expect']} {item.get('status')}/{item.get('error_class')}, "
                  f"got {got}")
        for key, want in item["facts"].items():
            out["stated"] += 1
            if record is None or record.get(key) is None:
                if details:
                    print(f"  missing {item['file']}: {key} = {want}")
                continue
            out["stored"] += 1
            if not fact_ok(want, record[key]):
                out["wrong"] += 1
                if details:
                    print(f"  WRONG   {item['file']}: {key} = {record[key]!r}, labelled {want!r}")
    return out


def score_lines(details: bool, name: str = "failure_lines.csv") -> dict[str, Any]:
    """Lines classified right over one held-out line file."""
    with open(DATA / name, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    right = 0
    for row in rows:
        got = classify_line(row["line"])
        want = row["error_class"] or None  # an empty label: not an error line
        right += got == want
        if details and got != want:
            print(f"  line    want {want}, got {got}: {row['line'][:110]}")
    return {"lines": len(rows), "right": right}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--details", action="store_true", help="list every miss")
    args = parser.parse_args()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    logs = score_logs(args.details)
    lines = score_lines(args.details)
    print(f"commit {commit}")
    print(f"logs: {logs['right']}/{logs['logs']} stored or refused with the right status "
          f"({logs['frameworks']} frameworks); facts stated {logs['stated']}, stored {logs['stored']} "
          f"({100 * logs['stored'] / max(logs['stated'], 1):.0f} %), wrong {logs['wrong']}")
    print(f"failure lines: {lines['right']}/{lines['lines']} classified right "
          f"({100 * lines['right'] / max(lines['lines'], 1):.0f} %)")
    second = score_lines(args.details, "failure_lines_2.csv")
    print(f"failure lines, second set: {second['right']}/{second['lines']} classified right "
          f"({100 * second['right'] / max(second['lines'], 1):.0f} %)")
    third = score_lines(args.details, "failure_lines_3.csv")
    print(f"failure lines, third set: {third['right']}/{third['lines']} classified right "
          f"({100 * third['right'] / max(third['lines'], 1):.0f} %)")
    fourth = score_lines(args.details, "failure_lines_4.csv")
    print(f"failure lines, fourth set: {fourth['right']}/{fourth['lines']} classified right "
          f"({100 * fourth['right'] / max(fourth['lines'], 1):.0f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
