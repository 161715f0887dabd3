#!/usr/bin/env python3
"""A rolling update of a scaled-out dataloader under a training job, as on
Kubernetes: each part is stopped (SIGTERM), and comes back on its state at
a new address under the same DNS name.

Two dataloader parts are reached by name only, through a name server of the
test's own (dns_stub.py; the ranks' target is dns://127.0.0.1:PORT/dlN...:P,
so gRPC's own DNS resolver asks it): both names first say 127.0.0.2. Two
stoker-train ranks train STEPS steps. Mid-run, part 1 and then part 0 (a
StatefulSet updates the highest ordinal first) get SIGTERM, their name moves
to 127.0.0.3 and the part starts again there on its data directory: nothing
listens at the old address any more. The job must train on through both
(the coordinator's generation stays 1: no rank failed, none restarted), the
ranks' clients must have asked DNS again for both names, and the per-step
loss and the final parameters must equal those of the same job trained with
no update (the same batches, bit for bit).

Then both parts start again (at the new address) with
--max-connection-age 1s --max-connection-age-grace 1s: every connection is
sent away after about a second and closed under its batch stream a second
later. A third job trains through those cuts: generation 1, the same loss and
parameters, and the parts counted more StreamBatches calls than the ranks
opened (each cut stream reopened from its next step).

Fails without the client's reconnect: the dataloader ends each stream with
UNAVAILABLE ("shutting down; resume from step N") and the ranks' generation
ended there; the next generations failed on the old address for 30 s and
more (the part's long-lived channel, its calls failing at once, asked DNS
again only 31 s after the disconnect).

Usage: test_train_dl_rolling.py COORDINATOR DATALOADER CHECKPOINT STOKER_TRAIN STOKERCTL
"""

import os
import re
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "local")
)
import summary  # The trainer's log parser.
from dns_stub import NameServer
from train_harness import corpus, create_job, job_json, launch, start, wait_all, workspace

STEPS, EVERY = 240, 40
OLD, NEW = "127.0.0.2", "127.0.0.3"
STREAMS = re.compile(
    r'^grpc_server_started_total\{[^}]*grpc_method="StreamBatches"[^}]*\} (\d+)', re.M
)


def name(i):
    return f"dl{i}.stoker.test"


def train_args(loader, data, out):
    return [
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
    ]


def log(work, job):
    return "".join(Path(work, f"{job}-{job}{i}.log").read_text() for i in range(2))


def last_step(work, job):
    steps = summary.read_logs(log(work, job))
    return max(steps) if steps else 0


def wait_step(work, job, step, procs, timeout=120):
    end = time.time() + timeout
    while last_step(work, job) < step:
        for m, p in procs.items():
            assert p.poll() is None, f"{m} exited {p.returncode} before step {step}"
        assert time.time() < end, f"{job} did not reach step {step}"
        time.sleep(0.05)


def roll(bins, work, ns, parts, i):
    """Part i stopped, its name moved to NEW, started there again."""
    p, port = parts[i]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 0, f"part {i} exited {p.returncode} on SIGTERM"
    ns.set(name(i), NEW)
    p, addr = start(bins[1], work, f"dataloader-{i}", "--part", f"{i}/2", listen=f"{NEW}:{port}")
    assert addr == f"{NEW}:{port}", addr
    parts[i] = (p, port)
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def streams_started(port):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = STREAMS.search(body)
    return int(m[1]) if m else 0


def run(bins, env, work, job, loader, data):
    """Two ranks of a new coordinator job, started; their processes."""
    create_job(bins[4], env, job, 2, 2, "1s", "300ms", misses=5)
    args = train_args(loader, data, f"{work}/{job}.bin")
    return launch(bins[3], env, work, job, [f"{job}0", f"{job}1"], args)


def same_as_steady(work, env, job, steady):
    """The job's per-step loss and parameters are the steady run's, and it
    never left generation 1."""
    got = summary.read_logs(log(work, job))
    assert [v[0] for v in got.values()] == [v[0] for v in steady.values()], (
        f"{job}: the per-step loss differs from the run without interruptions"
    )
    assert Path(work, f"{job}.bin").read_bytes() == Path(work, "steady.bin").read_bytes(), (
        f"{job}: the parameters differ from the run without interruptions"
    )
    gen = job_json(env["STOKERCTL"], env, job)["generation"]
    assert gen == 1, f"{job} restarted (generation {gen}): {log(work, job)[-2000:]}"


def main():
    bins = sys.argv[1:6]
    with workspace("stoker-train-rolling.") as (work, procs):
        ns = NameServer()
        p, caddr = start(bins[0], work, "coordinator")
        procs.append(p)
        p, kaddr = start(bins[2], work, "checkpoint", "--coordinator", caddr)
        procs.append(p)
        parts = {}
        for i in range(2):
            p, addr = start(bins[1], work, f"dataloader-{i}", "--part", f"{i}/2", listen=f"{OLD}:0")
            procs.append(p)
            parts[i] = (p, addr.rsplit(":", 1)[1])
            ns.set(name(i), OLD)
        loader = ",".join(f"{ns.authority()}{name(i)}:{parts[i][1]}" for i in range(2))
        env = dict(
            os.environ,
            STOKER_COORDINATOR=caddr,
            STOKER_CHECKPOINT=kaddr,
            OMP_NUM_THREADS="1",
            STOKERCTL=bins[4],
        )
        env.pop("STOKER_DATALOADER", None)
        data = corpus(work)

        wait_all(run(bins, env, work, "steady", loader, data), 600)
        steady = summary.read_logs(log(work, "steady"))
        assert sorted(steady) == list(range(1, STEPS + 1)), log(work, "steady")

        ranks = run(bins, env, work, "rolled", loader, data)
        wait_step(work, "rolled", 10, ranks)
        asked = {i: ns.queries(name(i)) for i in range(2)}
        for i in (1, 0):
            at = last_step(work, "rolled")
            procs.append(roll(bins, work, ns, parts, i))
            wait_step(work, "rolled", last_step(work, "rolled") + 5, ranks)
            print(
                f"part {i}: stopped at step {at}, back at {NEW}; trained on to "
                f"{last_step(work, 'rolled')}"
            )
        done = last_step(work, "rolled")
        assert done < STEPS, f"the job ended (step {done}) before the update was over"
        wait_all(ranks, 600)
        same_as_steady(work, env, "rolled", steady)
        again = {i: ns.queries(name(i)) - asked[i] for i in range(2)}
        assert all(n > 0 for n in again.values()), f"no new DNS query for a part: {again}"
        print(
            f"rolling update of both parts mid-run: generation 1 throughout, {STEPS} steps, "
            f"loss and parameters identical to the run without it; DNS asked again {again}"
        )

        ports = []
        for i in range(2):
            p, port = parts[i]
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=60) == 0, f"part {i} exited {p.returncode} on SIGTERM"
            ports.append(free_port())
            age = ("--max-connection-age", "1s", "--max-connection-age-grace", "1s")
            metrics = ("--metrics-listen", f"127.0.0.1:{ports[-1]}")
            p, _ = start(
                bins[1],
                work,
                f"dataloader-{i}",
                "--part",
                f"{i}/2",
                *age,
                *metrics,
                listen=f"{NEW}:{port}",
            )
            procs.append(p)
        wait_all(run(bins, env, work, "aged", loader, data), 600)
        same_as_steady(work, env, "aged", steady)
        opened = [streams_started(port) for port in ports]
        assert all(n > 2 for n in opened), f"no stream was cut and reopened: {opened}"
        print(
            f"connections closed at their max age under the streams: generation 1, loss and "
            f"parameters identical; StreamBatches calls per part {opened} for 2 ranks"
        )
        ns.close()
    print("ok")


if __name__ == "__main__":
    main()
