#!/usr/bin/env bash
# B2 (small files over S3), client-library part: a bucket of 5,000 files of
# 60-140 KB on the test S3 server (moto, on loopback), read with 2 and 8
# readers straight from S3 (a GET per file, the seed's baseline), then
# through a cache_mode mount of a node: first read (through to S3, filling
# the cache) and warm reads, through the client library and through a FUSE
# mount of the node (plain file reads, like the seed's load_img.py); and a
# load job of the bucket against the same objects read directly. Writes
# bench/results/ufs.jsonl and bench/RESULTS.md.
#
#   bench/run-ufs.sh           # 5,000 files, 20,000 warm reads, 3 repetitions
#   bench/run-ufs.sh --quick   # 1,000 files, 5,000 warm reads, 1 repetition
set -euo pipefail
cd "$(dirname "$0")/.."

files=5000
reads=20000
reps=3
quick=false
if [ "${1:-}" = "--quick" ]; then files=1000; reads=5000; reps=1; quick=true; fi

cargo build --release --bins --locked
bin=target/release
work=$(mktemp -d /var/tmp/curvine-bench-ufs.XXXXXX)
shm=$(mktemp -d /dev/shm/curvine-bench-ufs.XXXXXX)
node_pid=
mnt=$work/mnt
cleanup() {
  "$bin/curvine-cli" fuse umount --lazy "$mnt" >/dev/null 2>&1 || true
  [ -n "$node_pid" ] && { kill "$node_pid" 2>/dev/null || true; wait "$node_pid" 2>/dev/null || true; }
  integration/s3-server.sh stop "$work/s3" || true
  rm -rf "$work" "$shm"
}
trap cleanup EXIT

integration/s3-server.sh start "$work/s3"
# shellcheck disable=SC1091
source "$work/s3/s3.env"
props=(-c "s3.endpoint_url=$UFS_TEST_S3_ENDPOINT" -c "s3.credentials.access=$UFS_TEST_S3_ACCESS"
       -c "s3.credentials.secret=$UFS_TEST_S3_SECRET" -c s3.region_name=us-east-1)
bucket="s3://$UFS_TEST_S3_BUCKET/b2"

port=$((20000 + RANDOM % 20000))
"$bin/curvine-node" start --data-dir "$work/node" --listen "127.0.0.1:$port" \
  -c "data.tiers=[MEM:4GiB]$shm/node" -c log.level=warn 2>"$work/node.log" &
node_pid=$!
for _ in $(seq 100); do
  grep -q "serving clients" "$work/node.log" 2>/dev/null && break
  sleep 0.1
done
addr="127.0.0.1:$port"
cli() { "$bin/curvine-cli" --cluster "$addr" "$@"; }
mkdir -p "$mnt"
cli fuse mount "$mnt" --daemon --log-file "$work/fuse.log" -c log.level=warn >&2

mkdir -p bench/results
results=bench/results/ufs.jsonl
: > "$results"
echo "== putting $files files into $bucket" >&2
"$bin/curvine-bench" --action ufs.put --ufs "$bucket" "${props[@]}" --file-num "$files" \
  --client-threads 16 >&2

for r in $(seq "$reps"); do
  echo "== repetition $r" >&2
  for t in 2 8; do
    "$bin/curvine-bench" --action ufs.read --ufs "$bucket" "${props[@]}" --file-num "$files" \
      --client-threads "$t" --json --label "direct" | tee -a "$results" >&2
    # A fresh mount: nothing of the bucket is cached.
    cli mount "$bucket" "/b2-$r-$t" "${props[@]}" >&2
    "$bin/curvine-bench" --cluster "$addr" --action fs.small-read --dir "/b2-$r-$t" \
      --file-num "$files" --reads "$reads" --client-threads "$t" --json --label "cache" \
      | tee -a "$results" >&2
    cli umount "/b2-$r-$t" >&2
    # The same through the FUSE mount, on a fresh mount of the bucket.
    cli mount "$bucket" "/b2f-$r-$t" "${props[@]}" >&2
    "$bin/curvine-bench" --action local.small-read --dir "$mnt/b2f-$r-$t" \
      --file-num "$files" --reads "$reads" --client-threads "$t" --json --label "fuse" \
      | tee -a "$results" >&2
    cli umount "/b2f-$r-$t" >&2
  done
  # A load job of the whole bucket into a fresh mount.
  cli mount "$bucket" "/load-$r" "${props[@]}" >&2
  cli --json load --wait "/load-$r" | python3 -c '
import json, sys
j = json.load(sys.stdin)
secs = (j["finished_ns"] - j["created_ns"]) / 1e9
print(json.dumps({"action": "load", "phase": "load", "threads": 0, "files": j["files_done"],
                  "bytes": j["bytes_done"], "seconds": secs, "files_per_sec": j["files_done"] / secs,
                  "mb_per_sec": j["bytes_done"] / 1e6 / secs, "label": "load",
                  "failed": j["files_failed"]}))' | tee -a "$results" >&2
  cli umount "/load-$r" >&2
done

python3 - "$files" "$reads" "$reps" "$quick" > bench/results/ufs.info.json <<'PY'
import json, subprocess, sys, datetime
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
server = subprocess.run(["python3", "-c", "import moto; print(moto.__version__)"], capture_output=True, text=True).stdout.strip()
print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "commit": commit, "files": int(sys.argv[1]), "reads": int(sys.argv[2]),
                  "reps": int(sys.argv[3]), "quick": sys.argv[4] == "true",
                  "s3_server": f"moto {server} (in memory, one Python process)"}))
PY
python3 bench/report.py > bench/RESULTS.md
echo "wrote bench/RESULTS.md" >&2
