#!/usr/bin/env bash
# B4 (metadata, client library) on one default node, two builds side by
# side in one session: release binaries in OLD_DIR and NEW_DIR, alternating
# (old, new, old, new, ...), each round on a fresh node, with 1 and 8 client
# tasks. Prints one JSON row per run (label old|new) and a table of medians
# with their ranges, for bench/notes-*.md.
#
#   bench/run-versus.sh OLD_DIR NEW_DIR            # 20,000 entries, 4 rounds
#   bench/run-versus.sh OLD_DIR NEW_DIR --quick    # 2,000 entries, 2 rounds
#   bench/run-versus.sh OLD_DIR NEW_DIR --smoke    # 200 entries, 1 round
set -euo pipefail
old=$(cd "${1:?usage: run-versus.sh OLD_DIR NEW_DIR [--quick|--smoke]}" && pwd)
new=$(cd "${2:?usage: run-versus.sh OLD_DIR NEW_DIR [--quick|--smoke]}" && pwd)
shift 2
export BENCH_BIN_DIR=$new BENCH_NO_REPORT=1
source "$(dirname "$0")/lib.sh"
bench_init "$@"

case $mode in
  full) entries=20000; rounds=4 ;;
  quick) entries=2000; rounds=2 ;;
  smoke) entries=200; rounds=1 ;;
esac
warm_memory 4

rows=$work/versus.jsonl
: > "$rows"
for round in $(seq "$rounds"); do
  for side in old new; do
    if [ "$side" = old ]; then bin=$old; else bin=$new; fi
    port=$(free_port)
    start_node "$side$round" 127.0.0.1 "$port" "[MEM:1GiB]$shm/$side$round"
    for t in 1 8; do
      "$bin/curvine-bench" --cluster "127.0.0.1:$port" --action meta.all --dir "/v$t" \
        --client-threads "$t" --file-num "$entries" --dir-num 100 --json --label "$side" \
        | python3 -c 'import json,sys
for line in sys.stdin:
    r = json.loads(line); r["tasks"] = int(sys.argv[1]); r["round"] = int(sys.argv[2]); print(json.dumps(r))' "$t" "$round" \
        | tee -a "$rows" >&2
    done
    kill "${pids[-1]}"
    wait "${pids[-1]}" 2>/dev/null || true
  done
done

python3 - "$rows" "$(basename "$old")" "$(basename "$new")" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def pick(side, action, t):
    return sorted(r["ops_per_sec"] for r in rows
                  if r["label"] == side and r["action"] == action and r["tasks"] == t)
print(f"| figure | old ({sys.argv[2]}) | new ({sys.argv[3]}) | new / old |")
print("|---|---|---|---|")
for t in (1, 8):
    for op in ("create", "stat", "ls", "rename", "unlink"):
        a, b = pick("old", f"meta.{op}", t), pick("new", f"meta.{op}", t)
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        cell = lambda m, xs: f"{m:,.0f} ({xs[0]:,.0f}-{xs[-1]:,.0f})"
        print(f"| {op}, {t} task{'s' if t > 1 else ''} | {cell(ma, a)} | {cell(mb, b)} | {mb / ma:.2f} |")
PY
