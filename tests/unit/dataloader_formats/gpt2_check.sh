#!/bin/sh
# Cross-checks our GPT-2 BPE against npm's gpt-3-encoder: installs the
# package (once) into the build directory, encodes the test strings with it,
# and runs the C test on the same files. Exit 77 (skip) only when npm or the
# network is unavailable.
# Usage: gpt2_check.sh TEST_BINARY SOURCE_DIR WORK_DIR
set -eu
bin=$1 src=$2 work=$3
command -v node >/dev/null 2>&1 || { echo "SKIP: node not installed"; exit 77; }
command -v npm >/dev/null 2>&1 || { echo "SKIP: npm not installed"; exit 77; }
mods=$work/node_modules
if [ ! -f "$mods/gpt-3-encoder/vocab.bpe" ]; then
  mkdir -p "$work"
  if ! npm install --prefix "$work" --no-audit --no-fund gpt-3-encoder >"$work/npm.log" 2>&1; then
    cat "$work/npm.log"
    echo "SKIP: npm install gpt-3-encoder failed (no network?)"
    exit 77
  fi
fi
node "$src/gpt2_reference.js" "$mods" "$src/gpt2_strings.json" >"$work/expected.json"
exec "$bin" "$mods/gpt-3-encoder/encoder.json" "$mods/gpt-3-encoder/vocab.bpe" \
  "$src/gpt2_strings.json" "$work/expected.json"
