#!/usr/bin/env bash
# B1 (large files) and the metadata benchmark on a cluster of 3 node
# processes on this machine, next to one node alone, measured in the same
# run. The cluster's shards are spread evenly (`admin rebalance`), so most
# metadata requests cross from the node the client talks to into another
# node. The client talks to the first node; B1 blocks go to that node (local
# first), read over short-circuit and over the data port; `replicas 2` adds a
# copy on another node at close. That cluster keeps one copy of each shard
# (`meta.replicas 1`). A second cluster of 3 nodes with `meta.replicas 3`
# (the default: every shard a Raft group with a member on each node, its
# leaders spread by `admin rebalance`) runs the same metadata benchmark:
# each commit waits for a second node's log. Then failover on that cluster:
# the time from a kill -9 of a node leading shards to the first write that
# succeeds on one of them (10 kills; 3 --quick, 1 --smoke). Writes
# results/cluster.jsonl and RESULTS.md.
#
#   bench/run-cluster.sh           # 20,000 entries, 10 files of 100MB, 3 repetitions
#   bench/run-cluster.sh --quick   # 2,000 entries, 2 files, 1 repetition
#   bench/run-cluster.sh --smoke   # 200 entries, 1 file of 4MB
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init "$@"

case $mode in
  full) entries=20000; files=10; size=100MB; reps=3 ;;
  quick) entries=2000; files=2; size=100MB; reps=1 ;;
  smoke) entries=200; files=1; size=4MB; reps=1 ;;
esac
threads=8

port=$(free_port)
# node NAME HOST PORT [ARGS...]: a node with a MEM tier in /dev/shm.
node() {
  local name=$1 host=$2 p=$3; shift 3
  start_node "$name" "$host" "$p" "[MEM:4GiB]$shm/$name" "$@"
}
node single 127.0.0.1 "$port"
node c0 127.0.0.1 $((port + 10)) -c meta.replicas=1
node c1 127.0.0.2 $((port + 20)) -c meta.replicas=1 --seeds "127.0.0.1:$((port + 11))"
node c2 127.0.0.3 $((port + 30)) -c meta.replicas=1 --seeds "127.0.0.1:$((port + 11))"
# The replicated cluster's nodes, as started (failover restarts them).
declare -A replicated_node=(
  [r0]="r0 127.0.0.1 $((port + 40)) -c meta.replicas=3"
  [r1]="r1 127.0.0.2 $((port + 50)) -c meta.replicas=3 --seeds 127.0.0.1:$((port + 41))"
  [r2]="r2 127.0.0.3 $((port + 60)) -c meta.replicas=3 --seeds 127.0.0.1:$((port + 41))"
)
for r in r0 r1 r2; do
  # shellcheck disable=SC2086
  node ${replicated_node[$r]}
done
single="127.0.0.1:$port"
cluster="127.0.0.1:$((port + 10))"
replicated="127.0.0.1:$((port + 40))"
for _ in $(seq 100); do
  up=$("$bin/curvine-cli" --cluster "$cluster" --json report | python3 -c \
    "import json,sys; print(sum(n['state']=='up' for n in json.load(sys.stdin)['nodes']))")
  [ "$up" = 3 ] && break
  sleep 0.2
done
"$bin/curvine-cli" --cluster "$cluster" admin rebalance >&2
# wait_voters ADDR: until every shard's group has 3 voters, as the node at
# ADDR reports them.
wait_voters() {
  local voters=0
  for _ in $(seq 300); do
    voters=$("$bin/curvine-cli" --cluster "$1" --json report 2>/dev/null | python3 -c \
      "import json,sys; r=json.load(sys.stdin); g=[s['group'] for n in r['nodes'] for s in n['shards'] if s.get('group')]; print(sum(len(x['voters'])==3 for x in g))" 2>/dev/null || echo 0)
    [ "$voters" = 16 ] && return 0
    sleep 0.2
  done
  echo "the replicated cluster did not form ($voters of 16 shards with 3 voters)" >&2
  return 1
}
wait_voters "$replicated"
"$bin/curvine-cli" --cluster "$replicated" admin rebalance >&2

results cluster
data() {
  local label=$1; shift
  "$bin/curvine-bench" "$@" --file-num "$files" --file-size "$size" --buf-size 128KB \
    --checksum true --client-threads "$threads" --json --label "$label" | record
}
meta() {
  local label=$1 addr=$2 dir=$3
  "$bin/curvine-bench" --cluster "$addr" --action meta.all --dir "$dir" \
    --client-threads "$threads" --file-num "$entries" --dir-num 100 --json --label "$label" | record
}

for r in $(seq "$reps"); do
  echo "== repetition $r" >&2
  # Alternate which goes first (see run-data.sh on this machine's memory).
  if [ $((r % 2)) = 1 ]; then order="single cluster"; else order="cluster single"; fi
  for who in $order; do
    if [ "$who" = single ]; then addr=$single; else addr=$cluster; fi
    meta "$who" "$addr" "/meta$r"
    data "$who" --cluster "$addr" --action fs.write --dir "/w$r"
    data "$who" --cluster "$addr" --action fs.read --dir "/w$r"
    data "$who-remote" --cluster "$addr" -c client.short_circuit=false --action fs.read --dir "/w$r"
    "$bin/curvine-cli" --cluster "$addr" fs rm -r "/w$r" "/meta$r"
  done
  meta replicas3 "$replicated" "/meta$r"
  "$bin/curvine-cli" --cluster "$replicated" fs rm -r "/meta$r"
  # Two replicas: the close copies every block to a second node.
  data cluster-replicas2 --cluster "$cluster" --replicas 2 --action fs.write --dir "/r$r"
  "$bin/curvine-cli" --cluster "$cluster" fs rm -r "/r$r"
done

# Failover: ROUNDS times, kill -9 a node of the replicated cluster that
# leads shards (in turn), and time from the kill to the first successful
# write on one of its shards, made through another node (the call waits for
# the new leader). The node then starts again and leadership spreads back.
failover() {
  local rounds=$1 round victim pid pick dir ask t0 t1
  "$bin/curvine-cli" --cluster "$replicated" fs mkdir /fo >&2
  for i in $(seq 0 31); do "$bin/curvine-cli" --cluster "$replicated" fs mkdir "/fo/d$i" >&2; done
  for round in $(seq "$rounds"); do
    victim=r$((round % 3))
    # A directory whose entries live on a shard the victim leads, and a
    # survivor to ask.
    pick=$(python3 - "$bin/curvine-cli" "$replicated" "$work/$victim/ready.json" <<'PY'
import json, subprocess, sys
cli, addr, ready = sys.argv[1:]
me = json.load(open(ready))["node_id"]
def run(*a):
    return json.loads(subprocess.run([cli, "--cluster", addr, "--json", *a], check=True,
                                     capture_output=True, text=True).stdout)
report = run("report")
led = {s["shard"] for n in report["nodes"] if n["node_id"] == me for s in n["shards"]}
ask = next(n["rpc_addr"] for n in report["nodes"] if n["node_id"] != me and n["state"] == "up")
for i in range(32):
    ino = run("fs", "stat", f"/fo/d{i}")["ino"]
    if (ino >> 56) in led:
        print(f"/fo/d{i} {ask}")
        break
PY
)
    [ -n "$pick" ] || { echo "failover: $victim leads none of the directories' shards" >&2; continue; }
    read -r dir ask <<<"$pick"
    pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$work/$victim/ready.json")
    kill -9 "$pid"
    t0=$(date +%s.%N)
    "$bin/curvine-cli" --cluster "$ask" fs touch "$dir/after-kill-$round" >&2
    t1=$(date +%s.%N)
    python3 -c 'import json,sys; print(json.dumps({"label": "failover", "action": "failover", "round": int(sys.argv[1]), "seconds": round(float(sys.argv[3]) - float(sys.argv[2]), 3)}))' \
      "$round" "$t0" "$t1" | record
    wait "$pid" 2>/dev/null || true
    # shellcheck disable=SC2086
    node ${replicated_node[$victim]}
    wait_voters "$ask"
    # Leadership returns to the restarted node once it has caught up.
    sleep 3
  done
}
case $mode in
  full) failover 10 ;;
  quick) failover 3 ;;
  smoke) failover 1 ;;
esac

write_info cluster entries="$entries" files="$files" file_size="$size" reps="$reps"
report
