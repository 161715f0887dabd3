#!/usr/bin/env bash
# The ring and FSDP on shaped links (tests/bench/run trainer, part "shaped"):
# each rank in its own network namespace, attached by a veth pair to a bridge
# in a namespace of its own, both ends of every veth shaped by tc's token
# bucket (tbf) to R, so every rank sends and receives at R. R is chosen by
# `shaped_bench calibrate` so that the step's collectives alone take
# BENCH_SHAPED_SHARE (default 0.5) of its compute, i.e. a unit's all-gather
# about half its forward (BENCH_SHAPED_MBIT sets R instead). Root only;
# prints {"skipped": ...} otherwise. On any exit it stops its rank processes
# and deletes its namespaces (and with them the links).
#   tests/bench/shaped_links.sh BUILD_DIR
# Env: BENCH_SHAPED_RANKS (default 2), BENCH_SHAPED_STEPS timed steps per run
# (default 2), BENCH_SHAPED_ROUNDS (default 5), BENCH_SHAPED_RING_MIB per
# collective (default 8), BENCH_SHAPED_RING_ITERS (default 3),
# BENCH_SHAPED_PARTS (default "ring fsdp"), BENCH_SHAPED_BURST_MS: the token
# bucket's depth in milliseconds at R (default 1), BENCH_SHAPED_LATENCY_MS
# (tbf queue, default 50), BENCH_SHAPED_MTU (default 9000).
set -euo pipefail
build=$1
bench=$build/tests/bench/shaped_bench
ranks=${BENCH_SHAPED_RANKS:-2}
steps=${BENCH_SHAPED_STEPS:-2}
rounds=${BENCH_SHAPED_ROUNDS:-5}

skip() {
  printf '{"bench":"trainer","part":"shaped","skipped":"%s"}\n' "$1"
  exit 0
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, veth pairs, tc)"
command -v ip >/dev/null || skip "ip (iproute2) not found"
command -v tc >/dev/null || skip "tc (iproute2) not found"

# One rank per core: the figures are about links, not OpenMP.
export OMP_NUM_THREADS=1
tag=stk$$
br=${tag}br
namespaces=()
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

parts=" ${BENCH_SHAPED_PARTS:-ring fsdp} "
# Jumbo frames, as a training cluster's Ethernet runs (1500 works too: the
# framing and the ACKs sharing each link then cost about 6% of R).
export BENCH_SHAPED_MTU=${BENCH_SHAPED_MTU:-9000}
mtu=$BENCH_SHAPED_MTU
# The fastest of 6 steps: the least loaded moment sets R.
if [ -n "${BENCH_SHAPED_MBIT:-}" ]; then
  mbit=$BENCH_SHAPED_MBIT
else
  calibration=$("$bench" calibrate "$ranks" 6)
  read -r mbit compute_s link_bytes <<<"$calibration"
  echo "shaped: fastest no-collective step ${compute_s} s, ${link_bytes} bytes sent per rank" \
    "and step: R = ${mbit} Mbit/s" >&2
fi

# tbf: a bucket of 1 ms at R (at least 3 frames): a transfer that starts on a
# full bucket gets that much ahead of R, small against a unit's transfer (a
# few percent) and the ring part's (under 1%); up to 50 ms queued before
# drops.
burst=$((mbit * 125 * ${BENCH_SHAPED_BURST_MS:-1}))
[ "$burst" -ge $((3 * (mtu + 14))) ] || burst=$((3 * (mtu + 14)))
shape() { # NAMESPACE DEVICE
  tc -n "$1" qdisc add dev "$2" root tbf rate "${mbit}mbit" burst "$burst" \
    latency "${BENCH_SHAPED_LATENCY_MS:-50}ms"
}
netns() { # NAME
  ip netns add "$1"
  namespaces+=("$1")
  ip -n "$1" link set lo up
}

netns "$br"
ip -n "$br" link add br0 type bridge
ip -n "$br" link set br0 up
addrs=""
for r in $(seq 0 $((ranks - 1))); do
  ns=${tag}r$r
  netns "$ns"
  ip link add "${tag}v$r" type veth peer name "${tag}b$r"
  ip link set "${tag}v$r" netns "$ns" name eth0
  ip link set "${tag}b$r" netns "$br"
  ip -n "$ns" addr add "10.77.0.$((r + 1))/24" dev eth0
  ip -n "$ns" link set eth0 mtu "$mtu" up
  ip -n "$br" link set "${tag}b$r" mtu "$mtu"
  ip -n "$br" link set "${tag}b$r" master br0 up
  shape "$ns" eth0
  shape "$br" "${tag}b$r"
  # A training cluster's setting: an idle connection keeps its window
  # between a step's collectives.
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_slow_start_after_idle=0
  addrs+="${addrs:+,}10.77.0.$((r + 1)):$((29500 + r))"
done

run_ranks() { # MODE ARGS... (rank 0's stdout is the JSON line)
  local mode=$1 rc=0
  shift
  pids=()
  for r in $(seq 0 $((ranks - 1))); do
    ip netns exec "${tag}r$r" "$bench" "$mode" "$r" "$ranks" "$addrs" "$@" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  pids=()
  return $rc
}

if [[ $parts == *" ring "* ]]; then
  run_ranks ring "${BENCH_SHAPED_RING_MIB:-8}" "${BENCH_SHAPED_RING_ITERS:-3}" "$rounds" "$mbit"
fi
if [[ $parts == *" fsdp "* ]]; then
  run_ranks fsdp "$steps" "$rounds" "$mbit"
fi
