#!/usr/bin/env bash
# Load held, measured: one node under four heavy workloads, each for a few
# minutes, sampling the node's (and the mounts') resident memory and open
# descriptors every few seconds:
#   conns      1,000 client connections at once (a client each), every one
#              creating, stating and removing a file of its own, 10 calls
#              a second each, then as fast as answered; the same calls from
#              one connection alone first (idle)
#   open-files 10,000 files held open at once through one FUSE mount, each
#              read once, then held: memory added per open file
#   mounts     20 FUSE mounts of the node, each reading a 64 MiB file and
#              stating it over and over: their memory together
#   load-jobs  50 load jobs at once, each caching 20 objects of a bucket on
#              the test S3 server through a cache_mode mount
# Writes results/load.jsonl and RESULTS.md.
#
#   bench/run-load.sh           # 3 minutes per workload
#   bench/run-load.sh --quick   # 20 s per workload, 200 connections, 2,000 files
#   bench/run-load.sh --smoke   # seconds, tiny counts
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init "$@"

case $mode in
  full) secs=180; conns=1000; open_files=10000; n_mounts=20; jobs=50 ;;
  quick) secs=20; conns=200; open_files=2000; n_mounts=20; jobs=50 ;;
  smoke) secs=3; conns=20; open_files=100; n_mounts=3; jobs=3 ;;
esac

need fusermount3 fuse3
# Enough descriptors for the connections and the open files (this shell
# and what it starts).
ulimit -n "$(ulimit -Hn)"
port=$(free_port)
addr=127.0.0.1:$port
start_node node 127.0.0.1 "$port" "[MEM:4GiB]$shm/tier"
node_pid=${pids[-1]}
cli() { "$bin/curvine-cli" --cluster "$addr" "$@"; }
results load

# sample OUT PIDS...: every 2 s until killed, one line "t rss_kib fds" of
# the processes together.
sample() {
  local out=$1; shift
  local t0=$SECONDS
  while true; do
    local rss=0 fds=0 p r
    for p in "$@"; do
      r=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
      rss=$((rss + ${r:-0}))
      fds=$((fds + $(ls "/proc/$p/fd" 2>/dev/null | wc -l)))
    done
    echo "$((SECONDS - t0)) $rss $fds" >> "$out"
    sleep 2
  done
}

# resources WORKLOAD FILE [KEY=VALUE...]: a row of what `sample` saw.
resources() {
  python3 - "$@" <<'PY' | record
import json, sys
workload, path = sys.argv[1], sys.argv[2]
rows = [tuple(map(int, l.split())) for l in open(path) if l.strip()]
extra = {}
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    try:
        v = float(v)
    except ValueError:
        pass
    extra[k] = v
print(json.dumps({"action": "load.resources", "workload": workload,
                  "samples": [{"t": t, "rss_kib": r, "fds": f} for t, r, f in rows],
                  "max_rss_kib": max((r for _, r, _ in rows), default=0),
                  "max_fds": max((f for _, _, f in rows), default=0), **extra}))
PY
}

# Paced (10 calls a second each: the node's latency with that many
# connections), then one call after another (its throughput; latency is
# then the connections over the throughput).
for rate in 10 0; do
  echo "== conns: $conns connections for ${secs}s, $rate calls/s each (0: unpaced)" >&2
  sample "$work/conns-$rate.samples" "$node_pid" & sampler=$!
  "$bin/curvine-bench" --cluster "$addr" --action load.conns --dir "/conns-$rate" \
    --client-threads "$conns" --seconds "$secs" --rate "$rate" --json --label "conns-$rate" | record
  kill "$sampler"; wait "$sampler" 2>/dev/null || true
  resources "conns-$rate" "$work/conns-$rate.samples"
done

echo "== open-files: $open_files files held open through one mount" >&2
mnt=$work/mnt
fuse_mount "$addr" "$mnt"
mount_pid=$(pgrep -f -- "fuse mount $mnt " | head -1)
sample "$work/open.samples" "$node_pid" "$mount_pid" & sampler=$!
python3 - "$mnt/open" "$open_files" "$secs" "$node_pid" "$mount_pid" <<'PY' | record
import json, os, resource, sys, time
d, n, secs, pids = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
def rss():
    total = 0
    for p in pids:
        for line in open(f"/proc/{p}/status"):
            if line.startswith("VmRSS"):
                total += int(line.split()[1])
    return total
os.makedirs(d, exist_ok=True)
for i in range(n):
    with open(f"{d}/f{i:05}", "wb") as f:
        f.write(os.urandom(4096))
time.sleep(2)
before = rss()
t = time.time()
fds = []
for i in range(n):
    fd = os.open(f"{d}/f{i:05}", os.O_RDONLY)
    assert len(os.read(fd, 4096)) == 4096
    fds.append(fd)
opened_s = time.time() - t
time.sleep(2)
held = rss()
end = time.time() + secs
while time.time() < end:
    time.sleep(1)
after = rss()
for fd in fds:
    os.close(fd)
print(json.dumps({"action": "load.open_files", "files": n, "open_seconds": opened_s,
                  "rss_before_kib": before, "rss_held_kib": held, "rss_end_kib": after,
                  "kib_per_file": (max(held, after) - before) / n}))
PY
kill "$sampler"; wait "$sampler" 2>/dev/null || true
resources open-files "$work/open.samples"

echo "== mounts: $n_mounts mounts of the node" >&2
head -c $((64 << 20)) /dev/urandom > "$work/big"
cli fs put "$work/big" /big >&2
mpids=()
for i in $(seq "$n_mounts"); do
  fuse_mount "$addr" "$work/m$i"
  mpids+=("$(pgrep -f -- "fuse mount $work/m$i " | head -1)")
done
sample "$work/mounts.samples" "${mpids[@]}" & sampler=$!
readers=()
reads=$work/mounts.reads
: > "$reads"
for i in $(seq "$n_mounts"); do
  (end=$((SECONDS + secs)); n=0
   while [ $SECONDS -lt $end ]; do
     cat "$work/m$i/big" > /dev/null && stat "$work/m$i/big" > /dev/null && n=$((n + 1))
   done; echo "$n" >> "$reads") & readers+=($!)
done
wait "${readers[@]}"
kill "$sampler"; wait "$sampler" 2>/dev/null || true
resources mounts "$work/mounts.samples" mounts="$n_mounts" \
  reads="$(awk '{s += $1} END {print s}' "$reads")"
for i in $(seq "$n_mounts"); do
  "$bin/curvine-cli" fuse umount "$work/m$i" >&2 || true
done

echo "== load-jobs: $jobs jobs at once" >&2
s3_start
for j in $(seq "$jobs"); do
  "$bin/curvine-bench" --action ufs.put --ufs "s3://$UFS_TEST_S3_BUCKET/jobs/j$j" "${props[@]}" \
    --file-num 20 --client-threads 4 --json --label put > /dev/null
done
cli mount "s3://$UFS_TEST_S3_BUCKET/jobs" /jobs "${props[@]}" >&2
sample "$work/jobs.samples" "$node_pid" & sampler=$!
t0=$(date +%s.%N)
ids=()
for j in $(seq "$jobs"); do
  ids+=("$(cli --json load "/jobs/j$j" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')")
done
for id in "${ids[@]}"; do
  until cli --json load-status "$id" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
sys.exit(0 if j["state"].lower() not in ("listing", "running") else 1)'; do
    sleep 1
  done
done
t1=$(date +%s.%N)
kill "$sampler"; wait "$sampler" 2>/dev/null || true
cli --json load-status | python3 -c '
import json, sys
jobs = json.loads(sys.stdin.read())
jobs = [j for j in jobs if j["path"].startswith("/jobs/")]
secs = float(sys.argv[1])
print(json.dumps({"action": "load.jobs", "jobs": len(jobs), "seconds": secs,
                  "files": sum(j["files_done"] for j in jobs),
                  "failed": sum(j["files_failed"] for j in jobs),
                  "bytes": sum(j["bytes_done"] for j in jobs),
                  "states": sorted({j["state"] for j in jobs})}))' "$(echo "$t1 - $t0" | bc)" | record
resources load-jobs "$work/jobs.samples" jobs="$jobs"

write_info load seconds="$secs" connections="$conns" open_files="$open_files" \
  mounts="$n_mounts" jobs="$jobs" cores="$(nproc)"
report
