#!/usr/bin/env python3
"""A scaled-out dataloader (two processes, --part 0/2 and 1/2) feeding
stoker-train and stokerctl, against one process serving the whole job.

stokerctl: `loader create|show|mixture|explain|commit` with a two-address
--dataloader list give what one process gives (explain: the same runs in the
same order), show reports the oldest committed step over the parts, and a
mixture reaches every part.

stoker-train: two ranks train 8 steps with a checkpoint at step 4 and 8, once
against the single process and once against the two parts: the per-step loss
and the final parameters (every unit gathered, --dump-params) are the same bit
for bit. Restoring the parts' checkpoint at step 4 against the parts, the
single process's checkpoint against the parts (one blob imported into two
processes) and the parts' checkpoint against the single process (two blobs
into one) all finish with those same parameters.

Usage: test_train_loader_parts.py COORDINATOR DATALOADER CHECKPOINT STOKER_TRAIN STOKERCTL
"""

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "local")
)
import summary  # The trainer's log parser.
from train_harness import corpus, create_job, launch, start, wait_all, workspace

STEPS, EVERY = 8, 4
CREATE = [
    "--dataset",
    "web=synthetic:1000:20:300:1@3",
    "--dataset",
    "code=synthetic:200:10:50:2",
    "--seq-len",
    "127",
    "--global-batch",
    "8",
    "--seed",
    "5",
    "--shards",
    "8",
    "--lanes",
    "4",
    "--eos",
    "7",
]


def ctl(bins, env, addrs, *args, rc=0):
    p = subprocess.run(
        [bins[4], "--dataloader", addrs, *args], env=env, capture_output=True, text=True
    )
    assert p.returncode == rc, f"{args}: exit {p.returncode}, want {rc}: {p.stderr}"
    return p.stdout


def ctl_json(bins, env, addrs, *args):
    return json.loads(ctl(bins, env, addrs, "--json", *args))


def check_ctl(bins, env, whole, parts):
    p0 = parts.split(",")[0]
    for addrs in (whole, parts):
        ctl(bins, env, addrs, "loader", "create", "cx", *CREATE)
    ctl(bins, env, parts, "loader", "create", "cx", *CREATE, rc=3)  # Exists on part 0.
    assert ctl_json(bins, env, parts, "loader", "show", "cx") == ctl_json(
        bins, env, whole, "loader", "show", "cx"
    )
    for args in (["3", "--rank", "1", "--world", "2"], ["6", "--rank", "0", "--world", "4"]):
        want = ctl(bins, env, whole, "--json", "loader", "explain", "cx", *args)
        assert ctl(bins, env, parts, "--json", "loader", "explain", "cx", *args) == want, args
        assert ctl(bins, env, parts, "loader", "explain", "cx", *args) == ctl(
            bins, env, whole, "loader", "explain", "cx", *args
        ), args
    args = ["loader", "explain", "cx", "3", "--rank", "1", "--world", "2"]  # Lines 28-31.
    half = ctl_json(bins, env, p0, *args)["sources"]
    assert 0 < len(half) < len(ctl_json(bins, env, whole, *args)["sources"]), "not partial"
    ctl(bins, env, parts, "loader", "commit", "cx", "5")
    ctl(bins, env, p0, "loader", "commit", "cx", "7")
    assert ctl_json(bins, env, p0, "loader", "show", "cx")["committed_step"] == 7
    assert ctl_json(bins, env, parts, "loader", "show", "cx")["committed_step"] == 5
    mix = [
        "loader",
        "mixture",
        "cx",
        "--from-step",
        "9",
        "--dataset",
        "web=synthetic:1000:20:300:1@1",
        "--global-batch",
        "16",
    ]
    ctl(bins, env, whole, "loader", "commit", "cx", "5")
    for addrs in (whole, parts):
        ctl(bins, env, addrs, *mix)
    for addrs in parts.split(","):
        assert ctl_json(bins, env, addrs, "loader", "show", "cx")["global_batch"] == 16
    args = ["loader", "explain", "cx", "10", "--rank", "1", "--world", "2"]
    assert ctl(bins, env, parts, *args) == ctl(bins, env, whole, *args)
    ctl(bins, env, parts, "loader", "show", "nope", rc=2)
    rows = [json.loads(line) for line in ctl(bins, env, parts, "--json", "health").splitlines()]
    assert [r["address"] for r in rows if r["service"] == "dataloader"] == parts.split(","), rows
    assert all(r.get("status") == "SERVING" for r in rows), rows
    print("stokerctl: two parts show, explain, commit and check health as one process")


def train(bins, env, work, job, loader, data, *extra):
    """Two ranks of coordinator job `job`; returns the dumped parameters."""
    create_job(bins[4], env, job, 2, 2, "200ms", "300ms")
    out = os.path.join(work, f"{job}.bin")
    procs = launch(
        bins[3],
        env,
        work,
        job,
        [f"{job}0", f"{job}1"],
        [
            "--dataloader",
            loader,
            "--corpus",
            data,
            "--steps",
            str(STEPS),
            "--checkpoint-every",
            str(EVERY),
            "--dump-params",
            out,
            *extra,
        ],
    )
    wait_all(procs, 120)
    params = Path(out).read_bytes()
    assert len(params) > 0
    return params


def log(work, job):
    """Both ranks' logs (rank 0, whichever member it is, logs the steps)."""
    return "".join(Path(work, f"{job}-{job}{i}.log").read_text() for i in range(2))


def check_training(bins, env, work, whole, parts, data):
    one = train(bins, env, work, "one", whole, data)
    two = train(bins, env, work, "two", parts, data)
    losses = summary.read_logs(log(work, "one"))
    assert sorted(losses) == list(range(1, STEPS + 1)), log(work, "one")
    assert [v[0] for v in summary.read_logs(log(work, "two")).values()] == [
        v[0] for v in losses.values()
    ], "the per-step loss differs with two loader parts"
    assert one == two, "parameters trained with two loader parts differ"
    assert "checkpoint committed at step 4" in log(work, "two")
    print(f"two loader parts: {STEPS} steps, loss and {len(one) // 4} parameters identical")
    for job, data_job, loader in (
        ("rp", "two", parts),
        ("r21", "one", parts),
        ("r12", "two", whole),
    ):
        got = train(
            bins, env, work, job, loader, data, "--data-job", data_job, "--restore-from", str(EVERY)
        )
        assert f"restored step {EVERY} at world size 2" in log(work, job), log(work, job)
        assert got == one, f"restore of {data_job} against {loader}: parameters differ"
        for addr in loader.split(","):  # The checkpoint's loader state reached every process.
            info = ctl_json(bins, env, addr, "loader", "show", data_job)
            assert info["committed_step"] == EVERY - 1, (job, addr, info)
    print(f"restored step {EVERY}: parts -> parts, 1 -> 2 and 2 -> 1 loader processes: identical")


def main():
    bins = sys.argv[1:6]
    with workspace("stoker-train-parts.") as (work, daemons):
        p, caddr = start(bins[0], work, "coordinator")
        daemons.append(p)
        p, whole = start(bins[1], work, "dataloader")
        daemons.append(p)
        addrs = []
        for i in range(2):
            p, a = start(bins[1], work, f"dataloader-{i}", "--part", f"{i}/2")
            daemons.append(p)
            addrs.append(a)
        parts = ",".join(addrs)
        p, kaddr = start(bins[2], work, "checkpoint", "--coordinator", caddr)
        daemons.append(p)
        env = dict(
            os.environ, STOKER_COORDINATOR=caddr, STOKER_CHECKPOINT=kaddr, OMP_NUM_THREADS="1"
        )
        env.pop("STOKER_DATALOADER", None)
        check_ctl(bins, env, whole, parts)
        check_training(bins, env, work, whole, parts, corpus(work))
    print("ok")


if __name__ == "__main__":
    main()
