#!/usr/bin/env bash
# Runs the whole test suite: builds the binaries once, then every test
# (unit, conformance, property, crash and CLI tests on real node processes).
# Installs what the tests need when it is missing and starts a test S3
# server (integration/s3-server.sh) for the UFS tests, stopping it after.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-nextest >/dev/null 2>&1; then
  echo "run-tests: cargo-nextest not found; using cargo test" >&2
fi

export CRASH_KILLS="${CRASH_KILLS:-20}"
export MODEL_CASES="${MODEL_CASES:-60}"

cargo build --workspace --bins --tests --locked

# A real S3 server on loopback for the UFS tests, stopped when the run ends.
s3dir=$(mktemp -d /tmp/curvine-s3.XXXXXX)
trap 'integration/s3-server.sh stop "$s3dir"; rm -rf "$s3dir"' EXIT
integration/s3-server.sh start "$s3dir"
# shellcheck disable=SC1091
source "$s3dir/s3.env"

if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
