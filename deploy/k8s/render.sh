#!/usr/bin/env bash
# Renders a kustomization (deploy/k8s/overlays/example by default) to stdout,
# offline: `kubectl kustomize` when kubectl is installed, else `kustomize
# build`; when neither is, kustomize v5.5.0 is built once from the Go module
# proxy into ~/.cache/stoker-tools (needs Go). `render.sh --version` prints the
# renderer's version.
#   deploy/k8s/render.sh [DIR] | kubectl apply -f -
set -euo pipefail
dir=${1:-$(dirname "$0")/overlays/example}
tools=${XDG_CACHE_HOME:-$HOME/.cache}/stoker-tools
if command -v kubectl >/dev/null; then
  [ "$dir" = --version ] && exec kubectl version --client
  exec kubectl kustomize "$dir"
fi
kustomize=$(command -v kustomize || echo "$tools/bin/kustomize")
if [ ! -x "$kustomize" ]; then
  command -v go >/dev/null || { echo "render.sh: needs kubectl, kustomize or Go" >&2; exit 1; }
  echo "render.sh: building kustomize v5.5.0 into $tools/bin (once)" >&2
  GOBIN=$tools/bin GOPATH=$tools/go GOFLAGS=-modcacherw \
    go install sigs.k8s.io/kustomize/kustomize/v5@v5.5.0 >&2
fi
[ "$dir" = --version ] && exec "$kustomize" version
exec "$kustomize" build "$dir"
