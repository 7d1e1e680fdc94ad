#!/usr/bin/env bash
# Nemesis schedules on real node processes (integration/tests/nemesis.rs):
# 3 nodes, every shard a group of 3, clients recording their calls while
# the schedule kills the whole cluster twice within its recovery (crash
# loops), kills single nodes, kills two of three, pauses nodes with
# SIGSTOP, cuts the leaders' node or a follower off (network namespaces,
# as root), fills a node's metadata disk (a small tmpfs, as root), and
# steps a node's wall clock (libfaketime, Debian's faketime). CI runs the
# crash loops and the leader partitions; the others are `#[ignore]`d
# there and run here. Each run checks the history for linearizability, every
# acknowledged content, admin fsck, and that every shard serves again
# within 10 s of the last fault; this script records, per schedule and
# seed, whether it held and how long the shards took to serve again.
# Writes results/nemesis.jsonl and RESULTS.md.
#
#   bench/run-nemesis.sh           # 6 seeds x 3 rounds per schedule
#   bench/run-nemesis.sh --quick   # 1 seed x 3 rounds
#   bench/run-nemesis.sh --smoke   # 1 seed x 1 round
#
# NEMESIS_SEEDS="1 2 3" replays those seeds instead of random ones.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init "$@"

case $mode in
  # More rounds per run make longer histories with more calls of unknown
  # outcome, which the linearizability checker's search grows steeply
  # with (10 rounds of crash loops: 2,800 calls, 60 unknown, over 6
  # minutes of search): more seeds instead.
  full) seeds=6; rounds=3 ;;
  quick) seeds=1; rounds=3 ;;
  smoke) seeds=1; rounds=1 ;;
esac
# The clock-step schedule preloads libfaketime; the partitions need ip.
need faketime faketime
need ip iproute2
# The schedules run from the test binary (a debug build: it only drives
# the nodes), on the node and CLI binaries of $bin (release ones unless
# BENCH_BIN_DIR names others).
test_bin=$(cargo test --locked -p curvine-integration --test nemesis --no-run 2>&1 \
  | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
[ -x "$test_bin" ] || { echo "run-nemesis: cannot find the nemesis test binary" >&2; exit 1; }
export TEST_BIN_DIR=$bin

results nemesis
for schedule in crash_loops_of_the_whole_cluster_lose_nothing kills_of_single_nodes_lose_nothing \
    kills_of_two_of_three_nodes_lose_nothing paused_nodes_lose_nothing \
    partitions_of_the_leader_lose_nothing partitions_of_a_follower_lose_nothing \
    a_full_metadata_disk_loses_nothing clock_steps_on_one_node_lose_nothing; do
  if [ -n "${NEMESIS_SEEDS:-}" ]; then list=$NEMESIS_SEEDS; else
    list=$(for _ in $(seq "$seeds"); do od -An -N8 -tu8 /dev/urandom | tr -d ' '; done)
  fi
  for seed in $list; do
    log=$work/$schedule-$seed.log
    started=$(date +%s.%N)
    # The linearizability checker's search can take very long on an
    # unlucky history (many calls of unknown outcome): a run it has not
    # decided within 4 minutes counts as undecided, not as failed.
    if NEMESIS_SEED=$seed NEMESIS_ROUNDS=$rounds timeout 240 "$test_bin" --exact "$schedule" --include-ignored --nocapture >"$log" 2>&1; then
      held=true
    elif [ $? = 124 ] && grep -q "with a known outcome" "$log"; then
      held=undecided
      pkill -f "curvine-node start --data-dir /tmp/" || true
    else
      held=false
      tail -30 "$log" >&2
    fi
    python3 - "$schedule" "$seed" "$rounds" "$held" "$started" "$log" <<'PY' | record
import json, re, sys, time
schedule, seed, rounds, held, started, log = sys.argv[1:]
text = open(log, errors="replace").read()
served = re.search(r"every shard served again ([0-9.]+)(ms|s|µs) after", text)
secs = None
if served:
    v, unit = float(served.group(1)), served.group(2)
    secs = v / 1000 if unit == "ms" else v / 1e6 if unit == "µs" else v
calls = re.search(r": (\d+) calls, (\d+) with a known outcome", text)
print(json.dumps({"schedule": schedule, "seed": seed, "rounds": int(rounds),
                  "held": None if held == "undecided" else held == "true",
                  "served_again_s": secs,
                  "calls": int(calls.group(1)) if calls else None,
                  "known": int(calls.group(2)) if calls else None,
                  "seconds": round(time.time() - float(started), 1)}))
PY
  done
done
write_info nemesis seeds="$seeds" rounds="$rounds"
report
grep -q '"held": false' "$results_file" && { echo "run-nemesis: a schedule failed (see above)" >&2; exit 1; }
exit 0
