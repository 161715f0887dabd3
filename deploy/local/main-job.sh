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
. "$root/deploy/local/common.sh"
start_services
make_corpus

say "creating job demo: 2..4 ranks, heartbeat 300ms, 3 misses, last call 1s"
# shellcheck disable=SC2046 # job_storage_flags is two flag pairs, split on purpose
ctl job create demo --min 2 --max 4 --heartbeat 300ms --misses 3 --last-call 1s \
  --label team=research $(job_storage_flags) >/dev/null
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
wait_for demo world_size = 4 60
wait_for demo checkpoint_step -ge 40 120
ctl job show demo

gen_before=$(job_field demo generation)
say "killing rank-2 with SIGKILL (generation $gen_before, step $(job_field demo step))"
kill -9 "${rank_pids[2]}"
wait "${rank_pids[2]}" 2>/dev/null || true

say "waiting for the survivors to re-rendezvous at 3 ranks and restore"
wait_for demo generation -gt "$gen_before" 60
wait_for demo world_size = 3 60
restored=$(job_field demo checkpoint_step)
wait_for demo step -ge $((restored + 40)) 120
ctl job show demo

say "stopping the job: ranks are told STOP at their next heartbeat"
ctl job stop demo --force >/dev/null
for i in 0 1 3; do wait "${rank_pids[$i]}" || { echo "rank-$i failed" >&2; cat "$work/rank-$i.log" >&2; exit 1; }; done
say "what the ranks saw"
for i in 0 1 2 3; do grep -E 'joined|RESTART|restored|failed|STOP|done' "$work/rank-$i.log" | sed 's/^/  /'; done
ctl job show demo

say "checkpoints written"
ctl checkpoint list demo

restored_at=$(sed -n 's/.*restored step \([0-9]*\) at world size 3.*/\1/p' "$work"/rank-0.log | tail -1)
# The same --steps as the ranks had: the learning-rate schedule depends on it.
say "the same job uninterrupted, for comparison: one rank, all $steps steps"
ctl job create demo-ref --min 1 --max 1 --heartbeat 300ms --misses 3 --last-call 100ms >/dev/null
"$bin/trainer/train/stoker-train" --job demo-ref --member ref-0 --corpus "$work/corpus" \
  --steps "$steps" --checkpoint-every 1000000 >"$work/reference.log" 2>&1 ||
  { echo "reference run failed" >&2; tail "$work/reference.log" >&2; exit 1; }

say "summary"
cat "$work"/rank-*.log | python3 "$root/deploy/local/summary.py" "$out" "$bin/client/cli/stokerctl" \
  demo --reference "$work/reference.log" --restored "${restored_at:-0}"
say "main job finished"
