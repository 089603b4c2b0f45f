#!/usr/bin/env bash
# API latency of `ringrec serve` under 50 concurrent clients polling job status (issue 18),
# measured with a real HTTP load generator (Debian's `wrk`), against a release build:
#   1. a fresh state directory, a token, the service on a free loopback port,
#   2. JOBS finished jobs with their metrics (a point every 2 steps: 8 points each),
#   3. wrk -t2 -c50 for DURATION seconds on GET /api/jobs/{random id} (each answer is a
#      job's full record: transitions, ranks, metrics), then on GET /api/jobs (the list),
#   4. the same status polling while BUSY jobs train on the machine's cores.
# Prints wrk's latency distribution (p50/p75/p90/p99) for each.
#   cargo build --release && scripts/bench/serve_latency.sh
# Environment: RINGREC (default target/release/ringrec), JOBS (20), DURATION (20), BUSY (2).
set -euo pipefail
cd "$(dirname "$0")/../.."
R=${RINGREC:-target/release/ringrec}
JOBS=${JOBS:-20}
DURATION=${DURATION:-20}
BUSY=${BUSY:-2}
command -v wrk >/dev/null || { echo "serve_latency.sh: wrk not found (apt-get install wrk)" >&2; exit 1; }
[ -x "$R" ] || { echo "serve_latency.sh: $R not found: cargo build --release" >&2; exit 1; }
dir=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
"$R" data synth --rows 4000 --out "$dir/data.tsv" >/dev/null
token=$("$R" serve token add bench --state-dir "$dir/state" | tail -1 | awk '{print $NF}')
"$R" serve --state-dir "$dir/state" --listen 127.0.0.1:0 --data-root "$dir" --no-slurm --local-slots 2 > "$dir/serve.out" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "listening on" "$dir/serve.out" && break; sleep 0.1; done
addr=$(grep -o 'http://[0-9.:]*' "$dir/serve.out" | head -1)
[ -n "$addr" ] || { cat "$dir/serve.out"; exit 1; }
auth="Authorization: Bearer $token"
spec='{"ranks": 1, "threads": 1, "data": "data.tsv", "batch": 256, "epochs": 1, "eval_every": 2, "hidden": [16, 8], "args": ["--table-capacity", "65536"]}'
for _ in $(seq 1 "$JOBS"); do curl -sf -H "$auth" -X POST -d "$spec" "$addr/api/jobs" >/dev/null; done
final() { curl -sf -H "$auth" "$addr/api/jobs" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(sum(x["state"] in ("succeeded","failed","stopped","submit_failed") for x in j))'; }
for _ in $(seq 1 600); do [ "$(final)" -ge "$JOBS" ] && break; sleep 0.5; done
echo "# $(date -u +%FT%TZ) $(hostname) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $JOBS finished jobs; wrk -t2 -c50 -d${DURATION}s; $(curl -sf -H "$auth" "$addr/api/jobs/1" | wc -c) bytes per job record"
cat > "$dir/random.lua" <<LUA
math.randomseed(18)
request = function()
  return wrk.format("GET", "/api/jobs/" .. math.random(1, $JOBS), { ["Authorization"] = "Bearer $token" })
end
LUA
echo "## GET /api/jobs/{random id} (a job's full record), $JOBS jobs idle"
wrk -t2 -c50 -d"${DURATION}s" --latency -s "$dir/random.lua" "$addr"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## GET /api/jobs (the list of $JOBS)"
wrk -t2 -c50 -d"${DURATION}s" --latency -H "$auth" "$addr/api/jobs"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$BUSY" -gt 0 ]; then
  busy='{"ranks": 1, "threads": 1, "data": "data.tsv", "batch": 256, "epochs": 10000, "eval_every": 2, "hidden": [16, 8], "args": ["--table-capacity", "65536"]}'
  ids=()
  for _ in $(seq 1 "$BUSY"); do ids+=("$(curl -sf -H "$auth" -X POST -d "$busy" "$addr/api/jobs" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')"); done
  sleep 5
  echo "## GET /api/jobs/{random id} while $BUSY jobs train (every core busy)"
  wrk -t2 -c50 -d"${DURATION}s" --latency -s "$dir/random.lua" "$addr"
  echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
  for i in "${ids[@]}"; do curl -sf -H "$auth" -X POST "$addr/api/jobs/$i/kill" >/dev/null; done
  for _ in $(seq 1 120); do [ "$(final)" -ge $(( JOBS + BUSY )) ] && break; sleep 0.5; done
fi
