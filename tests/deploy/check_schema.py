#!/usr/bin/env python3
"""Every rendered manifest of deploy/k8s against the Kubernetes OpenAPI
schema of the release the real-cluster suite runs (tests/k8s), offline and
strict (an unknown field is an error, as `kubectl apply --validate=strict`
has it): the schemas come with the kubernetes-validate package of the
project's venv. The server-side check (`kubectl apply --dry-run=server`) is
tests/k8s/run's; this one needs no cluster.

    check_schema.py [--must-refuse] RENDER_SH OVERLAY_DIR [OVERLAY_DIR ...]
Kueue's kinds (API group kueue.x-k8s.io, from components/kueue) are not in
the Kubernetes schema and the package has no CRD schemas: they are skipped,
by that group alone, and counted as skipped; tests/k8s/run applies them to
a cluster with Kueue's CRDs (issue 23).
Exits 1 listing every document that does not validate; 77 (skipped) when
the venv running it lacks kubernetes-validate. With --must-refuse (the
check's own test, on a manifest with a misspelt field) it exits 0 only when
some document is refused.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import yaml

KUBERNETES_VERSION = "1.34.0"  # tests/k8s/build.sh builds v1.34.x
# API groups of custom resources, validated by their CRDs on a real cluster only.
SKIPPED_GROUPS = ("kueue.x-k8s.io",)


def skipped(doc: dict[str, Any]) -> bool:
    return str(doc.get("apiVersion", "")).split("/")[0] in SKIPPED_GROUPS


def rendered(render: str, overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run([render, overlay], capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def problems(docs: list[dict[str, Any]], overlay: str) -> list[str]:
    import kubernetes_validate  # type: ignore[import-untyped]

    found = []
    for doc in docs:
        name = f"{overlay}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            found.append(f"{name}: {'.'.join(str(p) for p in e.path)}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            found.append(f"{name}: no schema ({e})")
    return found


def main() -> int:
    args = sys.argv[1:]
    must_refuse = bool(args) and args[0] == "--must-refuse"
    args = args[1:] if must_refuse else args
    if len(args) < 2:
        print(__doc__)
        return 2
    try:
        import kubernetes_validate  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        print("kubernetes-validate is not installed here (deploy/python-env.sh): skipped")
        return 77
    render, overlays = args[0], args[1:]
    bad: list[str] = []
    count = 0
    skips: list[str] = []
    for overlay in overlays:
        docs = rendered(render, overlay)
        skips += [
            f"{overlay}: {d.get('kind')}/{d.get('metadata', {}).get('name')}"
            for d in docs
            if skipped(d)
        ]
        docs = [d for d in docs if not skipped(d)]
        count += len(docs)
        bad += problems(docs, overlay)
    for line in bad:
        print(f"FAIL {line}")
    for line in skips:
        print(f"skipped (custom resource, {', '.join(SKIPPED_GROUPS)}): {line}")
    print(
        f"{count - len(bad)} of {count} manifests valid against Kubernetes {KUBERNETES_VERSION}"
        f" ({len(skips)} custom resources skipped)"
    )
    if must_refuse:
        return 0 if bad else 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
