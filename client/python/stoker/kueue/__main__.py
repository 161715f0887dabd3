"""``python -m stoker.kueue``: runs the queue controller of one namespace.

In a pod it finds the API server and its ServiceAccount's token as every
in-cluster client does; outside one, the current kubeconfig context. The
coordinator's address, TLS and token come from the environment as for
stokerctl (STOKER_COORDINATOR, STOKER_TLS_CA, STOKER_TOKEN_FILE).
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import signal
import sys
from types import FrameType

from kubernetes import config

from stoker.jobs import Jobs
from stoker.kueue.controller import Controller

# Where a pod's ServiceAccount says its namespace.
NAMESPACE_FILE = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stoker.kueue", description=__doc__)
    ap.add_argument("--namespace", help="the namespace to manage (default: the pod's own)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between passes")
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout
    )
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config()
    ns = args.namespace or (NAMESPACE_FILE.read_text().strip() if NAMESPACE_FILE.exists() else "")
    if not ns:
        ap.error("--namespace is needed outside a pod")
    ctl = Controller(ns, Jobs(), interval_s=args.interval)

    def on_term(signum: int, frame: FrameType | None) -> None:
        ctl.stop()

    signal.signal(signal.SIGTERM, on_term)
    logging.getLogger("stoker.kueue").info("managing namespace %s", ns)
    ctl.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
