#!/usr/bin/env bash
# MLPerf Storage's training workloads as the user's yardstick: DLIO
# (`dlio-benchmark` from PyPI, with Debian's Open MPI and PyTorch) trains
# with simulated accelerators (MPI ranks that sleep for each batch's compute
# time) while reading its dataset, through a FUSE mount of a cache_mode
# mount of the test S3 server (the dataset put in the bucket, then loaded
# with `curvine-cli load`) and from tmpfs. For 1, 2 and 4 accelerators it
# records the accelerator utilization (AU: compute time over wall time) and
# samples/s; MLPerf's rule is AU at or above 90%. unet3d (PyTorch, npz
# files) always; resnet50 (TensorFlow, TFRecord) in full and quick runs,
# which install tensorflow-cpu. Datasets are scaled to this machine.
# Writes results/dlio.jsonl and RESULTS.md.
#
#   bench/run-dlio.sh           # unet3d 280 files of 8MiB, resnet50 32 files of 512 samples; 2 epochs
#   bench/run-dlio.sh --quick   # unet3d 112 files of 2MiB, resnet50 8 files of 256 samples; 1 epoch
#   bench/run-dlio.sh --smoke   # unet3d 56 files of 128KiB; 1 epoch
#
# (unet3d trains in batches of 7 files: each rank needs whole batches.)
#
# DLIO_VENV=DIR keeps the Python environment there (default:
# target/tools/dlio, made once).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init "$@"

case $mode in
  full) u_files=280; u_len=$((8 << 20)); r_files=32; r_samples=512; epochs=2; workloads="unet3d resnet50" ;;
  quick) u_files=112; u_len=$((2 << 20)); r_files=8; r_samples=256; epochs=1; workloads="unet3d resnet50" ;;
  smoke) u_files=56; u_len=$((128 << 10)); r_files=8; r_samples=64; epochs=1; workloads="unet3d" ;;
esac

need fusermount3 fuse3
need rclone rclone
# Open MPI, mpi4py and PyTorch from Debian (nothing to compile; PyPI's
# torch wheels bring gigabytes of CUDA libraries).
if ! command -v mpirun >/dev/null 2>&1 || ! /usr/bin/python3 -c 'import mpi4py, torch, h5py, pandas, psutil, PIL, omegaconf' 2>/dev/null; then
  echo "installing Open MPI, mpi4py and PyTorch from Debian" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openmpi-bin \
    python3-mpi4py python3-torch python3-h5py python3-pandas python3-psutil python3-pil \
    python3-omegaconf python3-venv >/dev/null
fi
# DLIO in a virtual environment over Debian's Python (which has those
# packages), without its declared dependencies: they name CUDA builds of
# every framework. numpy stays below 2 for Debian's torch, pandas and h5py.
venv=${DLIO_VENV:-$root/target/tools/dlio}
if [ ! -x "$venv/bin/dlio_benchmark" ]; then
  echo "installing dlio-benchmark into $venv" >&2
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install --quiet --no-deps dlio-benchmark==2.0.0 pydftracer==1.0.2
  "$venv/bin/pip" install --quiet hydra-core "numpy<2"
fi
# DLIO's TFRecord generator runs `tfrecord2idx` (from NVIDIA DALI; only the
# DALI reader reads the index): ours writes the same "offset length" lines.
cp "$root/bench/dlio/tfrecord2idx" "$venv/bin/tfrecord2idx"
chmod +x "$venv/bin/tfrecord2idx"
if [[ " $workloads " == *" resnet50 "* ]] && ! "$venv/bin/python" -c 'import tensorflow' 2>/dev/null; then
  echo "installing tensorflow-cpu into $venv (resnet50)" >&2
  "$venv/bin/pip" install --quiet tensorflow-cpu "numpy<2"
fi
# unet3d does not use TensorFlow, but DLIO imports it at start: without
# it, an empty module stands in.
stub=$work/tf-stub
if ! "$venv/bin/python" -c 'import tensorflow' 2>/dev/null; then
  mkdir -p "$stub/tensorflow"
  echo "# stands in for TensorFlow, which DLIO imports even for PyTorch workloads" > "$stub/tensorflow/__init__.py"
fi
# DLIO's programs and Python come first for its runs only (the S3 test
# server's tools stay those of the system).
# DLIO's own logs (hydra) land in its working directory: the scratch one.
dlio_env=(env -C "$work" "PATH=$venv/bin:$PATH" "PYTHONPATH=$stub${PYTHONPATH:+:$PYTHONPATH}")

# args WORKLOAD DIR: DLIO's settings for a workload, its dataset in DIR.
args() {
  case $1 in
    unet3d) echo "workload=unet3d_a100 ++workload.workflow.checkpoint=False" \
      "++workload.dataset.num_files_train=$u_files ++workload.dataset.record_length=$u_len" \
      "++workload.dataset.record_length_stdev=0 ++workload.reader.read_threads=2" \
      "++workload.dataset.data_folder=$2" ;;
    resnet50) echo "workload=resnet50_v100 ++workload.dataset.num_files_train=$r_files" \
      "++workload.dataset.num_samples_per_file=$r_samples ++workload.reader.read_threads=2" \
      "++workload.reader.computation_threads=2 ++workload.dataset.data_folder=$2" ;;
  esac
}

s3_start
port=$(free_port)
addr=127.0.0.1:$port
start_node node 127.0.0.1 "$port" "[MEM:8GiB]$shm/tier"
cli() { "$bin/curvine-cli" --cluster "$addr" "$@"; }
mnt=$work/mnt
fuse_mount "$addr" "$mnt"
export RCLONE_CONFIG_BENCH_TYPE=s3 RCLONE_CONFIG_BENCH_PROVIDER=Other \
  RCLONE_CONFIG_BENCH_ENDPOINT="$UFS_TEST_S3_ENDPOINT" RCLONE_CONFIG_BENCH_REGION=us-east-1 \
  RCLONE_CONFIG_BENCH_ACCESS_KEY_ID="$UFS_TEST_S3_ACCESS" \
  RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY="$UFS_TEST_S3_SECRET"

results dlio
for w in $workloads; do
  local_dir=$shm/local/$w
  mkdir -p "$local_dir"
  echo "== $w: generating the dataset" >&2
  # shellcheck disable=SC2046
  "${dlio_env[@]}" dlio_benchmark $(args "$w" "$local_dir") ++workload.workflow.generate_data=True \
    ++workload.workflow.train=False ++workload.output.folder="$work/out/gen-$w" >"$work/gen-$w.log" 2>&1 \
    || { tail -20 "$work/gen-$w.log" >&2; exit 1; }
  env -u AWS_CA_BUNDLE rclone --config /dev/null copy "$local_dir" "bench:$UFS_TEST_S3_BUCKET/dlio/$w" >&2
  cli mount "s3://$UFS_TEST_S3_BUCKET/dlio/$w" "/$w" "${props[@]}" >&2
  cli load --wait "/$w" >&2
  # The training files through the mount; the empty validation folder,
  # which the bucket cannot hold, beside them.
  via=$work/via-mount/$w
  mkdir -p "$via/valid"
  ln -sfn "$mnt/$w/train" "$via/train"
  for k in 1 2 4; do
    for side in mount tmpfs; do
      dir=$via
      [ "$side" = tmpfs ] && dir=$local_dir
      o=$work/out/$w-$side-$k
      # shellcheck disable=SC2046
      "${dlio_env[@]}" mpirun -np "$k" --allow-run-as-root --oversubscribe --bind-to none dlio_benchmark \
        $(args "$w" "$dir") ++workload.workflow.generate_data=False ++workload.workflow.train=True \
        ++workload.train.epochs="$epochs" ++workload.output.folder="$o" >"$o.log" 2>&1 \
        || { tail -20 "$o.log" >&2; exit 1; }
      python3 - "$o/summary.json" "$w" "$side" "$k" <<'PY' | record
import json, sys
path, workload, side, k = sys.argv[1:]
m = json.load(open(path))["metric"]
print(json.dumps({"action": "dlio", "workload": workload, "label": side, "accelerators": int(k),
                  "au": m["train_au_mean_percentage"],
                  "samples_per_sec": m["train_throughput_mean_samples_per_second"],
                  "mb_per_sec": m.get("train_io_mean_MB_per_second")}))
PY
    done
  done
done

write_info dlio unet3d_files="$u_files" unet3d_file_size="$u_len" resnet50_files="$r_files" \
  resnet50_samples_per_file="$r_samples" epochs="$epochs" workloads="$workloads"
report
