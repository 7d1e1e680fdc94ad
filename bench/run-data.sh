#!/usr/bin/env bash
# B1, large files: curvine-bench fs.write/fs.read through the client library
# against real nodes, next to the same tool doing plain file I/O on tmpfs (or
# on the disk for the disk-tier rows) and iperf3 over loopback (for reads over
# the data port), all in the same run. Each figure is measured REPS times,
# alternating with its baseline. Writes bench/results/data.jsonl and
# bench/RESULTS.md.
#
#   bench/run-data.sh           # 20 files of 100MB, 4 repetitions (about 4 minutes)
#   bench/run-data.sh --quick   # 4 files of 100MB, 1 repetition
set -euo pipefail
cd "$(dirname "$0")/.."

files=20
reps=4
quick=false
if [ "${1:-}" = "--quick" ]; then files=4; reps=1; quick=true; fi
size=100MB
threads="2 8"

if ! command -v iperf3 >/dev/null; then
  echo "installing iperf3 (the loopback baseline)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null
fi
cargo build --release --bins --locked
bin=target/release
work=$(mktemp -d /var/tmp/curvine-bench-data.XXXXXX)
shm=$(mktemp -d /dev/shm/curvine-bench-data.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work" "$shm"
}
trap cleanup EXIT

# start_node NAME PORT TIER: a node whose only tier is TIER.
start_node() {
  local name=$1 port=$2 tier=$3
  "$bin/curvine-node" start --data-dir "$work/$name" --listen "127.0.0.1:$port" \
    -c "node.cluster_listen=127.0.0.1:$((port + 1))" -c "data.listen=127.0.0.1:$((port + 2))" \
    -c "data.tiers=$tier" -c log.level=warn 2>"$work/$name.log" &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q "serving clients" "$work/$name.log" 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$work/$name.log" >&2
  return 1
}

drop_caches() {
  sync
  echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "cannot drop the page cache (not root?)" >&2
}

# This kind of machine (a VM) backs guest memory lazily: the first touch of a
# page costs far more than later ones, which makes whichever run comes first
# look slow. Touch the memory the runs will use once, before measuring.
echo "warming up memory" >&2
dd if=/dev/zero of="$shm/warm" bs=1M count=12288 status=none 2>/dev/null || true
rm -f "$shm/warm"

port=$((20000 + RANDOM % 20000))
mem_port=$port
disk_port=$((port + 10))
start_node mem "$mem_port" "[MEM:8GiB]$shm/tier"
start_node disk "$disk_port" "[SSD:16GiB]$work/ssd-tier"

mkdir -p bench/results
results=bench/results/data.jsonl
: > "$results"
# run LABEL ARGS...: one curvine-bench run, its JSON line labelled.
run() {
  local label=$1; shift
  "$bin/curvine-bench" "$@" --file-num "$files" --file-size "$size" --buf-size 128KB \
    --checksum true --json --label "$label" | tee -a "$results" >&2
}

for t in $threads; do
  for r in $(seq "$reps"); do
    echo "== MEM tier, $t tasks, repetition $r" >&2
    # Alternate which side goes first, so neither always meets the machine
    # right after the previous phase.
    if [ $((r % 2)) = 1 ]; then
      run mem --cluster "127.0.0.1:$mem_port" --action fs.write --dir "/w$t" --client-threads "$t"
      run tmpfs --action local.write --dir "$shm/local$t" --client-threads "$t"
      run mem --cluster "127.0.0.1:$mem_port" --action fs.read --dir "/w$t" --client-threads "$t"
      run tmpfs --action local.read --dir "$shm/local$t" --client-threads "$t"
    else
      run tmpfs --action local.write --dir "$shm/local$t" --client-threads "$t"
      run mem --cluster "127.0.0.1:$mem_port" --action fs.write --dir "/w$t" --client-threads "$t"
      run tmpfs --action local.read --dir "$shm/local$t" --client-threads "$t"
      run mem --cluster "127.0.0.1:$mem_port" --action fs.read --dir "/w$t" --client-threads "$t"
    fi
    run mem-remote --cluster "127.0.0.1:$mem_port" -c client.short_circuit=false \
      --action fs.read --dir "/w$t" --client-threads "$t"
    "$bin/curvine-cli" --cluster "127.0.0.1:$mem_port" fs rm -r "/w$t"
    run mem-remote --cluster "127.0.0.1:$mem_port" -c client.short_circuit=false \
      --action fs.write --dir "/w$t" --client-threads "$t"
    "$bin/curvine-cli" --cluster "127.0.0.1:$mem_port" fs rm -r "/w$t"
    rm -rf "$shm/local$t"

    echo "== disk tier, $t tasks, repetition $r" >&2
    run disk --cluster "127.0.0.1:$disk_port" --action fs.write --dir "/w$t" --client-threads "$t"
    run disk --action local.write --dir "$work/local$t" --client-threads "$t"
    drop_caches
    run disk --cluster "127.0.0.1:$disk_port" --action fs.read --dir "/w$t" --client-threads "$t"
    drop_caches
    run disk --action local.read --dir "$work/local$t" --client-threads "$t"
    "$bin/curvine-cli" --cluster "127.0.0.1:$disk_port" fs rm -r "/w$t"
    rm -rf "$work/local$t"
  done
  echo "== iperf3 loopback, $t streams" >&2
  iport=$((port + 20))
  iperf3 -s -p "$iport" -1 >/dev/null 2>&1 &
  ipid=$!
  sleep 0.5
  for r in $(seq "$reps"); do
    [ "$r" -gt 1 ] && { iperf3 -s -p "$iport" -1 >/dev/null 2>&1 & ipid=$!; sleep 0.5; }
    iperf3 -c 127.0.0.1 -p "$iport" -t 5 -P "$t" -J 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
bps = d['end']['sum_received']['bits_per_second']
print(json.dumps({'action': 'iperf3', 'label': 'iperf3', 'threads': $t, 'gib_per_sec': bps / 8 / 2**30}))
" | tee -a "$results" >&2
    wait "$ipid" 2>/dev/null || true
  done
done

python3 - "$files" "$size" "$reps" "$quick" > bench/results/data.info.json <<'PY'
import json, subprocess, sys, datetime
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "commit": commit, "files": int(sys.argv[1]), "file_size": sys.argv[2],
                  "reps": int(sys.argv[3]), "quick": sys.argv[4] == "true"}))
PY
python3 bench/report.py > bench/RESULTS.md
echo "wrote bench/RESULTS.md" >&2
