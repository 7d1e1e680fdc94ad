#!/usr/bin/env bash
# B4, metadata: create, stat, ls, rename and unlink of FILES entries in 100
# directories with 1, 2 and 8 client tasks, through the client library
# against a real node (data on disk, fsync on every commit) and through a
# FUSE mount of it (the same program's plain system calls), next to the same
# program on a tmpfs directory and (8 tasks) on the same disk with an fsync
# per change, and (8 tasks) a node committing with LMDB's synced commits
# instead of its metadata log (meta.wal=false), and (8 tasks) a node with
# TLS on its client port, all measured in the same run. Writes results/meta.jsonl and RESULTS.md.
#
#   bench/run-meta.sh            # 30,000 entries (client library), 10,000 (mount)
#   bench/run-meta.sh --quick    # 2,000 entries (mount: 1,000)
#   bench/run-meta.sh --smoke    # 200 entries
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init "$@"

case $mode in
  full) files=30000; mount_files=10000 ;;
  quick) files=2000; mount_files=1000 ;;
  smoke) files=200; mount_files=200 ;;
esac

need fusermount3 fuse3
port=$(free_port)
addr=127.0.0.1:$port
start_node node 127.0.0.1 "$port" "[MEM:1GiB]$shm/tier"
fuse_mount "$addr" "$work/mnt"

results meta
meta() {
  "$bin/curvine-bench" --dir-num 100 --json "$@" | record
}
for t in 1 2 8; do
  echo "== $t task(s)" >&2
  meta --cluster "$addr" --action meta.all --dir "/bench-t$t" --client-threads "$t" --file-num "$files"
  meta --action local.meta.all --dir "$shm/t$t" --client-threads "$t" --file-num "$files"
  meta --action local.meta.all --dir "$work/mnt/mount-t$t" --client-threads "$t" \
    --file-num "$mount_files" --label mount
  meta --action local.meta.all --dir "$shm/mt$t" --client-threads "$t" \
    --file-num "$mount_files" --label mount-tmpfs
done
echo "== 8 tasks, durable local baseline on disk" >&2
meta --action local.meta.all --sync --dir "$work/local-sync" --client-threads 8 --file-num "$files"
echo "== 8 tasks, a node without the metadata log (LMDB synced commits)" >&2
port2=$(free_port)
start_node node-lmdb-sync 127.0.0.1 "$port2" "[MEM:1GiB]$shm/tier2" -c meta.wal=false
meta --cluster "127.0.0.1:$port2" --action meta.all --dir /bench-t8 --client-threads 8 \
  --file-num "$files" --label lmdb-sync

echo "== 8 tasks, a node with TLS on its client port" >&2
tls_certs
port3=$(free_port)
start_node node-tls 127.0.0.1 "$port3" "[MEM:1GiB]$shm/tier3" "${tls_node[@]}"
meta --cluster "127.0.0.1:$port3" "${tls_client[@]}" --action meta.all --dir /bench-t8 \
  --client-threads 8 --file-num "$files" --label tls

fstype=$(df -T "$work" | awk 'NR==2 {print $2}')
write_info meta entries="$files" mount_entries="$mount_files" fstype="$fstype"
report
