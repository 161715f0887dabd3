#!/usr/bin/env python3
"""Copies a bench's JSON lines from stdin to stdout and appends them to its results file.

    record.py RESULTS_TSV REVISION < json-lines

Each number of a line becomes one row of RESULTS_TSV (date, metric, value, spread, load,
note; tests/bench/README.md, "Results files"): `KEY_spread` ([lo, hi]) and `KEY_rounds`
(a list of numbers) go in KEY's spread; load is the 1-minute load average when the line
arrived; the note names the revision and the line's part, ranks and shape. Lines that are
not JSON objects, per-round lines (`"round"`) and skipped parts pass through unrecorded.
"""

import datetime
import json
import sys
from typing import Any

IDENTITY = ("part", "ranks", "limit_k", "heartbeat_interval_ms", "bytes")
SKIP = {"bench", "summary", "rounds", "round", "target_met"}


def spread(line: dict[str, Any], key: str) -> str:
    lo_hi = line.get(key + "_spread")
    if isinstance(lo_hi, list) and len(lo_hi) == 2:
        return f"{lo_hi[0]}-{lo_hi[1]}"
    rounds = line.get(key + "_rounds")
    if isinstance(rounds, list) and all(isinstance(v, (int, float)) for v in rounds):
        return "rounds " + ",".join(str(v) for v in rounds)
    return ""


def rows(line: dict[str, Any], revision: str) -> list[str]:
    with open("/proc/loadavg") as f:
        load = "load " + f.read().split()[0]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    ident = [f"{k}={line[k]}" for k in IDENTITY if k in line]
    note = " ".join(["run --record", revision, *ident])
    out = []
    for key, value in line.items():
        if key in SKIP or key in IDENTITY or isinstance(value, bool):
            continue
        if not isinstance(value, (int, float)):
            continue
        out.append("\t".join([date, key, str(value), spread(line, key), load, note]))
    return out


def main() -> int:
    path, revision = sys.argv[1], sys.argv[2]
    for text in sys.stdin:
        sys.stdout.write(text)
        sys.stdout.flush()
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if not isinstance(line, dict) or "round" in line or "skipped" in line:
            continue
        with open(path, "a") as f:
            for row in rows(line, revision):
                f.write(row + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
