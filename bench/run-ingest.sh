#!/usr/bin/env bash
# Writing many small files through the FUSE mount, each workload beside the
# same one on tmpfs in the same run: 16 Python threads writing 100 KB files
# into one directory; 16 threads creating empty files in one directory;
# `rclone copy --transfers=16` of files of 60-140 KB into a plain directory
# of the mount (into an fs_mode mount: bench/run-ufs.sh); `tar x` of an
# archive of small files; `cp -a` of the same tree; `git clone` of a local
# repository. One node with a MEM tier in /dev/shm and a default mount.
# Every run checks that the files arrived (count, and bytes for tar and
# cp). Writes results/ingest.jsonl and RESULTS.md.
#
#   bench/run-ingest.sh           # 3,000 files per workload, a 20,000-file tree, 2 repetitions
#   bench/run-ingest.sh --quick   # 500 files, a 2,000-file tree, 1 repetition
#   bench/run-ingest.sh --smoke   # 50 files, a 200-file tree
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init "$@"

case $mode in
  full) files=3000; tree=20000; repo=3000; reps=2 ;;
  quick) files=500; tree=2000; repo=500; reps=1 ;;
  smoke) files=50; tree=200; repo=50; reps=1 ;;
esac
threads=16

need fusermount3 fuse3
need rclone rclone
need git git
mnt=$work/mnt
port=$(free_port)
addr=127.0.0.1:$port
start_node node 127.0.0.1 "$port" "[MEM:8GiB]$shm/tier"
fuse_mount "$addr" "$mnt"

# Sources, on tmpfs: files of 60-140 KB, a tree of small files (100 per
# directory, 0.5-8 KB) with its archive, and a git repository of part of
# that tree.
src=$shm/src
python3 - "$src" "$files" "$tree" <<'PY'
import os, random, sys
src, files, tree = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
os.makedirs(f"{src}/pics")
for i in range(files):
    with open(f"{src}/pics/img-{i:06d}.jpg", "wb") as f:
        f.write(rng.randbytes(rng.randint(60_000, 140_000)))
for i in range(tree):
    d = f"{src}/tree/d{i // 100:04d}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/f{i:06d}.txt", "wb") as f:
        f.write(rng.randbytes(rng.randint(512, 8192)))
PY
tar cf "$work/tree.tar" -C "$src" tree
git init -q "$src/repo"
(cd "$src/tree" && find . -type f | sort | awk -v n="$repo" 'NR <= n' | tar cf - -T -) | tar xf - -C "$src/repo"
git -C "$src/repo" add -A
git -C "$src/repo" -c user.name=bench -c user.email=bench@localhost commit -q -m tree

results ingest
# run WORKLOAD SIDE DIR FILES CMD...: times CMD writing FILES files into DIR
# (fresh), then checks how many files DIR holds.
run() {
  local workload=$1 side=$2 dir=$3 n=$4; shift 4
  rm -rf "$dir"
  mkdir -p "$dir"
  sync
  local t0 t1 got
  t0=$(date +%s.%N)
  "$@"
  t1=$(date +%s.%N)
  got=$(find "$dir" -type f -not -path '*/.git/*' | wc -l)
  [ "$got" = "$n" ] || { echo "$workload into $dir left $got of $n files" >&2; exit 1; }
  python3 -c 'import json,sys
w, side, n, t0, t1 = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
print(json.dumps({"action": "ingest", "workload": w, "label": side, "files": n,
                  "seconds": round(t1 - t0, 3), "files_per_sec": n / (t1 - t0)}))' \
    "$workload" "$side" "$n" "$t0" "$t1" | record
}
# py_files DIR N SIZE: 16 Python threads writing N files of SIZE bytes
# (0: created empty) into DIR.
py_files() {
  python3 - "$@" "$threads" <<'PY'
import os, sys
from concurrent.futures import ThreadPoolExecutor
d, n, size, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = os.urandom(size)
def one(i):
    with open(f"{d}/f{i:06d}", "wb") as f:
        if size:
            f.write(data)
with ThreadPoolExecutor(t) as pool:
    list(pool.map(one, range(n)))
PY
}
rclone_() { rclone --config /dev/null copy "$1" "$2" --transfers=16 >&2; }
same_tree() { diff -r "$src/tree" "$1/tree" >&2; }

for r in $(seq "$reps"); do
  echo "== repetition $r" >&2
  # Alternate which side goes first.
  if [ $((r % 2)) = 1 ]; then order="mount tmpfs"; else order="tmpfs mount"; fi
  for side in $order; do
    if [ "$side" = mount ]; then base=$mnt/ingest; else base=$shm/ingest; fi
    run py-write-100k "$side" "$base/w" "$files" py_files "$base/w" "$files" 100000
    run py-create "$side" "$base/c" "$files" py_files "$base/c" "$files" 0
    run rclone-copy "$side" "$base/r" "$files" rclone_ "$src/pics" "$base/r"
    run tar-x "$side" "$base/t" "$tree" tar xf "$work/tree.tar" -C "$base/t"
    same_tree "$base/t"
    run cp-a "$side" "$base/p" "$tree" cp -a "$src/tree" "$base/p/"
    same_tree "$base/p"
    run git-clone "$side" "$base/g" "$repo" git clone -q "file://$src/repo" "$base/g/repo"
    rm -rf "$base"
  done
done

write_info ingest files="$files" tree="$tree" repo="$repo" reps="$reps" threads="$threads"
report
