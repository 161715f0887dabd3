#!/usr/bin/env bash
# The main job in PyTorch, on one machine (the second way in; main-job.sh is
# the first): installs what is needed (Debian packages, the project's Python
# environment with PyTorch), builds, starts the three services on loopback
# and trains the GPT of trainer/python with FSDP2 over gloo, as four torchrun
# agents with one worker each (as four nodes would run them), rendezvousing
# through the coordinator (--rdzv-backend=stoker). The workers checkpoint
# asynchronously through the checkpoint service (DCP); one agent and its
# worker are killed with SIGKILL (a node lost); the three left re-rendezvous,
# restore the last checkpoint resharded (dataloader position included) and
# train on to the last step. Then the same job runs uninterrupted on one
# worker, and the summary puts the losses after the restore next to it.
# Prints the loss curve (sparkline; PNG with gnuplot), tokens/s, the
# checkpoints, the Explain proof that no data was repeated or skipped, and
# ends with "after restore: max relative loss difference vs uninterrupted
# run: X" (non-zero exit above 1e-4). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=${STOKER_BUILD_DIR:-build}

[ -n "${STOKER_SKIP_DEPS:-}" ] || deploy/install-deps.sh
[ -f "$build/build.ninja" ] || meson setup "$build"
ninja -C "$build"
deploy/python-env.sh

bin=$root/$build
work=$(mktemp -d -t stoker-main-job-pytorch.XXXXXX)
out=${STOKER_OUT_DIR:-$root/main-job-out/pytorch}
mkdir -p "$out"
pids=()
agent_pids=()
cleanup() {
  for p in "${agent_pids[@]}"; do kill_node "$p" >/dev/null; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${STOKER_KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
. "$root/deploy/local/common.sh"
start_services
make_corpus

job=demo-pt
steps=${STOKER_STEPS:-100}
say "creating job $job: 2..4 nodes, heartbeat 300ms, 3 misses, last call 1s"
# shellcheck disable=SC2046 # job_storage_flags is two flag pairs, split on purpose
ctl job create "$job" --min 2 --max 4 --heartbeat 300ms --misses 3 --last-call 1s \
  --label team=research --label framework=pytorch $(job_storage_flags) >/dev/null
ctl job show "$job"

export OMP_NUM_THREADS=1
# The workers' StokerDataset receives its batch stream through the build's libstoker-client.
export STOKER_CLIENT_LIBRARY=${STOKER_CLIENT_LIBRARY-$bin/client/c/libstoker-client.so}
torchrun() { # torchrun NODES_RANGE JOB LOG STEPS: one agent, its own process group (run it with &)
  exec setsid "$root/.venv/bin/torchrun" --nnodes="$1" --nproc-per-node=1 --rdzv-backend=stoker \
    --rdzv-endpoint="$STOKER_COORDINATOR" --rdzv-id="$2" --max-restarts=5 \
    --monitor-interval=0.2 "$root/trainer/python/train_gpt.py" --job "$2" \
    --corpus "$work/corpus" --steps "$4" --checkpoint-every 10 >"$3" 2>&1
}
say "launching 4 torchrun agents, one worker each (C=64 L=2 NH=4 T=64 V=256, global batch 12, async checkpoint every 10 steps)"
for r in 0 1 2 3; do
  torchrun 2:4 "$job" "$work/agent-$r.log" "$steps" &
  agent_pids+=($!)
done
wait_for "$job" world_size = 4 120
wait_for "$job" checkpoint_step -ge 20 240
ctl job show "$job"

gen_before=$(job_field "$job" generation)
say "killing agent 2 and its worker with SIGKILL (a node lost; generation $gen_before, step $(job_field "$job" step))"
kill_node "${agent_pids[2]}" | sed 's/^/  /'
wait "${agent_pids[2]}" 2>/dev/null || true

say "waiting for the survivors to re-rendezvous at 3 and restore"
wait_for "$job" generation -gt "$gen_before" 120
wait_for "$job" world_size = 3 120
for i in 0 1 3; do
  wait "${agent_pids[$i]}" || { echo "agent $i failed" >&2; tail -40 "$work/agent-$i.log" >&2; exit 1; }
done
say "what the workers saw"
grep -hE 'restored|committed|Restarting|world 3' "$work"/agent-*.log | grep -v '^step' | sed 's/^/  /' | head -20
ctl job show "$job"

say "checkpoints written"
ctl checkpoint list "$job"

restored_at=$(sed -n 's/^restored step \([0-9]*\) at world 3.*/\1/p' "$work"/agent-*.log | tail -1)
say "the same job uninterrupted, for comparison: one worker, steps 1..$steps"
(torchrun 1 "$job-ref" "$work/reference.log" "$steps") ||
  { echo "reference run failed" >&2; tail -40 "$work/reference.log" >&2; exit 1; }

say "summary"
cat "$work"/agent-*.log | python3 "$root/deploy/local/summary.py" "$out" \
  "$bin/client/cli/stokerctl" "$job" --reference "$work/reference.log" --restored "${restored_at:-0}"
say "main job finished"
