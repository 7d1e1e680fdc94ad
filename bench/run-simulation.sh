#!/usr/bin/env bash
# The deterministic simulation (integration/sim, `curvine-sim`) at scale:
# seeded runs of one shard's group of 3 and of 5 members, each a real
# metadata engine (LMDB and its log on tmpfs) stepped in one thread on
# simulated time, under crashes of processes and machines (unsynced LMDB
# pages lost), pauses, partitions, lossy and duplicating links and clock
# jumps; each run checks that nothing acknowledged was lost or applied
# twice, that every member ends with the same names, and that the shard
# serves again within 15 s of simulated time after the faults heal. CI
# runs 1,000 seeds of 3 members (integration/sim/tests/simulation.rs).
# Writes results/simulation.jsonl and RESULTS.md.
#
#   bench/run-simulation.sh           # 100,000 seeds of 3 members, 10,000 of 5
#   bench/run-simulation.sh --quick   # 10,000 and 1,000
#   bench/run-simulation.sh --smoke   # 200 and 20
#
# SIM_FROM=N starts at seed N (default 0). A failing seed prints itself;
# `curvine-sim --seed N` runs it again, the same run.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init "$@"

case $mode in
  full) three=100000; five=10000 ;;
  quick) three=10000; five=1000 ;;
  smoke) three=200; five=20 ;;
esac
from=${SIM_FROM:-0}
sim=$bin/curvine-sim
[ -x "$sim" ] || { echo "run-simulation: no curvine-sim in $bin" >&2; exit 1; }

results simulation
status=0
for members in 3 5; do
  if [ "$members" = 3 ]; then n=$three; else n=$five; fi
  "$sim" --seeds "$n" --from "$from" --members "$members" --json 2>"$work/sim-$members.log" | record || status=1
  if [ "$status" != 0 ]; then
    grep -v '^  ' "$work/sim-$members.log" | tail -30 >&2
  fi
done
write_info simulation from="$from"
report
[ "$status" = 0 ] || { echo "run-simulation: seeds failed (see above)" >&2; exit 1; }
