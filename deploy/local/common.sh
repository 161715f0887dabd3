# Shared steps of the main jobs (main-job.sh, main-job-pytorch.sh), sourced
# after $root, $bin, $work and the pids array are set: the daemons on
# loopback, the corpus, and reading the coordinator's view of a job.

say() { printf '\n== %s\n' "$*"; }

start_daemon() { # start_daemon NAME EXTRA...: sets $work/NAME.addr
  local name=$1
  shift
  "$bin/services/$name/stoker-$name" --listen 127.0.0.1:0 --data-dir "$work/$name" \
    --ready-file "$work/$name.addr" --log-level warn "$@" &
  pids+=($!)
  for _ in $(seq 300); do [ -s "$work/$name.addr" ] && return 0; sleep 0.05; done
  echo "stoker-$name did not start" >&2
  return 1
}

start_services() { # exports STOKER_COORDINATOR, STOKER_DATALOADER, STOKER_CHECKPOINT
  say "starting the services on loopback (state in $work)"
  start_daemon coordinator
  export STOKER_COORDINATOR=$(cat "$work/coordinator.addr")
  start_daemon dataloader --data-root "$work" # the corpus is made under $work
  start_daemon checkpoint --coordinator "$STOKER_COORDINATOR" --storage "$(ckpt_storage)"
  export STOKER_DATALOADER=$(cat "$work/dataloader.addr")
  export STOKER_CHECKPOINT=$(cat "$work/checkpoint.addr")
  ctl health
}

ctl() { "$bin/client/cli/stokerctl" "$@"; }

# kill_node PID: a node lost. SIGKILLs the torchrun agent PID (started with
# setsid: the leader of its process group) and its workers: torch starts each
# worker in a session of its own, outside the agent's group, where it would
# train on as an orphan. Prints what it killed.
kill_node() {
  local agent=$1 workers w
  workers=$(pgrep -P "$agent" | paste -sd ' ' -)
  kill -9 -- "-$agent" 2>/dev/null || kill -9 "$agent" 2>/dev/null || true
  for w in $workers; do kill -9 -- "-$w" 2>/dev/null || kill -9 "$w" 2>/dev/null || true; done
  echo "killed agent $agent (its process group) and its workers: ${workers:-none}"
}

# Where the checkpoint service stores (the job spec names it too, so that
# `stokerctl job show` says where a job's data and checkpoints are).
ckpt_storage() { echo "file://$work/checkpoint-store"; }
job_storage_flags() { echo --dataset "file://$work/corpus" --checkpoint-storage "$(ckpt_storage)"; }

make_corpus() { # about 2 MiB of text in $work/corpus
  say "preparing a small corpus from the licence texts on this machine"
  mkdir -p "$work/corpus"
  local i=0 f
  for f in /usr/share/common-licenses/* /usr/share/doc/*/copyright; do
    [ -f "$f" ] && [ -r "$f" ] || continue
    cat "$f" >>"$work/corpus/part-$((i % 4)).txt"
    i=$((i + 1))
    [ "$(du -sk "$work/corpus" | cut -f1)" -lt 2048 ] || break
  done
  du -sh "$work/corpus" | sed 's/^/  /'
}

job_field() { # job_field JOB FIELD: a field of `stokerctl job show`, plus step and checkpoint_step
  ctl --json job show "$1" | python3 -c "
import json, sys
j = json.load(sys.stdin)
j['step'] = max([m['step'] for m in j['members']] or [0])
j['checkpoint_step'] = (j.get('latest_checkpoint') or {}).get('step', 0)
print(j.get('$2', 0))"
}

wait_for() { # wait_for JOB FIELD OP VALUE SECONDS
  for _ in $(seq $(($5 * 5))); do
    [ "$(job_field "$1" "$2")" "$3" "$4" ] && return 0
    sleep 0.2
  done
  echo "timed out waiting for $2 $3 $4" >&2
  ctl job show "$1" >&2
  return 1
}
