#!/usr/bin/env bash
# stoker-train refuses bad flags before it contacts anything: each case exits
# 2 with one line naming the flag and what was wrong (no service runs here;
# a flag that slipped through would make the trainer try to connect).
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
check "--steps: expected an integer" --steps abc
check "--steps: expected an integer" --steps 10x
check "--global-batch: expected an integer" --global-batch 0
check "--lr: expected a number" --lr -1
check "--lr: expected a number" --lr fast
check "--eval-batches: expected an integer" --eval-batches 0
check "unknown flag --stepz" --stepz 10
check "--mixed-precision: 'fp8' is not a choice" --mixed-precision fp8
check "--heads 3 does not divide --channels 64" --heads 3
check "--steps has no value" --steps
out=$("$train" --job j --member m 2>&1 >/dev/null)
if [ $? -eq 2 ] && grep -qF -- "--coordinator (or STOKER_COORDINATOR) is required" <<<"$out"; then
  echo "ok   no coordinator"
else
  echo "FAIL: no coordinator: $out"
  fails=$((fails + 1))
fi
[ "$fails" -eq 0 ]
