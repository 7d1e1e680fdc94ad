#!/usr/bin/env bash
# B2, small files over S3: a bucket of FILES image files of 60-140 KB on the
# test S3 server (moto, on loopback), read with 2 and 8 readers
#   - straight from S3 (a GET per file from a native client: the baseline);
#   - through a cache_mode mount of a node: through the client library and
#     through a FUSE mount (first read, then warm);
#   - through the peers on the same bucket: rclone mount --vfs-cache-mode
#     full and s3fs with a local cache (cold, then warm);
#   - from tmpfs;
#   - warm, through the node's S3 gateway (the same GETs as S3 direct) and
#     through fsspec (the curvinefs package, when it is installed);
# every file-system row with the same reader (bench/load_img.py: P processes
# reading whole files); warm reads through the mount with the kernel's and
# the mount's metadata caches off and on, and with Pillow decoding each
# picture; a load job of the bucket; and the ingest step: `rclone copy
# --transfers=16` of the files into an fs_mode mount and into tmpfs. Writes
# results/ufs.jsonl and RESULTS.md.
#
#   bench/run-ufs.sh           # 5,000 files, 10,000 warm reads (peers: 5,000)
#   bench/run-ufs.sh --quick   # 200 files, 800 warm reads
#   bench/run-ufs.sh --smoke   # 40 files
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init "$@"

case $mode in
  full) files=5000; reads=10000; reps=1 ;;
  quick) files=200; reads=800; reps=1 ;;
  smoke) files=40; reads=80; reps=1 ;;
esac

need fusermount3 fuse3
need rclone rclone
need s3fs s3fs
python3 -c 'import PIL' 2>/dev/null || python3 -m pip install --quiet pillow >&2 || true
decode=false
python3 -c 'import PIL' 2>/dev/null && decode=true
s3_start
bucket="s3://$UFS_TEST_S3_BUCKET/b2"
mnt=$work/mnt
port=$(free_port)
addr="127.0.0.1:$port"
# The node also serves S3 (its gateway), for GETs of the cached files.
gw_port=$((port + 5))
start_node node 127.0.0.1 "$port" "[MEM:4GiB]$shm/tier" -c "s3.listen=127.0.0.1:$gw_port" \
  -c s3.access_key=bench -c s3.secret_key=bench-secret
gw_props=(-c "s3.endpoint_url=http://127.0.0.1:$gw_port" -c s3.credentials.access=bench
          -c s3.credentials.secret=bench-secret -c s3.region_name=us-east-1)
cli() { "$bin/curvine-cli" --cluster "$addr" "$@"; }
fuse_mount "$addr" "$mnt"
# The same mount with the kernel's metadata cache (entry and attribute
# timeouts), the mount's own (meta_cache_ttl), both (the default) or neither.
fuse_mount "$addr" "$work/mnt-none" --entry-timeout 0s --attr-timeout 0s --meta-cache-ttl 0s
fuse_mount "$addr" "$work/mnt-kernel" --meta-cache-ttl 0s
fuse_mount "$addr" "$work/mnt-client" --entry-timeout 0s --attr-timeout 0s

# The peers, configured from the environment. rclone 1.60 cannot build its S3
# client when AWS_CA_BUNDLE is set (this environment sets it for others).
export RCLONE_CONFIG_BENCH_TYPE=s3 RCLONE_CONFIG_BENCH_PROVIDER=Other \
  RCLONE_CONFIG_BENCH_ENDPOINT="$UFS_TEST_S3_ENDPOINT" RCLONE_CONFIG_BENCH_REGION=us-east-1 \
  RCLONE_CONFIG_BENCH_ACCESS_KEY_ID="$UFS_TEST_S3_ACCESS" \
  RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY="$UFS_TEST_S3_SECRET"
rclone_() { env -u AWS_CA_BUNDLE rclone --config /dev/null "$@"; }
echo "$UFS_TEST_S3_ACCESS:$UFS_TEST_S3_SECRET" > "$work/s3fs.passwd"
chmod 600 "$work/s3fs.passwd"
# peer_mount rclone|s3fs MNT: a fresh mount of the bucket with an empty cache.
peer_mount() {
  local m=$2
  mkdir -p "$m"
  rm -rf "$work/$1-cache"
  case $1 in
    rclone) rclone_ mount "bench:$UFS_TEST_S3_BUCKET/b2" "$m" --vfs-cache-mode full \
              --cache-dir "$work/rclone-cache" --daemon ;;
    s3fs) s3fs "$UFS_TEST_S3_BUCKET:/b2" "$m" -o url="$UFS_TEST_S3_ENDPOINT" \
            -o use_path_request_style -o endpoint=us-east-1 -o passwd_file="$work/s3fs.passwd" \
            -o use_cache="$work/s3fs-cache" ;;
  esac
  mounts+=("$m")
  for _ in $(seq 100); do mountpoint -q "$m" && return 0; sleep 0.1; done
  echo "$1 did not mount $m" >&2
  return 1
}
peer_umount() { fusermount3 -u "$1" 2>/dev/null || umount "$1"; }

results ufs
# reader LABEL DIR P [ARGS...]: bench/load_img.py on DIR with P processes.
reader() {
  local label=$1 dir=$2 p=$3; shift 3
  python3 "$root/bench/load_img.py" "$dir" --num_workers "$p" --num_samples "$reads" \
    --json --label "$label" "$@" | record
}

echo "== putting $files files into $bucket and into tmpfs" >&2
"$bin/curvine-bench" --action ufs.put --ufs "$bucket" "${props[@]}" --file-num "$files" \
  --client-threads 16 >&2
"$bin/curvine-bench" --action local.put --dir "$shm/src" --file-num "$files" --client-threads 4 >&2

for r in $(seq "$reps"); do
  echo "== repetition $r" >&2
  for t in 2 8; do
    "$bin/curvine-bench" --action ufs.read --ufs "$bucket" "${props[@]}" --file-num "$files" \
      --client-threads "$t" --json --label direct | record
    # A fresh mount each time: nothing of the bucket is cached.
    cli mount "$bucket" "/b2-$r-$t" "${props[@]}" >&2
    "$bin/curvine-bench" --cluster "$addr" --action fs.small-read --dir "/b2-$r-$t" \
      --file-num "$files" --reads "$reads" --client-threads "$t" --json --label cache | record
    cli umount "/b2-$r-$t" >&2
    cli mount "$bucket" "/b2f-$r-$t" "${props[@]}" >&2
    reader fuse "$mnt/b2f-$r-$t" "$t"
    cli umount "/b2f-$r-$t" >&2
    for peer in rclone s3fs; do
      peer_mount "$peer" "$work/$peer-$r-$t"
      # (Their warm reads are slow: as many as there are files.)
      reader "$peer" "$work/$peer-$r-$t" "$t" --num_samples "$files"
      peer_umount "$work/$peer-$r-$t"
    done
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
                  "failed": j["files_failed"]}))' | record
  # Warm reads of the loaded files with the metadata caches on and off.
  for variant in none kernel client both; do
    m=$work/mnt-$variant
    [ "$variant" = both ] && m=$mnt
    reader "fuse-meta-$variant" "$m/load-$r" 8 --phases warm
  done
  if $decode; then
    reader fuse-decode "$mnt/load-$r" 8 --phases warm --decode
  fi
  # The same warm reads through fsspec (the curvinefs package), when it is
  # installed: 8 Python processes, beside the mount's.
  if python3 -c 'import curvinefs' 2>/dev/null; then
    reader fsspec "/load-$r" 8 --phases warm --fsspec "curvine://$addr"
  fi
  # The same GETs as S3 direct, of the loaded files, through the node's S3
  # gateway (bucket load-R is the directory /load-R).
  for t in 2 8; do
    "$bin/curvine-bench" --action ufs.read --ufs "s3://load-$r" "${gw_props[@]}" \
      --file-num "$files" --client-threads "$t" --json --label gateway | record
  done
  cli umount "/load-$r" >&2
done

# Ingest (once): rclone copy into an fs_mode mount, and into tmpfs.
cli mount "s3://$UFS_TEST_S3_BUCKET/ingest" "/ingest" --write-type fs_mode "${props[@]}" >&2
for side in fsmode tmpfs; do
  if [ "$side" = fsmode ]; then dst=$mnt/ingest/bdd; else dst=$shm/ingest; fi
  start=$(date +%s.%N)
  rclone_ copy "$shm/src" "$dst" --transfers=16 >&2
  end=$(date +%s.%N)
  python3 -c "
import json, sys
n, secs = $files, $end - $start
print(json.dumps({'action': 'rclone-copy', 'phase': 'ingest', 'threads': 16, 'files': n,
                'seconds': secs, 'files_per_sec': n / secs, 'label': 'ingest-$side'}))" | record
  got=$(find "$dst" -type f | wc -l)
  [ "$got" = "$files" ] || { echo "rclone copy into $dst left $got of $files files" >&2; exit 1; }
done
# The same reader on tmpfs, and on the fs_mode files just written.
for t in 2 8; do
  reader tmpfs "$shm/ingest" "$t"
  reader fuse-fsmode "$mnt/ingest/bdd" "$t" --phases warm
done
if $decode; then
  reader tmpfs-decode "$shm/ingest" 8 --phases warm --decode
fi

server=$(python3 -c "import moto; print(moto.__version__)")
write_info ufs files="$files" reads="$reads" reps="$reps" \
  s3_server="moto $server (in memory, one Python process)" \
  rclone="$(rclone version | head -1)" s3fs="s3fs $(s3fs --version | head -1 | grep -o 'V[0-9.]*')" \
  pillow="$(python3 -c 'import PIL; print(PIL.__version__)' 2>/dev/null || echo none)"
report
