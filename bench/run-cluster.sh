#!/usr/bin/env bash
# B1 (large files) and the metadata benchmark on a cluster of 3 node
# processes on this machine, next to one node alone, measured in the same
# run. The cluster's shards are spread evenly (`admin rebalance`), so most
# metadata requests cross from the node the client talks to into another
# node. The client talks to the first node; B1 blocks go to that node (local
# first), read over short-circuit and over the data port; `replicas 2` adds a
# copy on another node at close. Writes bench/results/cluster.jsonl and
# bench/RESULTS.md.
#
#   bench/run-cluster.sh           # 20,000 entries, 10 files of 100MB, 3 repetitions
#   bench/run-cluster.sh --quick   # 4,000 entries, 4 files, 1 repetition
set -euo pipefail
cd "$(dirname "$0")/.."

entries=20000
files=10
reps=3
quick=false
if [ "${1:-}" = "--quick" ]; then entries=4000; files=4; reps=1; quick=true; fi
size=100MB
threads=8

cargo build --release --bins --locked
bin=target/release
work=$(mktemp -d /var/tmp/curvine-bench-cluster.XXXXXX)
shm=$(mktemp -d /dev/shm/curvine-bench-cluster.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work" "$shm"
}
trap cleanup EXIT

port=$((20000 + RANDOM % 20000))
# start_node NAME HOST PORT [ARGS...]: a node with a MEM tier in /dev/shm.
start_node() {
  local name=$1 host=$2 p=$3; shift 3
  "$bin/curvine-node" start --data-dir "$work/$name" --listen "$host:$p" \
    -c "node.cluster_listen=$host:$((p + 1))" -c "data.listen=$host:$((p + 2))" \
    -c "data.tiers=[MEM:4GiB]$shm/$name" -c cluster.cookie=bench -c log.level=warn \
    "$@" 2>"$work/$name.log" &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q "serving clients" "$work/$name.log" 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$work/$name.log" >&2
  return 1
}

start_node single 127.0.0.1 "$port"
start_node c0 127.0.0.1 $((port + 10))
start_node c1 127.0.0.2 $((port + 20)) --seeds "127.0.0.1:$((port + 11))"
start_node c2 127.0.0.3 $((port + 30)) --seeds "127.0.0.1:$((port + 11))"
single="127.0.0.1:$port"
cluster="127.0.0.1:$((port + 10))"
for _ in $(seq 100); do
  up=$("$bin/curvine-cli" --cluster "$cluster" --json report | python3 -c \
    "import json,sys; print(sum(n['state']=='up' for n in json.load(sys.stdin)['nodes']))")
  [ "$up" = 3 ] && break
  sleep 0.2
done
"$bin/curvine-cli" --cluster "$cluster" admin rebalance >&2

mkdir -p bench/results
results=bench/results/cluster.jsonl
: > "$results"
data() {
  local label=$1; shift
  "$bin/curvine-bench" "$@" --file-num "$files" --file-size "$size" --buf-size 128KB \
    --checksum true --client-threads "$threads" --json --label "$label" | tee -a "$results" >&2
}
meta() {
  local label=$1 addr=$2 dir=$3
  "$bin/curvine-bench" --cluster "$addr" --action meta.all --dir "$dir" \
    --client-threads "$threads" --file-num "$entries" --dir-num 100 --json --label "$label" \
    | tee -a "$results" >&2
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
  # Two replicas: the close copies every block to a second node.
  data cluster-replicas2 --cluster "$cluster" --replicas 2 --action fs.write --dir "/r$r"
  "$bin/curvine-cli" --cluster "$cluster" fs rm -r "/r$r"
done

python3 - "$entries" "$files" "$size" "$reps" "$quick" > bench/results/cluster.info.json <<'PY'
import json, subprocess, sys, datetime
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "commit": commit, "entries": int(sys.argv[1]), "files": int(sys.argv[2]),
                  "file_size": sys.argv[3], "reps": int(sys.argv[4]), "quick": sys.argv[5] == "true"}))
PY
python3 bench/report.py > bench/RESULTS.md
echo "wrote bench/RESULTS.md" >&2
