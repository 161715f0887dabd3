#!/usr/bin/env bash
# Creates (once) and updates the project's Python virtual environment,
# .venv at the repository root: the pinned packages of
# client/python/requirements.txt, then the stoker package itself built from
# this tree (its gRPC stubs generated from proto/). Idempotent: a second run
# finds everything installed and only reinstalls the stoker package.
# PyTorch comes from PyPI (a CPU wheel from pip's find-links when the machine
# keeps one; otherwise the default build, which also runs on the CPU), and
# pip's cache serves later runs.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${STOKER_VENV:-$PWD/.venv}
python=${STOKER_PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv" || {
    # Debian's python3 needs python3-venv for ensurepip.
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get install -y -qq --no-install-recommends python3-venv
    rm -rf "$venv"
    "$python" -m venv "$venv"
  }
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
# Only when something pinned is missing or at another version: pip's own
# resolver pass over 50 pins costs seconds even when nothing changes.
if ! "$venv/bin/python" - client/python/requirements.txt <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, _, want = line.partition("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
  "${pip[@]}" install -r client/python/requirements.txt
fi
"${pip[@]}" install --no-build-isolation --no-deps --force-reinstall ./client/python
echo "python-env: $venv ready ($("$venv/bin/python" -c 'import torch, stoker; print("torch", torch.__version__)'))"
