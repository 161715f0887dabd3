#!/usr/bin/env bash
# The main job, on one machine: installs what is needed, builds, starts
# stoker-coordinator, stoker-dataloader and stoker-checkpoint on loopback
# (state and checkpoints in a temp dir), makes a small text corpus from the
# licence texts on this machine, and trains the reference GPT with four
# stoker-train ranks (FSDP over a TCP ring). They checkpoint every few steps;
# one rank is killed with SIGKILL; the survivors restart at three ranks from
# the last committed checkpoint (resharded) and train on; the job is stopped.
# Prints a summary: loss curve (text sparkline, PNG when gnuplot exists),
# tokens/s, the checkpoints written, and the proof (Explain over every step
# trained) that no data was served twice. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=${STOKER_BUILD_DIR:-build}

[ -n "${STOKER_SKIP_DEPS:-}" ] || deploy/install-deps.sh
[ -f "$build/build.ninja" ] || meson setup "$build"
ninja -C "$build"

bin=$root/$build
work=$(mktemp -d -t stoker-main-job.XXXXXX)
# The summary (loss.png, loss.tsv) outlives the temporary state directory.
out=${STOKER_OUT_DIR:-$root/main-job-out}
mkdir -p "$out"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${STOKER_KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
say() { printf '\n== %s\n' "$*"; }

start_daemon() { # start_daemon NAME EXTRA...: prints nothing, sets $NAME.addr
  local name=$1
  shift
  "$bin/services/$name/stoker-$name" --listen 127.0.0.1:0 --data-dir "$work/$name" \
    --ready-file "$work/$name.addr" --log-level warn "$@" &
  pids+=($!)
  for _ in $(seq 300); do [ -s "$work/$name.addr" ] && return 0; sleep 0.05; done
  echo "stoker-$name did not start" >&2
  return 1
}
say "starting the services on loopback (state in $work)"
start_daemon coordinator
export STOKER_COORDINATOR=$(cat "$work/coordinator.addr")
start_daemon dataloader
start_daemon checkpoint --coordinator "$STOKER_COORDINATOR"
export STOKER_DATALOADER=$(cat "$work/dataloader.addr") STOKER_CHECKPOINT=$(cat "$work/checkpoint.addr")
ctl() { "$bin/client/cli/stokerctl" "$@"; }
ctl health

say "preparing a small corpus from the licence texts on this machine"
mkdir -p "$work/corpus"
i=0
for f in /usr/share/common-licenses/* /usr/share/doc/*/copyright; do
  [ -f "$f" ] && [ -r "$f" ] || continue
  cat "$f" >>"$work/corpus/part-$((i % 4)).txt"
  i=$((i + 1))
  [ "$(du -sk "$work/corpus" | cut -f1)" -lt 2048 ] || break
done
du -sh "$work/corpus" | sed 's/^/  /'

job_field() { # job_field FIELD
  ctl --json job show demo | python3 -c "
import json, sys
j = json.load(sys.stdin)
j['step'] = max([m['step'] for m in j['members']] or [0])
j['checkpoint_step'] = (j.get('latest_checkpoint') or {}).get('step', 0)
print(j.get('$1', 0))"
}
wait_for() { # wait_for FIELD OP VALUE SECONDS
  for _ in $(seq $(($4 * 5))); do
    [ "$(job_field "$1")" "$2" "$3" ] && return 0
    sleep 0.2
  done
  echo "timed out waiting for $1 $2 $3" >&2
  ctl job show demo >&2
  return 1
}

say "creating job demo: 2..4 ranks, heartbeat 300ms, 3 misses, last call 1s"
ctl job create demo --min 2 --max 4 --heartbeat 300ms --misses 3 --last-call 1s \
  --label team=research >/dev/null
ctl job show demo

steps=${STOKER_STEPS:-200}
say "launching 4 stoker-train ranks (C=64 L=2 NH=4 T=64 V=256, global batch 12, checkpoint every 20)"
export OMP_NUM_THREADS=1
rank_pids=()
for r in 0 1 2 3; do
  "$bin/trainer/train/stoker-train" --job demo --member "rank-$r" --corpus "$work/corpus" \
    --steps "$steps" --checkpoint-every 20 >"$work/rank-$r.log" 2>&1 &
  rank_pids+=($!)
  pids+=($!)
done
wait_for world_size = 4 60
wait_for checkpoint_step -ge 40 120
ctl job show demo

gen_before=$(job_field generation)
say "killing rank-2 with SIGKILL (generation $gen_before, step $(job_field step))"
kill -9 "${rank_pids[2]}"
wait "${rank_pids[2]}" 2>/dev/null || true

say "waiting for the survivors to re-rendezvous at 3 ranks and restore"
wait_for generation -gt "$gen_before" 60
wait_for world_size = 3 60
restored=$(job_field checkpoint_step)
wait_for step -ge $((restored + 40)) 120
ctl job show demo

say "stopping the job: ranks are told STOP at their next heartbeat"
ctl job stop demo --force >/dev/null
for i in 0 1 3; do wait "${rank_pids[$i]}" || { echo "rank-$i failed" >&2; cat "$work/rank-$i.log" >&2; exit 1; }; done
say "what the ranks saw"
for i in 0 1 2 3; do grep -E 'joined|RESTART|restored|failed|STOP|done' "$work/rank-$i.log" | sed 's/^/  /'; done
ctl job show demo

say "checkpoints written"
ctl checkpoint list demo

say "summary"
cat "$work"/rank-*.log | python3 "$root/deploy/local/summary.py" "$out" "$bin/client/cli/stokerctl"
say "main job finished"
