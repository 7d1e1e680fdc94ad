#!/usr/bin/env bash
# The benchmark suite in one command: B1 (large files: client library, data
# port, disk, FUSE), B2 (small files over S3, with rclone mount, s3fs and
# tmpfs beside the mount, and the rclone-copy ingest), B3 (fio through the
# mount), B4 (metadata: client library and mount), small-file writes
# through the mount (Python threads, rclone, tar, cp, git), the 3-node
# cluster figures and MLPerf Storage's training workloads (DLIO), each next
# to its baselines measured in the same run. It installs
# what is missing (iperf3, fio, fuse3, rclone, s3fs, Open MPI and PyTorch
# from Debian; the S3 test server, matplotlib, Pillow and dlio-benchmark
# with pip), builds the release binaries once,
# runs bench/run-{data,fuse,ufs,meta,ingest,cluster,dlio}.sh and writes RESULTS.md with a
# PNG chart per group beside it.
#
#   bench/run-all.sh           # the full run (about 30 minutes here)
#   bench/run-all.sh --quick   # every figure at a small scale (about 2 minutes after the build)
#   bench/run-all.sh --smoke   # tiny sizes: checks the suite works; the figures mean nothing
#
# BENCH_OUT=DIR writes results/, RESULTS.md and the plots to DIR instead of
# bench/ (the smoke run in CI does); BENCH_BIN_DIR=DIR uses the binaries in
# DIR instead of building release ones; BENCH_GROUPS="data ufs" runs only
# those groups.
set -euo pipefail
cd "$(dirname "$0")/.."

flag=${1:-}
case $flag in
  ""|--quick|--smoke) ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "run-all.sh: unknown flag '$flag' (use --quick or --smoke)" >&2; exit 2 ;;
esac
groups=${BENCH_GROUPS:-data fuse ufs meta ingest cluster dlio}
export BENCH_OUT=${BENCH_OUT:-bench}
mkdir -p "$BENCH_OUT/results"

missing=()
for pair in iperf3:iperf3 fio:fio fusermount3:fuse3 rclone:rclone s3fs:s3fs; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! python3 -c 'import matplotlib, PIL' 2>/dev/null; then
  echo "installing matplotlib and pillow (plots, decoding in B2) with pip" >&2
  python3 -m pip install --quiet matplotlib pillow >&2
fi
# The Python package (fsspec reads in B2), built from this tree when missing.
if ! python3 -c 'import curvinefs' 2>/dev/null; then
  echo "installing the curvinefs Python package (cli/python) with pip" >&2
  python3 -m pip install --quiet ./cli/python >&2 || echo "curvinefs did not install: B2 skips its fsspec row" >&2
fi
# What is measured is what the binaries are built from: the tree as it is
# now (edits made while the suite runs do not count).
commit=$(git rev-parse --short HEAD)
if [ -n "$(git status --porcelain --untracked-files=no -- . ':!bench/results' ':!bench/RESULTS.md' ':!bench/plots')" ]; then
  commit="$commit (with uncommitted changes)"
fi
export BENCH_COMMIT=$commit
if [ -z "${BENCH_BIN_DIR:-}" ]; then
  cargo build --release --bins --locked
  export BENCH_BIN_DIR=$PWD/target/release
fi
export BENCH_NO_REPORT=1

# The groups run now start afresh; others keep their last figures (each
# section of RESULTS.md names the run and commit it comes from).
for g in $groups; do rm -f "$BENCH_OUT/results/$g.jsonl" "$BENCH_OUT/results/$g.info.json"; done
durations=()
start=$(date +%s)
for g in $groups; do
  [ -x "bench/run-$g.sh" ] || { echo "run-all.sh: no group '$g' (bench/run-$g.sh)" >&2; exit 2; }
  echo "==== $g" >&2
  t0=$(date +%s)
  "bench/run-$g.sh" $flag
  durations+=("$g=$(( $(date +%s) - t0 ))")
done

python3 - "${flag#--}" "$(( $(date +%s) - start ))" "${durations[@]}" > "$BENCH_OUT/results/run.info.json" <<'PY'
import json, os, sys, datetime
mode, total, *durs = sys.argv[1:]
print(json.dumps({
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "commit": os.environ["BENCH_COMMIT"],
    "mode": mode or "full", "seconds": int(total),
    "groups": {k: int(v) for k, v in (d.split("=") for d in durs)},
}))
PY
python3 bench/report.py --results "$BENCH_OUT/results" --out "$BENCH_OUT/RESULTS.md"
echo "wrote $BENCH_OUT/RESULTS.md" >&2
