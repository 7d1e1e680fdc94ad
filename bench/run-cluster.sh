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
# each commit waits for a second node's log. Writes results/cluster.jsonl
# and RESULTS.md.
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
node r0 127.0.0.1 $((port + 40)) -c meta.replicas=3
node r1 127.0.0.2 $((port + 50)) -c meta.replicas=3 --seeds "127.0.0.1:$((port + 41))"
node r2 127.0.0.3 $((port + 60)) -c meta.replicas=3 --seeds "127.0.0.1:$((port + 41))"
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
# The replicated cluster is ready once every shard's group has 3 voters.
for _ in $(seq 300); do
  voters=$("$bin/curvine-cli" --cluster "$replicated" --json report | python3 -c \
    "import json,sys; r=json.load(sys.stdin); g=[s['group'] for n in r['nodes'] for s in n['shards'] if s.get('group')]; print(sum(len(x['voters'])==3 for x in g))")
  [ "$voters" = 16 ] && break
  sleep 0.2
done
[ "$voters" = 16 ] || { echo "the replicated cluster did not form ($voters of 16 shards with 3 voters)" >&2; exit 1; }
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

write_info cluster entries="$entries" files="$files" file_size="$size" reps="$reps"
report
