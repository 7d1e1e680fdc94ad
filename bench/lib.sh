# Shared by the bench/run-*.sh scripts (sourced, not run).
#
# Scale: every script takes one of
#   (none)     the full run: the scale bench/RESULTS.md reports
#   --quick    a short run of every figure (bench/run-all.sh --quick: about 2 minutes)
#   --smoke    tiny sizes, seconds per script: keeps the suite working (CI)
# and sets $mode to full, quick or smoke.
#
# Environment:
#   BENCH_BIN_DIR   use the binaries there instead of building release ones
#   BENCH_OUT       where results/, RESULTS.md and the plots go (default: bench)
#   BENCH_NO_REPORT set: do not render RESULTS.md (run-all.sh renders once)

bench_init() {
  mode=full
  case "${1:-}" in
    "") ;;
    --quick) mode=quick ;;
    --smoke) mode=smoke ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$(basename "$0"): unknown flag '$1' (use --quick or --smoke)" >&2; exit 2 ;;
  esac
  cd "$(dirname "$0")/.."
  root=$PWD
  out=${BENCH_OUT:-bench}
  mkdir -p "$out/results"
  if [ -n "${BENCH_BIN_DIR:-}" ]; then
    bin=$(cd "$BENCH_BIN_DIR" && pwd)
  else
    cargo build --release --bins --locked
    bin=$root/target/release
  fi
  local name
  name=$(basename "$0" .sh)
  work=$(mktemp -d "/var/tmp/curvine-$name.XXXXXX")
  shm=$(mktemp -d "/dev/shm/curvine-$name.XXXXXX")
  # One cookie for the nodes this script starts and every client of them
  # (curvine-cli, curvine-bench, the FUSE mounts): they read it from here.
  CURVINE_CLUSTER_COOKIE="bench-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
  export CURVINE_CLUSTER_COOKIE
  pids=()
  mounts=()
  cleanups=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  local m p c
  for c in "${cleanups[@]}"; do eval "$c" >/dev/null 2>&1 || true; done
  for m in "${mounts[@]}"; do
    "$bin/curvine-cli" fuse umount --lazy "$m" >/dev/null 2>&1 || umount -l "$m" >/dev/null 2>&1 || true
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work" "$shm"
}

# need CMD PACKAGE: installs the Debian package when CMD is missing.
need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "installing $2 (for $1)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

# warm_memory GIB: this kind of machine (a VM) backs guest memory lazily: the
# first touch of a page costs far more than later ones, which makes whichever
# run comes first look slow. Touch the memory the runs will use once.
warm_memory() {
  [ "$mode" = full ] || return 0
  echo "warming up memory" >&2
  dd if=/dev/zero of="$shm/warm" bs=1M count=$(($1 * 1024)) status=none 2>/dev/null || true
  rm -f "$shm/warm"
}

drop_caches() {
  sync
  echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "cannot drop the page cache (not root?)" >&2
}

# free_port: a base port for a node (which uses it and the next two): below
# the kernel's ephemeral range, so no outgoing connection holds it.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 12000))
    ss -Hltn "( sport >= :$p and sport <= :$((p + 39)) )" | grep -q . || { echo "$p"; return; }
  done
  echo "$p"
}

# start_node NAME HOST PORT TIERS [ARGS...]: a node listening on PORT (client),
# PORT+1 (cluster) and PORT+2 (data), whose tiers are TIERS.
start_node() {
  local name=$1 host=$2 p=$3 tiers=$4; shift 4
  "$bin/curvine-node" start --data-dir "$work/$name" --listen "$host:$p" \
    -c "node.cluster_listen=$host:$((p + 1))" -c "data.listen=$host:$((p + 2))" \
    -c "data.tiers=$tiers" -c log.level=warn "$@" 2>"$work/$name.log" &
  pids+=($!)
  local pid=$!
  # The node writes ready.json (its ports, id and pid) once it serves.
  for _ in $(seq 150); do
    grep -q "\"pid\": $pid," "$work/$name/ready.json" 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$work/$name.log" >&2
  return 1
}

# tls_certs: a CA and a node certificate for 127.0.0.1 in $work/certs
# (conf/make-certs.sh); sets tls_node and tls_client, the -c flags of a
# node and of a client with TLS on.
tls_certs() {
  need openssl openssl
  "$root/conf/make-certs.sh" "$work/certs" 127.0.0.1 >/dev/null
  tls_client=(-c tls.enabled=true -c "tls.ca=$work/certs/ca.pem")
  tls_node=("${tls_client[@]}" -c "tls.cert=$work/certs/node.pem" -c "tls.key=$work/certs/node.key")
}

# fuse_mount ADDR MNT [FLAGS...]: a daemon FUSE mount of the node at ADDR.
fuse_mount() {
  local addr=$1 m=$2; shift 2
  mkdir -p "$m"
  "$bin/curvine-cli" --cluster "$addr" fuse mount "$m" --daemon \
    --log-file "$work/fuse-$(basename "$m").log" -c log.level=warn "$@" >&2
  mounts+=("$m")
}

# s3_start: the test S3 server on loopback; exports UFS_TEST_S3_* and props.
s3_start() {
  "$root/integration/s3-server.sh" start "$work/s3"
  cleanups+=("'$root/integration/s3-server.sh' stop '$work/s3'")
  # shellcheck disable=SC1091
  source "$work/s3/s3.env"
  props=(-c "s3.endpoint_url=$UFS_TEST_S3_ENDPOINT" -c "s3.credentials.access=$UFS_TEST_S3_ACCESS"
         -c "s3.credentials.secret=$UFS_TEST_S3_SECRET" -c s3.region_name=us-east-1)
}

# results NAME: starts bench/results/NAME.jsonl afresh; rows go there with `record`.
results() {
  results_file=$out/results/$1.jsonl
  : > "$results_file"
}

record() { tee -a "$results_file" >&2; }

# write_info NAME KEY=VALUE...: bench/results/NAME.info.json: the date, commit
# and scale of the run, and the given keys (numbers stay numbers).
write_info() {
  local name=$1; shift
  python3 - "$mode" "$@" > "$out/results/$name.info.json" <<'PY'
import json, os, subprocess, sys, datetime
# run-all.sh names the commit its binaries were built from.
commit = os.environ.get("BENCH_COMMIT") or subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "mode": sys.argv[1], "quick": sys.argv[1] != "full"}
for kv in sys.argv[2:]:
    k, v = kv.split("=", 1)
    try:
        v = int(v)
    except ValueError:
        pass
    info[k] = v
print(json.dumps(info))
PY
}

# report: renders RESULTS.md and the plots from everything in results/.
report() {
  [ -n "${BENCH_NO_REPORT:-}" ] && return 0
  python3 "$root/bench/report.py" --results "$out/results" --out "$out/RESULTS.md"
}
