#!/usr/bin/env bash
# The shipped example config is exactly what the daemon documents (so it
# never drifts from the option table), and the daemon starts from it.
# Usage: example_config.sh DAEMON EXAMPLE_FILE [DURATION_OPTION]
# DURATION_OPTION names a duration option of the daemon, set to a bad value
# in the bad-config check (default: tick).
set -euo pipefail
daemon=$1 example=$2 duration_opt=${3:-tick}
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
pid=

if ! diff -u "$example" <("$daemon" --example-config); then
  echo "FAIL: $example differs from '$(basename "$daemon") --example-config'; regenerate it" >&2
  exit 1
fi
echo "ok example config matches the option table"

"$daemon" --config "$example" --listen 127.0.0.1:0 --data-dir "$tmp/data" \
  --ready-file "$tmp/ready" --log-level warn &
pid=$!
for _ in $(seq 300); do [ -s "$tmp/ready" ] && break; sleep 0.1; done
[ -s "$tmp/ready" ] || { echo "FAIL: daemon did not start from $example" >&2; exit 1; }
kill -TERM "$pid"
wait "$pid"
pid=
echo "ok daemon starts from the example config and exits 0 on SIGTERM"

# A bad value in a config file is one clear error naming file and line, exit non-zero.
printf 'listen = 127.0.0.1:0\n%s = nope\n' "$duration_opt" >"$tmp/bad.conf"
if "$daemon" --config "$tmp/bad.conf" 2>"$tmp/err"; then
  echo "FAIL: daemon accepted a bad config" >&2; exit 1
fi
grep -q "bad.conf:2" "$tmp/err" || { echo "FAIL: error does not name file:line:"; cat "$tmp/err"; exit 1; }
[ "$(wc -l <"$tmp/err")" -eq 1 ] || { echo "FAIL: error is not one line:"; cat "$tmp/err"; exit 1; }
echo "ok bad config rejected: $(cat "$tmp/err")"

# --help lists every option of the example with its default.
"$daemon" --help >"$tmp/help"
for opt in $(grep -E '^[a-z-]+ = ' "$example" | cut -d' ' -f1); do
  grep -q -- "--$opt" "$tmp/help" || { echo "FAIL: --help misses --$opt" >&2; exit 1; }
done
echo "ok --help lists every option"
