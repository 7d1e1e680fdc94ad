#!/usr/bin/env bash
# B1 (fuse.write, fuse.read) and B3 (fio) through the FUSE mount, each next
# to the same tool on tmpfs in the same run. One node with a MEM tier in
# /dev/shm; two mounts of it: the default one, and one with passthrough and
# a block size that keeps each benchmark file in one block. Writes
# bench/results/fuse.jsonl and bench/RESULTS.md.
#
#   bench/run-fuse.sh           # B1: 20 files of 100MB, 3 repetitions; B3: 4GiB file, 10s per job
#   bench/run-fuse.sh --quick   # B1: 4 files, 1 repetition; B3: 1GiB file, 5s per job
set -euo pipefail
cd "$(dirname "$0")/.."

files=20; reps=3; fio_size=4G; fio_pt_size=2G; runtime=10; quick=false
if [ "${1:-}" = "--quick" ]; then files=4; reps=1; fio_size=1G; fio_pt_size=1G; runtime=5; quick=true; fi

command -v fio >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio fuse3 >/dev/null
cargo build --release --bins --locked
bin=$PWD/target/release
work=$(mktemp -d /var/tmp/curvine-bench-fuse.XXXXXX)
shm=$(mktemp -d /dev/shm/curvine-bench-fuse.XXXXXX)
mnt=$work/mnt; ptmnt=$work/ptmnt
mkdir -p "$mnt" "$ptmnt" "$shm/local" "$shm/tier"
node_pid=""
cleanup() {
  for m in "$mnt" "$ptmnt"; do "$bin/curvine-cli" fuse umount --lazy "$m" >/dev/null 2>&1 || true; done
  [ -n "$node_pid" ] && { kill "$node_pid" 2>/dev/null || true; wait "$node_pid" 2>/dev/null || true; }
  rm -rf "$work" "$shm"
}
trap cleanup EXIT

echo "warming up memory" >&2
dd if=/dev/zero of="$shm/warm" bs=1M count=12288 status=none 2>/dev/null || true
rm -f "$shm/warm"

port=$((20000 + RANDOM % 20000))
addr=127.0.0.1:$port
"$bin/curvine-node" start --data-dir "$work/node" --listen "$addr" \
  -c "node.cluster_listen=127.0.0.1:$((port + 1))" -c "data.listen=127.0.0.1:$((port + 2))" \
  -c "data.tiers=[MEM:14GiB]$shm/tier" -c log.level=warn 2>"$work/node.log" &
node_pid=$!
for _ in $(seq 100); do grep -q "serving clients" "$work/node.log" 2>/dev/null && break; sleep 0.1; done
"$bin/curvine-cli" --cluster "$addr" fuse mount "$mnt" --daemon --log-file "$work/fuse.log" -c log.level=warn >&2
"$bin/curvine-cli" --cluster "$addr" fuse mount "$ptmnt" --daemon --log-file "$work/ptfuse.log" \
  --passthrough --block-size 128MiB -c log.level=warn >&2

mkdir -p bench/results
results=bench/results/fuse.jsonl
: > "$results"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
b1() {
  local label=$1 action=$2 dir=$3 t=$4
  "$bin/curvine-bench" --action "$action" --dir "$dir" --client-threads "$t" --file-num "$files" \
    --file-size 100MB --buf-size 128KB --checksum true --json --label "$label" | tee -a "$results" >&2
}

# B1: write then read the same files; the page cache is dropped before each
# read so reads come from the cluster (or the tmpfs), not from written pages.
for t in 2 8; do
  for r in $(seq "$reps"); do
    for side in mount passthrough tmpfs; do
      case $side in
        mount) dir=$mnt/b1-$t-$r; wa=fuse.write; ra=fuse.read ;;
        passthrough) dir=$ptmnt/b1pt-$t-$r; wa=fuse.write; ra=fuse.read ;;
        tmpfs) dir=$shm/local/b1-$t-$r; wa=local.write; ra=local.read ;;
      esac
      mkdir -p "$dir"
      b1 "$side" "$wa" "$dir" "$t"
      drop
      b1 "$side" "$ra" "$dir" "$t"
      rm -rf "$dir"
    done
  done
done

# B3: fio on one file loaded into the cache, read through the mount with
# direct I/O, next to the same job on the same file in tmpfs.
fio_job() {
  local label=$1 file=$2 rw=$3 bs=$4 jobs=$5 size=$6
  fio --name=read_test --filename="$file" --rw="$rw" --bs="$bs" --numjobs="$jobs" --iodepth=1 \
    --ioengine=libaio --direct=1 --readonly --group_reporting --size="$size" --runtime="$runtime" \
    --time_based --output-format=json 2>"$work/fio.err" | python3 -c '
import json, sys
text = sys.stdin.read()
if "{" not in text:
    sys.exit("fio printed no result: " + open(sys.argv[6]).read())
j = json.loads(text[text.index("{"):])["jobs"][0]["read"]
label, rw, bs, jobs, size = sys.argv[1:6]
print(json.dumps({"action": "fio", "label": label, "rw": rw, "bs": bs, "threads": int(jobs),
                  "size": size, "iops": j["iops"], "mib_per_sec": j["bw"] / 1024}))' "$label" "$rw" "$bs" "$jobs" "$size" "$work/fio.err" \
    | tee -a "$results" >&2
}
dd if=/dev/urandom of="$shm/local/fio" bs=1M count=$(( ${fio_size%G} * 1024 )) status=none
cp "$shm/local/fio" "$mnt/fio"
# Passthrough needs the file in one block (2GiB at most).
head -c "$(( ${fio_pt_size%G} << 30 ))" "$shm/local/fio" > "$shm/local/fio-pt"
"$bin/curvine-cli" --cluster "$addr" fs put --block-size 2GiB "$shm/local/fio-pt" /fio-pt >&2
for spec in "read 256k" "randread 4k"; do
  set -- $spec
  for jobs in 1 4 16; do
    fio_job mount "$mnt/fio" "$1" "$2" "$jobs" "$fio_size"
    fio_job tmpfs "$shm/local/fio" "$1" "$2" "$jobs" "$fio_size"
    fio_job passthrough "$ptmnt/fio-pt" "$1" "$2" "$jobs" "$fio_pt_size"
    fio_job tmpfs-pt "$shm/local/fio-pt" "$1" "$2" "$jobs" "$fio_pt_size"
  done
done

python3 - "$files" "$reps" "$fio_size" "$fio_pt_size" "$runtime" "$quick" > bench/results/fuse.info.json <<'PY'
import json, subprocess, sys, datetime
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "commit": commit, "files": int(sys.argv[1]), "reps": int(sys.argv[2]),
                  "fio_size": sys.argv[3], "fio_pt_size": sys.argv[4], "runtime": int(sys.argv[5]),
                  "quick": sys.argv[6] == "true"}))
PY
python3 bench/report.py > bench/RESULTS.md
echo "wrote bench/RESULTS.md" >&2
