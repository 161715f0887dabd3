"""``stoker.kueue``: the queue controller, Stoker's side of Kueue (issue 23).

Kueue decides who runs on a shared cluster (queues, quotas, priorities,
gangs); this controller makes its decisions cost no step: it tells the
coordinator of an eviction on the cluster's first sign, shrinks an elastic
Stoker job instead of letting it be evicted when a higher-priority workload
needs room, evicts one (checkpoint first) only when no shrink frees enough,
grows shrunk jobs back when quota frees, and creates and reports the
workloads of jobs submitted to a queue (``JobSpec.submission``).

- :mod:`stoker.kueue.decide`: the decisions, pure functions over Kubernetes
  objects as dicts (tested on recorded objects).
- :mod:`stoker.kueue.submit`: a submitted job's Job from its template, and
  its queue state as reported to the coordinator (pure, tested likewise).
- :mod:`stoker.kueue.controller`: the loop: the official ``kubernetes``
  client (watches, lists, patches) and :class:`stoker.jobs.Jobs`.
- ``python -m stoker.kueue``: the controller's program (its image:
  deploy/containers/Containerfile.kueue; its manifests:
  deploy/k8s/components/kueue-controller).

Needs the ``kubernetes`` package (the ``kueue`` extra); the rest of
``stoker`` does not import this.
"""
