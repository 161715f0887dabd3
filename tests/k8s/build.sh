#!/bin/bash
# tests/k8s/build.sh: build the Kubernetes binaries (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl) and
# CoreDNS from their published Go modules, once, into a cache outside the tree
# keyed by version. Later runs find the binaries there and build nothing.
#
#   tests/k8s/build.sh            build what is missing, print the bin dir
#   tests/k8s/build.sh prometheus the same, and Prometheus too (tests/k8s/run)
#   tests/k8s/build.sh kueue      the same, and Kueue's controller manager too
#                                 (tests/k8s/kueue.sh)
#   STOKER_K8S_CACHE=DIR          cache root (default /var/cache/stoker-k8s,
#                                 or $XDG_CACHE_HOME/stoker-k8s when not root)
#   K8S_VERSION=v1.34.2           Kubernetes release (staging modules v0.34.x)
#   COREDNS_VERSION=v1.12.4       CoreDNS release
#   PROMETHEUS_VERSION=v0.316.0   Prometheus (its Go module's version of 3.x; built
#                                 with Kubernetes discovery, which Debian's lacks)
#   KUEUE_VERSION=v0.17.0         Kueue (sigs.k8s.io/kueue, cmd/kueue: the manager
#                                 binary of its release image)
#
# The published module k8s.io/kubernetes does not carry its staging/ modules:
# its go.mod replaces k8s.io/api and the rest with ./staging/src/k8s.io/...,
# which a module download does not have. A generated go.mod in the cache dir
# requires k8s.io/kubernetes at the release and replaces each of those with the
# matching published version (v0.X.Y for v1.X.Y). Nothing is committed of it.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.2}
COREDNS_VERSION=${COREDNS_VERSION:-v1.12.4}
PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}
KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}
if [ "$(id -u)" = 0 ]; then
    cache_root=${STOKER_K8S_CACHE:-/var/cache/stoker-k8s}
else
    cache_root=${STOKER_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stoker-k8s}
fi
staging_version=v0.${K8S_VERSION#v1.}
bin=$cache_root/$K8S_VERSION/bin
work=$cache_root/$K8S_VERSION/mod
k8s_cmds="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"

command -v go >/dev/null || { echo "build.sh: the go command is needed (Go >= 1.24)" >&2; exit 1; }
mkdir -p "$bin" "$work"

missing=""
for c in $k8s_cmds; do [ -x "$bin/$c" ] || missing="$missing $c"; done

if [ -n "$missing" ]; then
    cd "$work"
    if [ ! -f go.mod ]; then
        # the release's own go.mod, for its replace list
        modjson=$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION")
        upstream=$(printf '%s\n' "$modjson" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')
        [ -f "$upstream" ] || { echo "build.sh: no go.mod for k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
        gover=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$upstream")
        {
            echo "module stoker.local/k8sbuild"
            echo
            echo "go $gover"
            echo
            echo "require k8s.io/kubernetes $K8S_VERSION"
            echo
            echo "replace ("
            # "k8s.io/api => ./staging/src/k8s.io/api" becomes "k8s.io/api => k8s.io/api v0.34.2"
            sed -n 's|^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/[a-z0-9-]*\s*$|\t\1 => \1 '"$staging_version"'|p' "$upstream"
            echo ")"
        } > go.mod.new
        mv go.mod.new go.mod
        printf 'package k8sbuild\n\nimport _ "k8s.io/kubernetes/cmd/kubelet/app"\n' > tools.go
        GOFLAGS=-mod=mod go mod tidy
    fi
    ldpkg=k8s.io/component-base/version
    minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
    ldflags="-s -w -X $ldpkg.gitVersion=$K8S_VERSION -X $ldpkg.gitMajor=1 -X $ldpkg.gitMinor=$minor"
    ldflags="$ldflags -X $ldpkg.gitTreeState=clean -X $ldpkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
    for c in $missing; do
        echo "build.sh: building $c $K8S_VERSION" >&2
        t0=$(date +%s)
        GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c"
        mv "$bin/$c.tmp" "$bin/$c"
        echo "build.sh: $c built in $(( $(date +%s) - t0 ))s" >&2
    done
fi

if [ ! -x "$bin/coredns" ]; then
    echo "build.sh: building coredns $COREDNS_VERSION" >&2
    t0=$(date +%s)
    GOBIN=$bin.coredns GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
        "github.com/coredns/coredns@$COREDNS_VERSION"
    mv "$bin.coredns/coredns" "$bin/coredns"
    rmdir "$bin.coredns"
    echo "build.sh: coredns built in $(( $(date +%s) - t0 ))s" >&2
fi

if [ "${1:-}" = prometheus ] && [ ! -x "$bin/prometheus" ]; then
    echo "build.sh: building prometheus $PROMETHEUS_VERSION" >&2
    t0=$(date +%s)
    GOBIN=$bin.prometheus GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
        "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION"
    mv "$bin.prometheus/prometheus" "$bin/prometheus"
    rmdir "$bin.prometheus"
    echo "build.sh: prometheus built in $(( $(date +%s) - t0 ))s" >&2
fi

if [ "${1:-}" = kueue ] && [ ! -x "$bin/kueue-$KUEUE_VERSION" ]; then
    # The version variables its Makefile sets; its go.mod has no replace, so
    # `go install module@version` builds the release as published.
    echo "build.sh: building kueue $KUEUE_VERSION" >&2
    t0=$(date +%s)
    vpkg=sigs.k8s.io/kueue/pkg/version
    GOBIN=$bin.kueue GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath \
        -ldflags "-s -w -X $vpkg.GitVersion=$KUEUE_VERSION -X $vpkg.BuildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
    mv "$bin.kueue/kueue" "$bin/kueue-$KUEUE_VERSION"
    rmdir "$bin.kueue"
    echo "build.sh: kueue built in $(( $(date +%s) - t0 ))s" >&2
fi

echo "$bin"
