#!/usr/bin/env bash
# stoker-train refuses bad flags before it contacts anything: each case exits
# 2 with one line naming the flag and what was wrong (no service runs here;
# a flag that slipped through would make the trainer try to connect). The
# flags are parsed by the shared parser, so --name=value and --help work as
# for the daemons.
# Usage: test_train_flags.sh STOKER_TRAIN
set -u
train=$1
fails=0
check() { # check WANT_TEXT ARGS...
  local want=$1 out rc
  shift
  out=$("$train" --coordinator 127.0.0.1:1 --job j --member m "$@" 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -ne 2 ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL: $* -> rc $rc: $(head -1 <<<"$out")"
    fails=$((fails + 1))
  else
    echo "ok   $* -> $(head -1 <<<"$out")"
  fi
}
check "--steps: expected an integer, got 'abc'" --steps abc
check "--steps: expected an integer, got '10x'" --steps 10x
check "--steps: expected an integer, got '10x'" --steps=10x
check "--global-batch: 0 is out of range [1, 16777216]" --global-batch 0
check "--lr: -1 is out of range [0, 10]" --lr -1
check "--lr: expected a number, got 'fast'" --lr fast
check "--eval-batches: 0 is out of range" --eval-batches 0
check "unknown flag --stepz" --stepz 10
check "--mixed-precision: expected one of fp32, bf16, got 'fp8'" --mixed-precision fp8
check "--ckpt-stage-priority: expected one of normal, low, got 'high'" --ckpt-stage-priority high
check "--on-sigterm: expected one of checkpoint, exit, got 'save'" --on-sigterm save
check "--ckpt-stage-test: expected slow:MS or early, got 'slow:0'" --ckpt-stage-test slow:0
check "--heads 3 does not divide --channels 64" --heads 3
check "--heads 3 does not divide --channels 64" --heads=3
check "--steps: missing value" --steps
check "unexpected argument 'stray'" stray
# --help lists every flag from the same table, on stdout, and exits 0.
out=$("$train" --help 2>/dev/null)
if [ $? -eq 0 ] && grep -qF -- "--global-batch INTEGER" <<<"$out" &&
  grep -qF -- "range [1, 16777216]" <<<"$out"; then
  echo "ok   --help"
else
  echo "FAIL: --help: $(head -3 <<<"$out")"
  fails=$((fails + 1))
fi
out=$("$train" --job j --member m 2>&1 >/dev/null)
if [ $? -eq 2 ] && grep -qF -- "--coordinator (or STOKER_COORDINATOR) is required" <<<"$out"; then
  echo "ok   no coordinator"
else
  echo "FAIL: no coordinator: $out"
  fails=$((fails + 1))
fi
[ "$fails" -eq 0 ]
