#!/usr/bin/env bash
# Runs the whole test suite: builds the binaries once, then every test
# (unit, conformance, property, crash and CLI tests on real node processes,
# FUSE tests on real mounts), then a smoke run of the benchmark suite.
# Installs what the tests need when it is missing and starts a test S3
# server (integration/s3-server.sh) for the UFS tests, stopping it after.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-nextest >/dev/null 2>&1; then
  echo "run-tests: cargo-nextest not found; using cargo test" >&2
fi

export CRASH_KILLS="${CRASH_KILLS:-24}"
export MODEL_CASES="${MODEL_CASES:-60}"

cargo build --workspace --bins --tests --locked

# Tools the FUSE tests drive (rclone and tar for the ingest crash test),
# the headless browser the dashboard test renders in, tc and iptables for
# the slow-link test, and openssl for the TLS tests' certificates
# (conf/make-certs.sh), setfacl and getfacl for the ACL test, s3fs for the
# S3 gateway's: Debian packages,
# and the pjdfstest POSIX suite from crates.io (built once into target/tools).
missing=()
for pair in fusermount3:fuse3 fio:fio rsync:rsync rclone:rclone chromium:chromium chromedriver:chromium-driver \
    ip:iproute2 tc:iproute2 iptables:iptables openssl:openssl setfacl:acl s3fs:s3fs; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair##*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "run-tests: installing ${missing[*]}" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi
# With pip when missing: the aws CLI (a client of the S3 gateway's tests;
# boto3 comes with the test S3 server) and what the Python package's tests
# drive: fsspec, pandas and pyarrow.
pip_missing=()
command -v aws >/dev/null 2>&1 || pip_missing+=(awscli)
for mod in fsspec pandas pyarrow; do
  python3 -c "import $mod" 2>/dev/null || pip_missing+=("$mod")
done
if [ "${#pip_missing[@]}" -gt 0 ]; then
  echo "run-tests: installing ${pip_missing[*]} with pip" >&2
  python3 -m pip install --quiet "${pip_missing[@]}" >&2
fi
# PyTorch for the Python package's Dataset test: Debian's (PyPI's wheels
# bring gigabytes of CUDA libraries; the DLIO benchmark uses the same).
if ! /usr/bin/python3 -c 'import torch, ensurepip' 2>/dev/null; then
  echo "run-tests: installing PyTorch from Debian" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-torch python3-venv >/dev/null
fi
# The Python package as built from this tree, with pip (maturin builds the
# wheel; the debug profile reuses the crates just built), installed for
# python3 and into a virtual environment over Debian's Python, which has
# PyTorch (target/tools/torch; its interpreter is TEST_TORCH_PYTHON).
rm -rf target/wheels/curvinefs
MATURIN_PEP517_ARGS="--profile dev --locked" \
  python3 -m pip wheel --quiet --no-deps -w target/wheels/curvinefs ./cli/python >&2
python3 -m pip install --quiet --force-reinstall --no-deps target/wheels/curvinefs/curvinefs-*.whl >&2
torch_env=$PWD/target/tools/torch
[ -x "$torch_env/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$torch_env"
"$torch_env/bin/python" -c 'import fsspec' 2>/dev/null || "$torch_env/bin/pip" install --quiet fsspec >&2
"$torch_env/bin/pip" install --quiet --force-reinstall --no-deps target/wheels/curvinefs/curvinefs-*.whl >&2
export TEST_TORCH_PYTHON=$torch_env/bin/python
export PATH="$PWD/target/tools/bin:$PATH"
if ! command -v pjdfstest >/dev/null 2>&1; then
  cargo install pjdfstest --version 0.2.2 --locked --root target/tools
fi

# A real S3 server on loopback for the UFS tests, stopped when the run ends.
s3dir=$(mktemp -d /tmp/curvine-s3.XXXXXX)
trap 'integration/s3-server.sh stop "$s3dir"; rm -rf "$s3dir"' EXIT
integration/s3-server.sh start "$s3dir"
# shellcheck disable=SC1091
source "$s3dir/s3.env"

status=0
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast || status=$?
else
  cargo test --workspace --locked --no-fail-fast || status=$?
fi

# A short fuzz run of every target from the kept corpus (cargo-fuzz is
# installed into target/tools when missing).
echo "run-tests: fuzzing each target for ${FUZZ_SECS:-15}s (integration/fuzz/run.sh)" >&2
integration/fuzz/run.sh "${FUZZ_SECS:-15}" || status=1

# The benchmark suite at tiny sizes, so it cannot rot: every script, peer and
# report section runs (with the debug binaries just built); no figure is
# judged. It starts its own S3 server, nodes and mounts.
echo "run-tests: benchmark suite smoke run (bench/run-all.sh --smoke)" >&2
smoke=$(mktemp -d /tmp/curvine-bench-smoke.XXXXXX)
if BENCH_OUT=$smoke BENCH_BIN_DIR=target/debug bench/run-all.sh --smoke >"$smoke/log" 2>&1; then
  for section in "## The stated targets" "## B1. " "## B1 and B3" "## B2. " "## B4. " "## Writing small files" "## Cluster" "## MLPerf Storage"; do
    grep -qF "$section" "$smoke/RESULTS.md" || { echo "bench smoke: RESULTS.md lacks '$section'" >&2; status=1; }
  done
  for plot in b1 b1-fuse b2 b3 b4 ingest cluster; do
    [ -s "$smoke/plots/$plot.png" ] || { echo "bench smoke: no plots/$plot.png" >&2; status=1; }
  done
else
  tail -40 "$smoke/log" >&2
  echo "bench smoke: bench/run-all.sh --smoke failed (log above)" >&2
  status=1
fi
rm -rf "$smoke"
exit "$status"
