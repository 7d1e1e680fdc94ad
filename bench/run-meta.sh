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

python3 - "$files" > bench/results/meta.info.json <<'PY'
import json, subprocess, sys, datetime
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
fstype = subprocess.run("df -T /var/tmp | awk 'NR==2 {print $2}'", shell=True, capture_output=True, text=True).stdout.strip()
print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "commit": commit, "entries": int(sys.argv[1]), "fstype": fstype}))
PY
python3 bench/report.py > bench/RESULTS.md
echo "wrote bench/RESULTS.md" >&2
