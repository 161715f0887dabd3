#!/usr/bin/env python3
"""Turns rendered Kubernetes manifests into pods that `podman kube play` runs.

Podman 4.3 plays Pods, Deployments, PersistentVolumeClaims and ConfigMaps only.
This does what the cluster's controllers and DNS would do, and nothing more:

- a StatefulSet becomes its pods NAME-0..N-1, each with hostname NAME-I,
  its volumeClaimTemplates turned into claims TEMPLATE-NAME-I (a podman
  volume each, kept across pod restarts as a PersistentVolume is);
- an Indexed Job becomes its pods NAME-0..N-1 with JOB_COMPLETION_INDEX set,
  as the Job controller sets it;
- every pod gets a fixed address on the podman network, and every pod's
  /etc/hosts (hostAliases) names the others as cluster DNS would: SERVICE for a
  Service's pods, POD.SERVICE for a StatefulSet's pod;
- a `fieldRef: status.podIP` variable gets the pod's address as its value,
  `metadata.name` the pod's name;
- `$(NAME)` in a container's command and args becomes the value of its
  variable NAME (`$$` a literal `$`), as the kubelet expands them;
- containers' `ports` lists are left out: Kubernetes only documents them,
  podman 4.3 publishes each on the host (two pods of one port would clash);
- an emptyDir volume becomes a claim POD-NAME listed as the pod's scratch:
  podman 4.3 makes an emptyDir a root-owned disk volume shared by every pod
  using that name, where Kubernetes gives each pod a fresh directory of its
  own (tmpfs for medium Memory) that the pod's fsGroup can write; the suite
  makes each scratch volume a tmpfs owned by the pod's user ("owner") before
  every start of the pod;
- a Secret volume becomes a claim POD-NAME listed with its Secret: podman 4.3
  fails on Secret volumes; the suite writes the Secret's keys into the volume
  as files, as the kubelet would.

Container specs, commands, environment, probes and volumes stay the
manifests' own. ConfigMaps are copied into each pod's file. Podman 4.3 reads
a Secret from its own secret store, as JSON of key to base64 value: each
Secret is written as OUT_DIR/secrets/NAME.json for `podman secret create`.
Claims are listed per pod for `podman volume create` (a claim in the pod's
file would fail on a replay, when the volume exists). Services and
PodDisruptionBudgets have no podman equivalent and are reported as dropped.

    render_pods.py MANIFESTS.yaml OUT_DIR --subnet 10.89.7

writes OUT_DIR/POD.yaml per pod and OUT_DIR/plan.json: [{pod, ip, file,
owner, kind, claims, scratch, secret_volumes, owner_ids}], StatefulSet pods
first, then Job pods; owner_ids is "UID:GID" of the pod's securityContext.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]


def load(path: Path) -> list[Doc]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d]


def pod_from_template(name: str, template: Doc, namespace: str | None) -> Doc:
    meta = template.get("metadata", {})
    pod: Doc = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": dict(meta.get("labels", {})),
            "annotations": dict(meta.get("annotations", {})),
        },
        "spec": copy.deepcopy(template["spec"]),
    }
    if namespace:
        pod["metadata"]["namespace"] = namespace
    return pod


def statefulset_pods(ss: Doc) -> list[Doc]:
    name = ss["metadata"]["name"]
    spec = ss["spec"]
    out = []
    for i in range(int(spec.get("replicas", 1))):
        pod_name = f"{name}-{i}"
        pod = pod_from_template(pod_name, spec["template"], ss["metadata"].get("namespace"))
        pod["spec"]["hostname"] = pod_name
        pod["spec"]["subdomain"] = spec.get("serviceName", name)
        for tmpl in spec.get("volumeClaimTemplates", []):
            claim_name = f"{tmpl['metadata']['name']}-{pod_name}"
            pod["spec"].setdefault("volumes", []).append(
                {
                    "name": tmpl["metadata"]["name"],
                    "persistentVolumeClaim": {"claimName": claim_name},
                },
            )
        out.append(pod)
    return out


def job_pods(job: Doc) -> list[Doc]:
    name = job["metadata"]["name"]
    spec = job["spec"]
    if spec.get("completionMode") != "Indexed":
        raise SystemExit(f"render_pods: Job {name}: only Indexed Jobs are rendered")
    pods = []
    for i in range(int(spec.get("completions", 1))):
        pod = pod_from_template(f"{name}-{i}", spec["template"], job["metadata"].get("namespace"))
        pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = str(i)
        pod["spec"]["hostname"] = f"{name}-{i}"
        for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
            c.setdefault("env", []).insert(0, {"name": "JOB_COMPLETION_INDEX", "value": str(i)})
        pods.append(pod)
    return pods


# The kubelet's expansion in command and args: $(NAME) and the escape $$.
VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """$(NAME) replaced by NAME's value when the container defines it (else
    left as written, as the kubelet leaves it), $$ by $."""
    return VAR_REF.sub(lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def localize(pod: Doc, ip: str) -> tuple[list[str], list[dict[str, str]]]:
    """What differs from a cluster: no host ports; the pod IP as a value;
    emptyDir and Secret volumes as claims of the pod's own. Returns the
    scratch claims and the Secret claims ({claim, secret})."""
    scratch = []
    secret_volumes = []
    for v in pod["spec"].get("volumes", []):
        claim = f"{pod['metadata']['name']}-{v['name']}"
        if "emptyDir" in v:
            del v["emptyDir"]
            v["persistentVolumeClaim"] = {"claimName": claim}
            scratch.append(claim)
        elif "secret" in v:
            secret_volumes.append({"claim": claim, "secret": v.pop("secret")["secretName"]})
            v["persistentVolumeClaim"] = {"claimName": claim, "readOnly": True}
    for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
        c.pop("ports", None)
        for env in c.get("env", []):
            ref = env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if ref == "status.podIP":
                env.pop("valueFrom")
                env["value"] = ip
            elif ref == "metadata.name":
                env.pop("valueFrom")
                env["value"] = pod["metadata"]["name"]
        values = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
        for key in ("command", "args"):
            if key in c:
                c[key] = [expand(str(w), values) for w in c[key]]
    return scratch, secret_volumes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifests", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--subnet", required=True, help="first three octets, e.g. 10.89.7")
    ap.add_argument("--first-host", type=int, default=10)
    args = ap.parse_args()

    docs = load(args.manifests)
    shared: list[Doc] = []  # ConfigMaps, copied into every pod file
    secrets: list[Doc] = []
    services: list[Doc] = []
    planned: list[tuple[str, Doc, str]] = []  # (owner kind, pod, owner name)
    for d in docs:
        kind = d["kind"]
        if kind == "ConfigMap":
            shared.append(d)
        elif kind == "Secret":
            secrets.append(d)
        elif kind == "Service":
            services.append(d)
        elif kind == "StatefulSet":
            for pod in statefulset_pods(d):
                planned.append(("StatefulSet", pod, d["metadata"]["name"]))
        elif kind == "Job":
            for pod in job_pods(d):
                planned.append(("Job", pod, d["metadata"]["name"]))
        elif kind == "PersistentVolumeClaim":
            pass  # a claim a pod names becomes a podman volume of that name
        else:
            what = f"{kind}/{d['metadata']['name']}"
            print(f"render_pods: dropped {what} (no podman equivalent)", file=sys.stderr)
    planned.sort(key=lambda p: p[0] == "Job")  # services before the jobs using them

    ips = {
        pod["metadata"]["name"]: f"{args.subnet}.{args.first_host + i}"
        for i, (_, pod, _) in enumerate(planned)
    }
    # Cluster DNS as /etc/hosts lines: SERVICE and POD.SERVICE.
    names: dict[str, list[str]] = {ip: [] for ip in ips.values()}
    for svc in services:
        sel = svc["spec"].get("selector", {})
        chosen = [pod for _, pod, _ in planned if sel and matches(sel, pod["metadata"]["labels"])]
        svc_name = svc["metadata"]["name"]
        for pod in chosen:
            ip = ips[pod["metadata"]["name"]]
            if pod["spec"].get("subdomain") == svc_name:
                names[ip].append(f"{pod['metadata']['name']}.{svc_name}")
        if chosen:  # a ClusterIP (or headless) name resolves to the first pod here
            names[ips[chosen[0]["metadata"]["name"]]].append(svc_name)
    aliases = [{"ip": ip, "hostnames": hs} for ip, hs in names.items() if hs]

    args.out.mkdir(parents=True, exist_ok=True)
    plan = []
    for owner_kind, pod, owner in planned:
        name = pod["metadata"]["name"]
        pod["spec"]["hostAliases"] = aliases
        scratch, secret_volumes = localize(pod, ips[name])
        volumes = pod["spec"].get("volumes", [])
        named = [
            v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
        ]
        own = set(scratch) | {sv["claim"] for sv in secret_volumes}
        claims = [c for c in named if c not in own]
        sc = pod["spec"].get("securityContext", {})
        owner_ids = f"{sc.get('runAsUser', 0)}:{sc.get('fsGroup', sc.get('runAsGroup', 0))}"
        path = args.out / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all([*shared, pod], sort_keys=False))
        plan.append(
            {
                "pod": name,
                "ip": ips[name],
                "file": str(path),
                "owner": owner,
                "kind": owner_kind,
                "claims": claims,
                "scratch": scratch,
                "secret_volumes": secret_volumes,
                "owner_ids": owner_ids,
            }
        )
    (args.out / "secrets").mkdir(exist_ok=True)
    for sec in secrets:
        data = dict(sec.get("data", {}))
        for k, v in sec.get("stringData", {}).items():
            data[k] = base64.b64encode(v.encode()).decode()
        (args.out / "secrets" / f"{sec['metadata']['name']}.json").write_text(json.dumps(data))
    (args.out / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
