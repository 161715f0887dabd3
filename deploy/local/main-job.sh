#!/usr/bin/env bash
# The main job, on one machine: installs what is needed, builds, starts the
# coordinator on loopback with embedded defaults, and runs a small simulated
# job: four ranks join, meet at a barrier, swap addresses through the KV
# store and heartbeat with their steps; one rank is killed with SIGKILL; the
# survivors are told RESTART, re-rendezvous at three ranks in a new
# generation and resume from the latest checkpoint. Prints the job as
# `stokerctl` shows it at each stage. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

[ -n "${STOKER_SKIP_DEPS:-}" ] || deploy/install-deps.sh
[ -f build/build.ninja ] || meson setup build
ninja -C build

bin=$root/build
work=$(mktemp -d -t stoker-main-job.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '\n== %s\n' "$*"; }

say "starting stoker-coordinator on loopback (data in $work/coordinator)"
"$bin/services/coordinator/stoker-coordinator" --listen 127.0.0.1:0 \
  --data-dir "$work/coordinator" --ready-file "$work/coordinator.addr" \
  --log-level warn &
pids+=($!)
for _ in $(seq 200); do [ -s "$work/coordinator.addr" ] && break; sleep 0.05; done
export STOKER_COORDINATOR=$(cat "$work/coordinator.addr")
ctl() { "$bin/client/cli/stokerctl" "$@"; }
ctl health

job_field() { # job_field FIELD: world_size or generation from `stokerctl --json job show`
  ctl --json job show demo | python3 -c "import json,sys; print(json.load(sys.stdin).get('$1', 0))"
}
wait_for() { # wait_for FIELD VALUE SECONDS
  for _ in $(seq $(($3 * 10))); do
    [ "$(job_field "$1")" = "$2" ] && return 0
    sleep 0.1
  done
  echo "timed out waiting for $1 = $2" >&2
  ctl job show demo >&2
  return 1
}

say "creating job demo: 2..4 ranks, heartbeat 300ms, 3 misses, last call 1s"
ctl job create demo --min 2 --max 4 --heartbeat 300ms --misses 3 --last-call 1s \
  --label team=research --checkpoint-storage "file://$work/checkpoints"

say "launching 4 simulated ranks"
rank_pids=()
for r in 0 1 2 3; do
  "$bin/trainer/sim/stoker-simrank" --job demo --member "rank-$r" --step-ms 100 \
    --checkpoint-every 10 >"$work/rank-$r.log" 2>&1 &
  rank_pids+=($!)
  pids+=($!)
done
wait_for world_size 4 30
sleep 3
ctl job show demo

gen_before=$(job_field generation)
say "killing rank-2 with SIGKILL (generation $gen_before)"
kill -9 "${rank_pids[2]}"
wait "${rank_pids[2]}" 2>/dev/null || true

say "waiting for the lease to expire and the survivors to re-rendezvous"
wait_for generation $((gen_before + 1)) 30
wait_for world_size 3 30
sleep 2
ctl job show demo

say "event log"
timeout 2 "$bin/client/cli/stokerctl" job watch demo || true

say "stopping the job: ranks are told STOP at their next heartbeat"
ctl job stop demo --force >/dev/null
for i in 0 1 3; do wait "${rank_pids[$i]}" || true; done
say "what the surviving ranks saw"
for i in 0 1 3; do grep -E 'joined|RESTART|done' "$work/rank-$i.log" | sed 's/^/  /'; done
ctl job show demo
say "main job finished"
