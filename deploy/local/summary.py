#!/usr/bin/env python3
"""The main job's summary: reads the ranks' logs on stdin, prints the loss
curve (a text sparkline, and a PNG through gnuplot when it is installed),
the held-out loss curve when the ranks logged one (`eval step N loss X`: the
training loss follows how hard each step's batch is, the held-out loss on
one fixed set shows the learning) and tokens/s, then proves with the
dataloader's Explain that no data was served twice (or skipped) over every
step trained: steps 1..last, each once, at world size 1 (the whole global
batch). Exits 1 when the proof fails.

With --reference LOG (an uninterrupted run's log) and --restored STEP it
also prints, for every step after the restore, the loss next to the
uninterrupted run's loss at the same step, and ends with the line
"after restore: max relative loss difference vs uninterrupted run: X";
exits 1 when X exceeds 1e-4.

Usage: ... | summary.py OUT_DIR STOKERCTL [JOB] [--reference LOG --restored STEP]
       (STOKER_DATALOADER set)
"""

import argparse
import itertools
import json
import re
import shutil
import subprocess
import sys

LINE = re.compile(r"step (\d+) loss ([0-9.e+-]+) tokens/s ([0-9.]+) world (\d+)")
EVAL_LINE = re.compile(r"eval step (\d+) loss ([0-9.e+-]+)")
TOLERANCE = 1e-4


def read_logs(text):
    """Last (loss, tokens/s, world) logged per step: after a restore the
    re-trained steps replace the ones lost."""
    steps = {}
    for line in text.splitlines():
        m = LINE.search(line)
        if m:
            steps[int(m[1])] = (float(m[2]), float(m[3]), int(m[4]))
    return dict(sorted(steps.items()))


def read_eval(text):
    """Last held-out loss logged per step."""
    evals = {int(m[1]): float(m[2]) for m in map(EVAL_LINE.search, text.splitlines()) if m}
    return dict(sorted(evals.items()))


def sparkline(values, width=60):
    bars = "▁▂▃▄▅▆▇█"
    if not values:
        return ""
    chunk = max(1, len(values) // width)
    vals = [
        sum(values[i : i + chunk]) / len(values[i : i + chunk])
        for i in range(0, len(values), chunk)
    ]
    lo, hi = min(vals), max(vals)
    span = hi - lo or 1.0
    return "".join(bars[int((v - lo) / span * (len(bars) - 1))] for v in vals)


def plot(steps, evals, out_dir):
    if not shutil.which("gnuplot"):
        print("  (gnuplot not installed: no PNG)")
        return
    data = f"{out_dir}/loss.dat"
    with open(data, "w") as f:
        for s, (loss, _, _) in steps.items():
            f.write(f"{s} {loss}\n")
    series = f"'{data}' with lines title 'training loss'"
    if evals:
        eval_data = f"{out_dir}/eval-loss.dat"
        with open(eval_data, "w") as f:
            for s, loss in evals.items():
                f.write(f"{s} {loss}\n")
        series += f", '{eval_data}' with linespoints lw 2 title 'held-out loss'"
    png = f"{out_dir}/loss.png"
    script = (
        f"set terminal png size 800,400; set output '{png}'; set xlabel 'step';"
        f"set ylabel 'loss'; plot {series}"
    )
    subprocess.run(["gnuplot", "-e", script], check=True)
    print(f"  loss curve: {png}")


def explain(ctl, job, step):
    run = subprocess.run(
        [ctl, "--json", "loader", "explain", job, str(step)], capture_output=True, text=True
    )
    if run.returncode != 0:
        sys.exit(f"explain of step {step} failed (exit {run.returncode}): {run.stderr.strip()}")
    return json.loads(run.stdout)["sources"]


def check_no_repeats(ctl, job, last):
    """Every (dataset, epoch, unit) is served as disjoint token ranges that
    together form [0, n): nothing twice, nothing skipped; and no token of a
    document (file, index in the file) is served twice in an epoch."""
    ranges = {}
    docs = {}
    for step in range(0, last):  # Loader steps: trainer step s used loader step s - 1.
        for s in explain(ctl, job, step):
            key = (s["dataset"], s["epoch"], s["unit"])
            ranges.setdefault(key, []).append((s["token_begin"], s["token_end"]))
            doc = (s["dataset"], s["epoch"], s["file"], s["document"])
            docs.setdefault(doc, []).append((s["doc_token_begin"], s["doc_token_end"]))
    tokens = 0
    for key, rs in ranges.items():
        rs.sort()
        at = 0
        for b, e in rs:
            if b != at:
                what = "served twice" if b < at else "skipped"
                print(f"  FAIL: {key} tokens [{min(b, at)}, {max(b, at)}) {what}: {rs}")
                return False
            at = e
        tokens += at
    for key, rs in docs.items():
        rs.sort()
        for (_, e), (b, _) in itertools.pairwise(rs):
            if b < e:
                print(f"  FAIL: document {key} tokens [{b}, {e}) served twice: {rs}")
                return False
    print(
        f"  no data repeated or skipped: steps 1..{last}, {len(ranges)} units, "
        f"{len(docs)} documents, {tokens} tokens each served exactly once"
    )
    return True


def compare(steps, reference, restored):
    """Losses after the restore next to the uninterrupted run's; the largest
    relative difference (inf when a step is missing from either)."""
    after = [s for s in steps if s > restored]
    print(f"  after the restore at step {restored}: step, loss, uninterrupted loss, relative diff")
    worst = 0.0 if after else float("inf")
    for s in after:
        if s not in reference:
            print(f"    {s:5d}  {steps[s][0]:.6f}  (no step {s} in the uninterrupted run)")
            worst = float("inf")
            continue
        got, want = steps[s][0], reference[s][0]
        rel = abs(got - want) / max(abs(want), 1e-12)
        worst = max(worst, rel)
        print(f"    {s:5d}  {got:.6f}  {want:.6f}  {rel:.2e}")
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("ctl")
    ap.add_argument("job", nargs="?", default="demo")
    ap.add_argument("--reference", help="log of an uninterrupted run of the same job")
    ap.add_argument("--restored", type=int, default=0, help="step the survivors restored")
    args = ap.parse_args()
    text = sys.stdin.read()
    steps = read_logs(text)
    evals = read_eval(text)
    if not steps:
        print("  no steps logged")
        return 1
    losses = [v[0] for v in steps.values()]
    last = max(steps)
    print(f"  steps trained: 1..{last}; loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    print(f"  loss curve: {sparkline(losses)}")
    if evals:
        ev = list(evals.values())
        print(
            f"  held-out loss, steps {min(evals)}..{max(evals)}: {ev[0]:.3f} -> {ev[-1]:.3f} "
            f"{sparkline(ev)}"
        )
    for w in sorted({v[2] for v in steps.values()}, reverse=True):
        tps = sorted(v[1] for v in steps.values() if v[2] == w)
        print(f"  tokens/s at {w} ranks: median {tps[len(tps) // 2]:.0f}")
    plot(steps, evals, args.out_dir)
    ok = check_no_repeats(args.ctl, args.job, last)
    if args.reference:
        with open(args.reference) as f:
            worst = compare(steps, read_logs(f.read()), args.restored)
        print(f"after restore: max relative loss difference vs uninterrupted run: {worst:.3e}")
        ok = ok and worst <= TOLERANCE
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
