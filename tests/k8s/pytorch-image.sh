#!/usr/bin/env bash
# tests/k8s/pytorch-image.sh: the PyTorch trainer's image for the cluster
# (deploy/containers/Containerfile.pytorch: Debian's Python 3.11 on the
# debootstrap base, the pinned wheels from the wheelhouse, the stoker package
# of this checkout), as an archive `ctr images import` takes. Building it
# means a few GB of wheels installed and saved: the archive is cached outside
# the tree, keyed by everything the image is made of, and a later run with
# the same inputs builds nothing.
#
#   tests/k8s/pytorch-image.sh TAG   print the archive's path (built when missing)
#   STOKER_K8S_CACHE=DIR             cache root, as build.sh (archives in DIR/images)
#
# The key: the sha256 of the base image's id and the contents of every file
# the Containerfile copies or reads (Containerfile.pytorch, the requirements,
# client/python, proto, the trainer's two files). A changed key builds again and
# removes the archives of older keys. Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:?usage: pytorch-image.sh TAG}
image=localhost/stoker-pytorch:$tag
if [ "$(id -u)" = 0 ]; then
  cache_root=${STOKER_K8S_CACHE:-/var/cache/stoker-k8s}
else
  cache_root=${STOKER_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stoker-k8s}
fi
dir=$cache_root/images
mkdir -p "$dir"
. deploy/containers/podman-env.sh
deploy/containers/base-image.sh >&2

inputs="deploy/containers/Containerfile.pytorch deploy/containers/pytorch-requirements.in
  client/python proto trainer/python/gpt.py trainer/python/train_gpt.py"
# shellcheck disable=SC2086
key=$({
  podman image inspect --format '{{.Id}}' localhost/stoker-base:bookworm
  echo "$tag"
  git ls-files -co --exclude-standard -- $inputs | LC_ALL=C sort | while read -r f; do
    [ -f "$f" ] && printf '%s %s\n' "$(sha256sum <"$f" | cut -c1-64)" "$f"
  done
} | sha256sum | cut -c1-16)
archive=$dir/stoker-pytorch-$tag-$key.tar
if [ -f "$archive" ]; then
  echo "pytorch-image: $image cached ($archive)" >&2
  echo "$archive"
  exit 0
fi

t0=$(date +%s)
house=$(deploy/containers/wheelhouse.sh)
podman build -q -f deploy/containers/Containerfile.pytorch -v "$house:/wheels:ro" \
  -t "$image" . >&2
t1=$(date +%s)
rm -f "$dir"/stoker-pytorch-"$tag"-*.tar
podman save -q -o "$archive.part" "$image" && mv "$archive.part" "$archive"
echo "pytorch-image: built in $((t1 - t0))s, saved in $(($(date +%s) - t1))s ($(du -h "$archive" | cut -f1))" >&2
echo "$archive"
