#!/usr/bin/env bash
# B1 (fuse.write, fuse.read) and B3 (fio) through the FUSE mount, each next
# to the same tool on tmpfs in the same run. One node with a MEM tier in
# /dev/shm; three mounts of it: the default one (passthrough is on; the
# benchmark files are several blocks, written in order through the mount,
# so each is one extent file on the node and passes through from its first
# open: B1 reads them twice; B3's file is copied in and read once first), one
# with a block size that keeps each benchmark file in one block, read by
# passthrough (B1 and B3), and one with the kernel's writeback cache, which
# rules passthrough out (B1). A second node on 127.0.0.2 holds files whose
# blocks are all on it, read through mounts of the first node with
# short-circuit off: one without local copies, where every read goes to
# the other node's data port (B1 beside iperf3 over loopback, B3 beside
# tmpfs), and the default one, where a file opened a second time is copied
# to the first node and passed through (B3 after two reads). Writes
# results/fuse.jsonl and RESULTS.md. Last, the kernel's FUSE transports on
# their own (curvine-fuse-transport): /dev/fuse against FUSE-over-io_uring.
#
#   bench/run-fuse.sh           # B1: 20 files of 100MB, 3 repetitions, and 4 of 1GiB; B3: 4GiB file, 5s per job
#   bench/run-fuse.sh --quick   # B1: 2 files, 1 repetition; B3: 512MiB file, 1s per job
#   bench/run-fuse.sh --smoke   # B1: 1 file of 4MB; B3: 64MiB file, 1s per job
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init "$@"

case $mode in
  full) files=20; size=100MB; reps=3; big_files=4; big_size=1GiB; fio_mib=4096; fio_pt_mib=2048; runtime=5 ;;
  quick) files=2; size=100MB; reps=1; big_files=2; big_size=1GiB; fio_mib=512; fio_pt_mib=512; runtime=1 ;;
  smoke) files=1; size=4MB; reps=1; big_files=1; big_size=80MiB; fio_mib=64; fio_pt_mib=64; runtime=1 ;;
esac

need fio fio
need fusermount3 fuse3
need iperf3 iperf3
warm_memory 12
mnt=$work/mnt; ptmnt=$work/ptmnt; wbmnt=$work/wbmnt
mkdir -p "$shm/local"
port=$(free_port)
addr=127.0.0.1:$port
start_node node 127.0.0.1 "$port" "[MEM:14GiB]$shm/tier"
fuse_mount "$addr" "$mnt"
fuse_mount "$addr" "$ptmnt" --block-size 128MiB
fuse_mount "$addr" "$wbmnt" --writeback-cache
# The second node, a mount of the first that reads its blocks over the
# data port, and one that has the first node copy a file opened again.
fport=$(free_port)
far=127.0.0.2:$fport
start_node far 127.0.0.2 "$fport" "[MEM:7GiB]$shm/far-tier" --seeds "127.0.0.1:$((port + 1))"
rmnt=$work/rmnt; rcmnt=$work/rcmnt
fuse_mount "$addr" "$rmnt" -c client.short_circuit=false -c fuse.local_copies=false
fuse_mount "$addr" "$rcmnt" -c client.short_circuit=false

results fuse
b1() {
  local label=$1 action=$2 dir=$3 t=$4
  "$bin/curvine-bench" --action "$action" --dir "$dir" --client-threads "$t" --file-num "${n:-$files}" \
    --file-size "${sz:-$size}" --buf-size 128KB --checksum true --json --label "$label" | record
}

# Waits (60 s at most) until the first node has laid each file out in one
# extent file (files of several blocks, or each file of directories, on a
# mount of it): an open through the mount asked for it, and later opens
# pass through.
laid_out() {
  local f p deadline=$((SECONDS + 60))
  for f in $(find "$@" -type f); do
    p=/${f#"$work"/*/}  # the path in the cluster (every mount shows its root)
    until "$bin/curvine-cli" --cluster "$addr" --json fs blocks "$p" | python3 -c '
import json, sys
b = json.load(sys.stdin)["blocks"]
here = [next((r["path"] for r in x["replicas"] if r.get("path")), None) for x in b]
sys.exit(0 if len(b) <= 1 or (None not in here and len(set(here)) == 1) else 1)'; do
      [ "$SECONDS" -lt "$deadline" ] || { echo "bench: $p not laid out in one file" >&2; return 1; }
      sleep 0.2
    done
  done
}

# B1: write then read the same files; the page cache is dropped before each
# read so reads come from the cluster (or the tmpfs), not from written pages.
for t in 2 8; do
  for r in $(seq "$reps"); do
    for side in mount passthrough writeback tmpfs; do
      case $side in
        mount) dir=$mnt/b1-$t-$r; wa=fuse.write; ra=fuse.read ;;
        passthrough) dir=$ptmnt/b1pt-$t-$r; wa=fuse.write; ra=fuse.read ;;
        writeback) dir=$wbmnt/b1wb-$t-$r; wa=fuse.write; ra=fuse.read ;;
        tmpfs) dir=$shm/local/b1-$t-$r; wa=local.write; ra=local.read ;;
      esac
      mkdir -p "$dir"
      b1 "$side" "$wa" "$dir" "$t"
      drop_caches
      b1 "$side" "$ra" "$dir" "$t"
      if [ "$side" = mount ]; then
        # Read again (a file the first read found in blocks of their own
        # would have been laid out by then).
        laid_out "$dir"
        drop_caches
        b1 mount-again "$ra" "$dir" "$t"
      fi
      rm -rf "$dir"
    done
    # Files whose blocks are all on the second node.
    "$bin/curvine-bench" --cluster "$far" --action fs.write --dir "/far-$t-$r" --client-threads "$t" \
      --file-num "$files" --file-size "$size" --buf-size 128KB --checksum true >/dev/null
    drop_caches
    b1 remote fuse.read "$rmnt/far-$t-$r" "$t"
    rm -rf "$rmnt/far-$t-$r"
  done
  # What loopback TCP carries with as many streams.
  iport=$(free_port)
  iperf3 -s -p "$iport" -1 >/dev/null 2>&1 &
  sleep 0.5
  iperf3 -c 127.0.0.1 -p "$iport" -t "$runtime" -P "$t" -J 2>/dev/null | python3 -c "
import json, sys
bps = json.load(sys.stdin)['end']['sum_received']['bits_per_second']
print(json.dumps({'action': 'iperf3', 'label': 'iperf3', 'threads': $t, 'gib_per_sec': bps / 8 / 2**30}))" | record
done

# B1 with files of many blocks (1GiB of 64MiB blocks), default mount:
# written in order, each is one extent file on the node, so both reads pass
# through. Beside the same on tmpfs.
n=$big_files sz=$big_size
for r in $(seq "$reps"); do
  for side in mount tmpfs; do
    case $side in
      mount) dir=$mnt/b1-big; wa=fuse.write; ra=fuse.read ;;
      tmpfs) dir=$shm/local/b1-big; wa=local.write; ra=local.read ;;
    esac
    mkdir -p "$dir"
    b1 "$side-big-write" "$wa" "$dir" "$big_files"
    drop_caches
    b1 "$side-big-first" "$ra" "$dir" "$big_files"
    [ "$side" = tmpfs ] || laid_out "$dir"
    drop_caches
    b1 "$side-big" "$ra" "$dir" "$big_files"
    rm -rf "$dir"
  done
done
unset n sz

# B3: fio on one file loaded into the cache, read through the mount with
# direct I/O, next to the same job on the same file in tmpfs.
fio_job() {
  local label=$1 file=$2 rw=$3 bs=$4 jobs=$5 mib=$6
  fio --name=read_test --filename="$file" --rw="$rw" --bs="$bs" --numjobs="$jobs" --iodepth=1 \
    --ioengine=libaio --direct=1 --readonly --group_reporting --size="${mib}M" --runtime="$runtime" \
    --time_based --output-format=json 2>"$work/fio.err" | python3 -c '
import json, sys
text = sys.stdin.read()
if "{" not in text:
    sys.exit("fio printed no result: " + open(sys.argv[6]).read())
j = json.loads(text[text.index("{"):])["jobs"][0]["read"]
label, rw, bs, jobs, mib = sys.argv[1:6]
print(json.dumps({"action": "fio", "label": label, "rw": rw, "bs": bs, "threads": int(jobs),
                  "size": mib + "MiB", "iops": j["iops"], "mib_per_sec": j["bw"] / 1024}))' \
    "$label" "$rw" "$bs" "$jobs" "$mib" "$work/fio.err" | record
}
dd if=/dev/urandom of="$shm/local/fio" bs=1M count="$fio_mib" status=none
cp "$shm/local/fio" "$mnt/fio"
# Written in order by cp, the file is one extent file on the node: fio's
# opens pass through (laid_out checks it).
cat "$mnt/fio" >/dev/null
laid_out "$mnt/fio"
# Passthrough needs the file in one block (2GiB at most).
head -c "$((fio_pt_mib << 20))" "$shm/local/fio" > "$shm/local/fio-pt"
"$bin/curvine-cli" --cluster "$addr" fs put --block-size 2GiB "$shm/local/fio-pt" /fio-pt >&2
# A file whose blocks are all on the second node; the default mount's
# second read of it has the first node copy them into one extent file.
"$bin/curvine-cli" --cluster "$far" fs put "$shm/local/fio" /fio-far >&2
"$bin/curvine-cli" --cluster "$far" fs put "$shm/local/fio-pt" /fio-copied >&2
cat "$rcmnt/fio-copied" >/dev/null
cat "$rcmnt/fio-copied" >/dev/null
laid_out "$rcmnt/fio-copied"
for spec in "read 256k" "randread 4k"; do
  set -- $spec
  for jobs in 1 4 16; do
    fio_job mount "$mnt/fio" "$1" "$2" "$jobs" "$fio_mib"
    fio_job tmpfs "$shm/local/fio" "$1" "$2" "$jobs" "$fio_mib"
    fio_job passthrough "$ptmnt/fio-pt" "$1" "$2" "$jobs" "$fio_pt_mib"
    fio_job tmpfs-pt "$shm/local/fio-pt" "$1" "$2" "$jobs" "$fio_pt_mib"
    fio_job remote "$rmnt/fio-far" "$1" "$2" "$jobs" "$fio_mib"
    fio_job remote-copied "$rcmnt/fio-copied" "$1" "$2" "$jobs" "$fio_pt_mib"
  done
done

# The kernel's FUSE transports on their own: a file system of one file of
# zeros that does no work (curvine-fuse-transport), served by 4 threads
# reading /dev/fuse (as the mount is) or over FUSE-over-io_uring (one
# queue per CPU; Linux 6.14+, the fuse module's enable_uring, set here
# for the run and put back after).
transport() {
  local mode=$1 m=$work/transport-$1; shift
  mkdir -p "$m"
  "$bin/curvine-fuse-transport" --mode "$mode" "$@" "$m" 2>"$work/transport-$mode.log" &
  local pid=$!
  mounts+=("$m")
  for _ in $(seq 50); do [ -e "$m/f" ] && break; sleep 0.1; done
  for spec in "randread 4k 1" "randread 4k 4" "randread 4k 16" "read 1m 1"; do
    set -- $spec
    fio_job "transport-$mode" "$m/f" "$1" "$2" "$3" 1024
  done
  umount "$m"
  wait "$pid" || true
  grep -h "unmounted after" "$work/transport-$mode.log" >&2 || true
}
transport dev --threads 4
uring_param=/sys/module/fuse/parameters/enable_uring
if [ -w "$uring_param" ]; then
  uring_was=$(cat "$uring_param")
  cleanups+=("echo $uring_was > $uring_param")
  echo Y > "$uring_param"
  transport uring --depth 16
else
  echo "bench: this kernel has no FUSE-over-io_uring ($uring_param); transport rows for /dev/fuse only" >&2
fi

write_info fuse files="$files" file_size="$size" reps="$reps" big_files="$big_files" big_size="$big_size" fio_size="${fio_mib}MiB" \
  fio_pt_size="${fio_pt_mib}MiB" runtime="$runtime"
report
