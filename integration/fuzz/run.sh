#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 15) with cargo-fuzz
# (libFuzzer), starting from the corpus kept in integration/fuzz/corpus.
# The corpus in the repository is only read; what the run finds goes to a
# scratch copy. A crash fails the run, and its input is left in
# integration/fuzz/artifacts/TARGET/: copy it into corpus/TARGET/ once it is
# fixed, where tests/fuzz_corpus.rs replays it in every test run.
#
#   integration/fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
secs=${1:-15}
shift || true
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(client_frame peer_message data_frame stored_value config path)

export PATH="$root/target/tools/bin:$PATH"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --version 0.13.2 --locked --root "$root/target/tools"
fi
# libFuzzer's instrumentation needs unstable compiler flags: a nightly
# toolchain when one is installed, else the stable compiler allowed them.
if rustup run nightly rustc --version >/dev/null 2>&1; then
  fuzz=(cargo +nightly fuzz)
else
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
fi

"${fuzz[@]}" build -O
scratch=$(mktemp -d /tmp/curvine-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
status=0
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  if "${fuzz[@]}" run -O "$t" "$scratch/$t" "corpus/$t" -- \
      -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      >"$scratch/$t.log" 2>&1; then
    runs=$(grep -o 'Done [0-9]* runs' "$scratch/$t.log" | grep -o '[0-9]*' || echo "?")
    echo "fuzz $t: $runs runs in ${secs}s, no crash"
  else
    tail -40 "$scratch/$t.log" >&2
    echo "fuzz $t: CRASH (input in integration/fuzz/artifacts/$t/)" >&2
    status=1
  fi
done
exit "$status"
