#!/usr/bin/env python3
"""One stamped line per object that `kubectl get -w -o json` prints (a stream
of JSON objects, not lines): a Workload's podset count and conditions, or a
pod's phase, readiness and deletion; elastic-bench's timeline of a run.

    kubectl get workloads,pods -w -o json | watch-lines.py
"""

import json
import sys
import time


def summary(obj: dict) -> str:
    meta, status = obj.get("metadata", {}), obj.get("status", {})
    conds = {c.get("type"): c.get("status") for c in status.get("conditions", [])}
    if obj.get("kind") == "Workload":
        count = ",".join(str(p.get("count")) for p in obj.get("spec", {}).get("podSets", []))
        shown = ",".join(f"{t}={s}" for t, s in sorted(conds.items()))
        return f"wl {meta.get('name')} count={count} {shown}"
    deleting = " deleting" if meta.get("deletionTimestamp") else ""
    return f"pod {meta.get('name')} {status.get('phase')} ready={conds.get('Ready', '-')}{deleting}"


def main() -> None:
    decoder = json.JSONDecoder()
    buf = ""
    for chunk in iter(lambda: sys.stdin.readline(), ""):
        buf += chunk
        while True:
            text = buf.lstrip()
            if not text:
                buf = ""
                break
            try:
                obj, end = decoder.raw_decode(text)
            except json.JSONDecodeError:
                buf = text  # An object not yet whole: read on.
                break
            buf = text[end:]
            print(f"{time.time():.3f} {summary(obj)}", flush=True)


if __name__ == "__main__":
    main()
