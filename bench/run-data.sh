#!/usr/bin/env bash
# B1, large files: curvine-bench fs.write/fs.read through the client library
# against real nodes, next to the same tool doing plain file I/O on tmpfs (or
# on the disk for the disk-tier rows) and iperf3 over loopback (for reads over
# the data port), all in the same run; and the data port over TLS next to the
# plain data port. Each figure is measured REPS times,
# alternating with its baseline. Writes results/data.jsonl and RESULTS.md.
#
#   bench/run-data.sh           # 20 files of 100MB, 3 repetitions (about 4 minutes)
#   bench/run-data.sh --quick   # 2 files of 100MB, 1 repetition
#   bench/run-data.sh --smoke   # 1 file of 4MB
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init "$@"

case $mode in
  full) files=20; reps=3; size=100MB; iperf_secs=5 ;;
  quick) files=2; reps=1; size=100MB; iperf_secs=2 ;;
  smoke) files=1; reps=1; size=4MB; iperf_secs=1 ;;
esac

need iperf3 iperf3
warm_memory 12
port=$(free_port)
mem="127.0.0.1:$port"
disk="127.0.0.1:$((port + 10))"
start_node mem 127.0.0.1 "$port" "[MEM:8GiB]$shm/tier"
start_node disk 127.0.0.1 $((port + 10)) "[SSD:16GiB]$work/ssd-tier"
# A node with TLS on its ports: data-port rows over TLS beside the plain ones.
tls_certs
tls="127.0.0.1:$((port + 20))"
start_node tls 127.0.0.1 $((port + 20)) "[MEM:4GiB]$shm/tls-tier" "${tls_node[@]}"

results data
# run LABEL ARGS...: one curvine-bench run, its JSON line labelled.
run() {
  local label=$1; shift
  "$bin/curvine-bench" "$@" --file-num "$files" --file-size "$size" --buf-size 128KB \
    --checksum true --json --label "$label" | record
}

for t in 2 8; do
  for r in $(seq "$reps"); do
    echo "== MEM tier, $t tasks, repetition $r" >&2
    # Alternate which side goes first, so neither always meets the machine
    # right after the previous phase.
    if [ $((r % 2)) = 1 ]; then
      run mem --cluster "$mem" --action fs.write --dir "/w$t" --client-threads "$t"
      run tmpfs --action local.write --dir "$shm/local$t" --client-threads "$t"
      run mem --cluster "$mem" --action fs.read --dir "/w$t" --client-threads "$t"
      run tmpfs --action local.read --dir "$shm/local$t" --client-threads "$t"
    else
      run tmpfs --action local.write --dir "$shm/local$t" --client-threads "$t"
      run mem --cluster "$mem" --action fs.write --dir "/w$t" --client-threads "$t"
      run tmpfs --action local.read --dir "$shm/local$t" --client-threads "$t"
      run mem --cluster "$mem" --action fs.read --dir "/w$t" --client-threads "$t"
    fi
    run mem-remote --cluster "$mem" -c client.short_circuit=false \
      --action fs.read --dir "/w$t" --client-threads "$t"
    "$bin/curvine-cli" --cluster "$mem" fs rm -r "/w$t"
    run mem-remote --cluster "$mem" -c client.short_circuit=false \
      --action fs.write --dir "/w$t" --client-threads "$t"
    "$bin/curvine-cli" --cluster "$mem" fs rm -r "/w$t"
    rm -rf "$shm/local$t"

    echo "== MEM tier over TLS (data port), $t tasks, repetition $r" >&2
    run mem-tls --cluster "$tls" -c client.short_circuit=false "${tls_client[@]}" \
      --action fs.write --dir "/w$t" --client-threads "$t"
    run mem-tls --cluster "$tls" -c client.short_circuit=false "${tls_client[@]}" \
      --action fs.read --dir "/w$t" --client-threads "$t"
    "$bin/curvine-cli" --cluster "$tls" "${tls_client[@]}" fs rm -r "/w$t"

    echo "== disk tier, $t tasks, repetition $r" >&2
    run disk --cluster "$disk" --action fs.write --dir "/w$t" --client-threads "$t"
    run disk --action local.write --dir "$work/local$t" --client-threads "$t"
    drop_caches
    run disk --cluster "$disk" --action fs.read --dir "/w$t" --client-threads "$t"
    drop_caches
    run disk --action local.read --dir "$work/local$t" --client-threads "$t"
    "$bin/curvine-cli" --cluster "$disk" fs rm -r "/w$t"
    rm -rf "$work/local$t"
  done
  echo "== iperf3 loopback, $t streams" >&2
  iport=$(free_port)
  for r in $(seq "$reps"); do
    iperf3 -s -p "$iport" -1 >/dev/null 2>&1 &
    ipid=$!
    # (A probe connection would use up the one-off server: look for the listener.)
    for _ in $(seq 50); do ss -Hltn "sport = :$iport" | grep -q . && break; sleep 0.1; done
    iperf3 -c 127.0.0.1 -p "$iport" -t "$iperf_secs" -P "$t" -J 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
bps = d['end']['sum_received']['bits_per_second']
print(json.dumps({'action': 'iperf3', 'label': 'iperf3', 'threads': $t, 'gib_per_sec': bps / 8 / 2**30}))
" | record
    wait "$ipid" 2>/dev/null || true
  done
done

write_info data files="$files" file_size="$size" reps="$reps"
report
