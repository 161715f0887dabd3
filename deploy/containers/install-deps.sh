#!/usr/bin/env bash
# Installs what building the images and the Kubernetes suite (tests/k8s/run)
# need, from Debian 12 packages: podman with Debian's runc and netavark (and
# iptables, which netavark runs: a recommended package that
# --no-install-recommends drops), debootstrap for the base image, promtool
# (package prometheus) for the metrics check, PyYAML for picking a Job out of
# a render. kubectl or kustomize (deploy/k8s/render.sh builds kustomize from
# the Go module proxy when neither is installed). Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
packages=(podman runc netavark iptables debootstrap prometheus python3-yaml curl)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
"$here/../k8s/render.sh" --version >/dev/null
echo "containers/install-deps: ${#packages[@]} packages present, kustomize ready"
