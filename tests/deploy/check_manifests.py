#!/usr/bin/env python3
"""The fast check of deploy/k8s, in the default test run: the example overlay
renders, and what the manifests tell the programs exists in them.

- every `--flag` a container command passes to a daemon, stokerctl or
  stoker-train appears in that program's --help; for the PyTorch
  trainer (components/pytorch), the flags before the script in torchrun's
  --help, the rendezvous backend registered under torchrun's entry point,
  the flags after it in trainer/python/train_gpt.py's --help, and every
  STOKER_* variable one the stoker package reads;
- every `$(NAME)` in a command is a variable of its container (the kubelet
  leaves an unknown one as written);
- every `name = value` line of the config files in the ConfigMap is an
  option of the daemon the file is for;
- every STOKER_<SERVICE>_* variable set is one the daemon reads (its --help
  names each option's variable);
- probes (gRPC, or `stokerctl health` run in the pod when TLS is on) check
  the ports the daemons listen on, and an exec probe's timeoutSeconds is
  longer than its command's --timeout; each pod's termination grace is at
  least the daemon's shutdown-grace;
- a training Job's pods (stoker-train, torchrun) get a
  terminationGracePeriodSeconds at least the floor deploy/k8s/README.md
  documents ("Grace period of training pods", measured from a preemption
  notice to every rank staged): below it an eviction kills ranks before their
  last checkpoint is staged.
- every probe of every workload (any kind: gRPC, exec, HTTP, TCP) states a
  timeoutSeconds of at least PROBE_MIN_TIMEOUT_S (the kubelet's default of
  1 s failed healthy daemons on a loaded node), a liveness probe gives up
  only after LIVENESS_MIN_WINDOW_S of failures, a startup probe allows
  STARTUP_MIN_WINDOW_S (deploy/k8s/README.md, "Probes").

    check_manifests.py RENDER_SH OVERLAY_DIR PROGRAM... [--python PYTHON]
                       [--must-refuse TEXT]
PROGRAMs are the paths of stoker-coordinator, stoker-dataloader,
stoker-checkpoint, stokerctl and stoker-train; PYTHON one with torch and the
stoker package (the project's .venv): without it the PyTorch commands are
reported as not checked. Exits 1 listing every mismatch; with --must-refuse,
0 only when some mismatch names TEXT (a manifest made to be refused).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

DAEMONS = ("stoker-coordinator", "stoker-dataloader", "stoker-checkpoint")
REPO = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = "train_gpt.py"  # trainer/python/train_gpt.py, in the image or here
PYTORCH = ("torchrun", TRAIN_SCRIPT)
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
TRAINERS = ("stoker-train", *PYTORCH)
GRACE_FLOOR = re.compile(r"training Job's grace floor is (\d+) s")


def training_grace_floor() -> int:
    """The floor deploy/k8s/README.md documents, in seconds."""
    text = (REPO / "deploy" / "k8s" / "README.md").read_text(encoding="utf-8")
    m = GRACE_FLOOR.search(text)
    if not m:
        raise SystemExit("deploy/k8s/README.md states no training Job's grace floor")
    return int(m.group(1))


def program_help(path: Path) -> str:
    r = subprocess.run([str(path), "--help"], capture_output=True, text=True, check=False)
    return r.stdout + r.stderr


def pytorch_helps(python: str | None) -> dict[str, str]:
    """torchrun's and the trainer's --help from PYTHON ({} when it has no
    torch), and "stoker-rdzv" naming the torchrun.handlers entry points."""
    if not python or not Path(python).exists():
        return {}
    runs = {
        "torchrun": [python, "-m", "torch.distributed.run", "--help"],
        TRAIN_SCRIPT: [python, str(REPO / "trainer" / "python" / TRAIN_SCRIPT), "--help"],
        "stoker-rdzv": [
            python,
            "-c",
            "from importlib.metadata import entry_points as e;"
            "print(' '.join(x.name for x in e(group='torchrun.handlers')))",
        ],
    }
    out = {}
    for name, args in runs.items():
        r = subprocess.run(args, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            print(f"{' '.join(args)}: exit {r.returncode}: {r.stderr.strip()[-300:]}")
            return {}
        out[name] = r.stdout
    return out


def stoker_package_variables() -> set[str]:
    """The STOKER_* names the stoker package's source mentions."""
    names: set[str] = set()
    for f in (REPO / "client" / "python" / "stoker").glob("*.py"):
        names.update(re.findall(r"\b(STOKER_[A-Z0-9_]+)\b", f.read_text()))
    return names


def program_of(word: str, helps: dict[str, str]) -> str | None:
    if word in helps:
        return word
    if Path(word).name == TRAIN_SCRIPT:
        return TRAIN_SCRIPT
    return None


def command_words(container: dict[str, Any]) -> list[str]:
    words = list(container.get("command", [])) + list(container.get("args", []))
    if words[:2] == ["/bin/sh", "-c"]:
        return shlex.split(words[2].replace("$", ""))  # ${VAR} stays one word
    return words


def duration_ms(text: str) -> int:
    m = re.fullmatch(r"(\d+)(ms|s|m|h)?", text.strip())
    if not m:
        raise ValueError(f"not a duration: {text}")
    scale = {"ms": 1, "s": 1000, "m": 60000, "h": 3600000, None: 1000}[m.group(2)]
    return int(m.group(1)) * scale


# The kubelet counts a probe failed when it takes longer than timeoutSeconds
# (1 s unless stated). On the real cluster's node, loaded to 30 on 2 vCPUs,
# health answers took over a second and the kubelet restarted a healthy
# coordinator; 3 s is the least a manifest may state (ours state 5).
PROBE_MIN_TIMEOUT_S = 3
# periodSeconds x failureThreshold: how long a liveness probe must fail before
# the kubelet restarts the container (a restart costs every job a generation),
# and how long a startup probe lets a daemon open its state.
LIVENESS_MIN_WINDOW_S = 30
STARTUP_MIN_WINDOW_S = 60
WORKLOADS = ("StatefulSet", "Job", "Deployment", "DaemonSet", "ReplicaSet", "Pod")
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def pod_spec(d: dict[str, Any]) -> dict[str, Any]:
    return d["spec"] if d["kind"] == "Pod" else d["spec"]["template"]["spec"]


def probe_timing_errors(docs: list[dict[str, Any]]) -> tuple[list[str], int]:
    """Every probe of every container of every workload: an explicit
    timeoutSeconds of at least PROBE_MIN_TIMEOUT_S, and windows long enough
    for a loaded node. Returns the errors and the number of probes seen."""
    errors: list[str] = []
    seen = 0
    for d in docs:
        if d.get("kind") not in WORKLOADS:
            continue
        pod = pod_spec(d)
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            where = f"{d['kind']}/{d['metadata']['name']}/{c['name']}"
            for probe in PROBES:
                spec = c.get(probe)
                if not spec:
                    continue
                seen += 1
                timeout = spec.get("timeoutSeconds")
                if timeout is None or timeout < PROBE_MIN_TIMEOUT_S:
                    errors.append(
                        f"{where}: {probe} timeoutSeconds {timeout or '1 (the default)'}, "
                        f"below {PROBE_MIN_TIMEOUT_S}: a loaded node fails a healthy daemon"
                    )
                window = spec.get("periodSeconds", 10) * spec.get("failureThreshold", 3)
                least = {
                    "livenessProbe": LIVENESS_MIN_WINDOW_S,
                    "startupProbe": STARTUP_MIN_WINDOW_S,
                }
                if probe in least and window < least[probe]:
                    errors.append(
                        f"{where}: {probe} gives up after {window} s of failures, "
                        f"below {least[probe]} s"
                    )
    return errors, seen


def main() -> int:
    argv = sys.argv[1:]
    python = None
    must_refuse = None
    if "--must-refuse" in argv:
        i = argv.index("--must-refuse")
        must_refuse = argv[i + 1]
        del argv[i : i + 2]
    if "--python" in argv:
        i = argv.index("--python")
        python = argv[i + 1]
        del argv[i : i + 2]
    render, overlay = argv[0], argv[1]
    paths = {Path(p).name: Path(p) for p in argv[2:]}
    rendered = subprocess.run([render, overlay], capture_output=True, text=True, check=False)
    if rendered.returncode != 0:
        print(f"render failed: {rendered.stderr}")
        return 1
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    helps = {p: program_help(paths[p]) for p in (*DAEMONS, "stokerctl", "stoker-train")}
    torch_helps = pytorch_helps(python)
    helps.update({p: torch_helps.get(p, "") for p in PYTORCH})
    errors: list[str] = []
    configs: dict[str, str] = {}
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("stoker-config"):
            configs.update(d["data"])
    if not configs:
        errors.append("no stoker-config ConfigMap rendered")

    checked = 0
    for d in docs:
        if d["kind"] not in ("StatefulSet", "Job"):
            continue
        pod = d["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{d['kind']}/{d['metadata']['name']}/{c['name']}"
            words = command_words(c)
            defined = {e["name"] for e in c.get("env", [])}
            for w in words:
                for name in VAR_REF.findall(w):
                    if name not in defined:
                        errors.append(f"{where}: $({name}) is no variable of the container")
            # Each program's flags: the words after it up to the next program.
            starts = [(i, p) for i, w in enumerate(words) if (p := program_of(w, helps))]
            programs = [p for _, p in starts]
            if not programs:
                errors.append(f"{where}: runs none of {sorted(helps)}: {words}")
                continue
            if d["kind"] == "Job" and any(p in TRAINERS for p in programs):
                floor = training_grace_floor()
                grace_s = pod.get("terminationGracePeriodSeconds", 30)
                if grace_s < floor:
                    errors.append(
                        f"{where}: terminationGracePeriodSeconds {grace_s} is below the training"
                        f" Job's grace floor of {floor} s (deploy/k8s/README.md)"
                    )
            if any(p in PYTORCH for p in programs) and not torch_helps:
                print(f"NOT CHECKED {where}: no Python with torch (--python; deploy/python-env.sh)")
                continue
            for n, (i, program) in enumerate(starts):
                text = helps[program]
                end = starts[n + 1][0] if n + 1 < len(starts) else len(words)
                for w in words[i + 1 : end]:
                    flag = w.split("=", 1)[0]
                    if flag.startswith("--") and not re.search(re.escape(flag) + r"\b", text):
                        errors.append(f"{where}: {program} has no flag {flag}")
                    if flag == "--rdzv-backend" and program == "torchrun":
                        backend = w.split("=", 1)[1] if "=" in w else words[words.index(w) + 1]
                        if backend not in torch_helps["stoker-rdzv"].split():
                            errors.append(f"{where}: no torchrun rendezvous backend {backend}")
                checked += 1
            if any(p in PYTORCH for p in programs):
                known = stoker_package_variables()
                for env in c.get("env", []):
                    if env["name"].startswith("STOKER_") and env["name"] not in known:
                        errors.append(f"{where}: the stoker package reads no {env['name']}")
            daemon = next((p for p in programs if p in DAEMONS), None)
            if not daemon:
                continue
            service = daemon.removeprefix("stoker-")
            text = helps[daemon]
            for env in c.get("env", []):
                name = env["name"]
                own = name.startswith(f"STOKER_{service.upper()}_")
                # STOKER_DATALOADER_PARTS is read by the pod's command, not the daemon.
                if own and f"env {name}" not in text and name != "STOKER_DATALOADER_PARTS":
                    errors.append(f"{where}: {daemon} reads no variable {name}")
            conf = configs.get(f"{service}.conf", "")
            options = {}
            for line in conf.splitlines():
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                key, _, value = line.partition("=")
                options[key.strip()] = value.strip().strip('"')
                if f"--{key.strip()} " not in text:
                    errors.append(f"{where}: {service}.conf sets {key.strip()}, not an option")
            listen_port = int(options.get("listen", "x:0").rsplit(":", 1)[1])
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                spec = c.get(probe, {})
                if "grpc" in spec:
                    port = spec["grpc"].get("port")
                elif "exec" in spec:  # stokerctl health over TLS from inside the pod
                    cmd = spec["exec"]["command"]
                    bad = [w for w in cmd if w.startswith("--") and w not in helps["stokerctl"]]
                    if cmd[0] != "stokerctl" or "health" not in cmd or bad:
                        errors.append(f"{where}: {probe} runs {cmd}")
                    addr = next(
                        (
                            cmd[i + 1]
                            for i, w in enumerate(cmd[:-1])
                            if w.startswith("--") and w in ("--coordinator",)
                        ),
                        "x:0",
                    )
                    port = int(addr.rsplit(":", 1)[1])
                    # The kubelet kills an exec probe after timeoutSeconds (1 by
                    # default) and counts it failed: a loaded node then fails the
                    # liveness probe of a healthy daemon and restarts it.
                    wait = next(
                        (cmd[i + 1] for i, w in enumerate(cmd[:-1]) if w == "--timeout"), ""
                    )
                    if wait and spec.get("timeoutSeconds", 1) * 1000 <= duration_ms(wait):
                        errors.append(
                            f"{where}: {probe} timeoutSeconds {spec.get('timeoutSeconds', 1)}"
                            f" does not cover its command's --timeout {wait}"
                        )
                else:
                    port = None
                if port != listen_port:
                    errors.append(f"{where}: {probe} checks {port}, listens on {listen_port}")
            grace_ms = duration_ms(options.get("shutdown-grace", "10s"))
            if pod.get("terminationGracePeriodSeconds", 30) * 1000 < grace_ms:
                errors.append(f"{where}: termination grace below shutdown-grace {grace_ms} ms")
    if checked < 5:
        errors.append(f"only {checked} program commands found in the manifests")
    timing, probes = probe_timing_errors(docs)
    errors += timing
    if probes < 9:
        errors.append(f"only {probes} probes found in the manifests (every daemon has three)")
    for e in errors:
        print(f"MISMATCH {e}")
    print(
        f"{checked} commands checked against --help, {len(configs)} config files, "
        f"{probes} probes' timings"
    )
    if must_refuse is not None:
        refused = any(must_refuse in e for e in errors)
        print(f"{'refused' if refused else 'NOT refused'}: {must_refuse}")
        return 0 if refused else 1
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
