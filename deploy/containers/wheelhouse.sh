#!/usr/bin/env bash
# Fills the wheelhouse the Python images install from (Containerfile.pytorch
# and Containerfile.kueue mount it at build time):
#
#   wheelhouse.sh [REQUIREMENTS.in]...   (default: pytorch-requirements.in)
#
# every wheel the image needs at run time (for the PyTorch trainer: torch,
# torchdata, grpcio, protobuf, numpy; for the queue controller:
# kueue-requirements.in; and their dependencies, at the versions pinned in
# client/python/requirements.txt) and the two that build the stoker package
# (setuptools, grpcio-tools). Downloaded
# once into ${STOKER_WHEELHOUSE:-~/.cache/stoker-wheels}: `pip download` skips
# a wheel already there, so later image builds fetch nothing (PyTorch's CUDA
# wheels are gigabytes). pip's own settings apply: PIP_FIND_LINKS for a local
# copy of the wheels, PIP_INDEX_URL for a mirror or PyTorch's CPU-only index
# (a much smaller image, for clusters without GPUs). Prints the directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
house=${STOKER_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/stoker-wheels}
python=${STOKER_PYTHON:-python3}
mkdir -p "$house"
# The image's Python is Debian 12's (CPython 3.11, glibc 2.36): pip picks
# the wheels of the Python running it, so that must be a CPython 3.11 here.
"$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
  echo "wheelhouse: $python is not CPython 3.11 (set STOKER_PYTHON)" >&2
  exit 1
}
reqs=()
for f in "${@:-deploy/containers/pytorch-requirements.in}"; do reqs+=(--requirement "$f"); done
"$python" -m pip download --quiet --disable-pip-version-check --dest "$house" \
  --only-binary=:all: \
  --constraint client/python/requirements.txt \
  "${reqs[@]}" setuptools grpcio-tools >&2
echo "$house"
