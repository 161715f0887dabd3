#!/usr/bin/env bash
# tests/k8s/kueue.sh: Kueue on the cluster of cluster.sh, installed as its
# release manifests install it: its CRDs, RBAC, webhooks (Kueue's internal
# certificate management), the visibility APIService and the controller
# manager Deployment in kueue-system, rendered from the Go module's own
# config/default kustomize tree (in the module cache; nothing of it is
# copied into this tree). Three things differ from a release install:
# - the image: the manager binary built by `build.sh kueue` from the same
#   module, packed by image.py as localhost/stoker-k8s/kueue:VERSION and
#   imported (no registry), pulled IfNotPresent;
# - the Configuration: deploy/k8s/components/kueue/kueue-manager-config.yaml
#   (waitForPodsReady, the ElasticJobsViaWorkloadSlices gate on and
#   TopologyAwareScheduling off, batch/job only; its README says why);
# - the manager requests 100m CPU instead of 500m (a 2-core node), and its pod
#   template carries the Configuration's hash, so that a changed one restarts it.
#
#   tests/k8s/kueue.sh install   build or find, render, apply, wait until the
#                                controller is Ready and its webhook answers
#                                (idempotent: a second run changes nothing)
#   tests/k8s/kueue.sh render    print the manifests install applies
#   tests/k8s/kueue.sh bad-workload   server-side dry run of a Workload only
#                                Kueue's webhook refuses (tests/k8s/run's check)
#   KUEUE_VERSION=v0.17.0        the release (the module's version)
set -euo pipefail
cd "$(dirname "$0")/../.."

KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}
export KUEUE_VERSION
state=${STOKER_K8S_STATE:-/var/lib/stoker-k8s}
config=deploy/k8s/components/kueue/kueue-manager-config.yaml
image=localhost/stoker-k8s/kueue:$KUEUE_VERSION

log() { echo "kueue.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# render DIR: the kustomization over the module's config/default, in DIR
render() {
  local dir=$1 moddir rel sum
  moddir=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" |
    sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
  [ -d "$moddir/config/default" ] || die "no config/default in sigs.k8s.io/kueue@$KUEUE_VERSION"
  mkdir -p "$dir"
  # kustomize takes resources by relative path only
  rel=$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' \
    "$moddir/config/default" "$(cd "$dir" && pwd -P)")
  cp "$config" "$dir/controller_manager_config.yaml"
  # The Configuration's hash on the pod template: a changed one rolls the manager.
  sum=$(sha256sum "$config" | cut -c1-16)
  cat >"$dir/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- $rel
images:
- {name: us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue, newName: localhost/stoker-k8s/kueue, newTag: $KUEUE_VERSION}
configMapGenerator:
- name: kueue-manager-config
  namespace: kueue-system
  behavior: replace
  files: [controller_manager_config.yaml]
  options: {disableNameSuffixHash: true}
patches:
- patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: kueue-controller-manager, namespace: kueue-system}
    spec:
      template:
        metadata:
          annotations: {stoker/kueue-config-sha256: "$sum"}
        spec:
          containers:
          - name: manager
            imagePullPolicy: IfNotPresent
            resources:
              requests: {cpu: 100m, memory: 512Mi}
EOF
  kubectl kustomize "$dir"
}

install() {
  [ "$(id -u)" = 0 ] || die "install needs root (the cluster's containerd)"
  [ -d "$state" ] || die "no cluster (tests/k8s/cluster.sh up)"
  eval "$(tests/k8s/cluster.sh env)"
  local bin images t0
  t0=$(date +%s)
  bin=$(tests/k8s/build.sh kueue)
  images=$(dirname "$bin")/images
  mkdir -p "$images"
  [ -f "$images/kueue-$KUEUE_VERSION.tar" ] ||
    python3 tests/k8s/image.py "$images/kueue-$KUEUE_VERSION.tar" "$image" \
      --file "$bin/kueue-$KUEUE_VERSION:/manager:755" --entrypoint '["/manager"]' --user 65532:65532
  tests/k8s/cluster.sh import "$images/kueue-$KUEUE_VERSION.tar" >/dev/null
  mkdir -p "$state/kueue"
  render "$state/kueue" >"$state/kueue/manifests.yaml"
  # Server-side: the CRDs are too large for client-side apply's annotation.
  kubectl apply --server-side --force-conflicts -f "$state/kueue/manifests.yaml" >"$state/kueue/apply.log"
  kubectl get crd -o name | grep 'kueue\.x-k8s\.io$' |
    xargs kubectl wait --for=condition=Established --timeout=60s >/dev/null
  kubectl -n kueue-system rollout status deployment/kueue-controller-manager --timeout=240s >&2
  # The webhook answers once the manager has made its certificate and
  # patched it into the webhook configurations: a Workload using the
  # resource name Kueue reserves ("pods") is refused by vworkload.kb.io.
  local out
  for _ in $(seq 60); do
    out=$(bad_workload 2>&1) && die "a Workload with a reserved resource was accepted"
    echo "$out" | grep -q 'admission webhook "vworkload.kb.io" denied' && break
    sleep 2
  done
  echo "$out" | grep -q 'admission webhook "vworkload.kb.io" denied' ||
    die "the webhook does not answer: $out"
  log "Kueue $KUEUE_VERSION installed in $(($(date +%s) - t0))s (controller Ready, webhook answering)"
}

# A Workload the webhook (not the CRD schema) refuses, server-side dry run.
bad_workload() {
  kubectl apply --dry-run=server -f - <<EOF
apiVersion: kueue.x-k8s.io/v1beta2
kind: Workload
metadata: {name: stoker-bad-workload, namespace: default}
spec:
  podSets:
  - name: main
    count: 1
    template:
      spec:
        restartPolicy: Never
        containers:
        - name: c
          image: localhost/stoker-k8s/busybox:1
          resources:
            requests: {cpu: 10m, pods: "1"}
EOF
}

case ${1:-} in
install) install ;;
render)
  eval "$(tests/k8s/cluster.sh env)"
  d=$(mktemp -d)
  render "$d"
  rm -rf "$d"
  ;;
bad-workload)
  eval "$(tests/k8s/cluster.sh env)"
  bad_workload
  ;;
*) die "usage: kueue.sh install|render|bad-workload" ;;
esac
