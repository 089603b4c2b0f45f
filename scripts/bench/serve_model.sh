#!/usr/bin/env bash
# `ringrec serve-model` under load (issue 34 item 2's figures), with a real HTTP load
# generator (Debian's `wrk`, installed here when missing) on the loopback, against a
# release build, beside ONNX Runtime's own Python inference of the same model:
#   1. synthetic data (ROWS rows); the default model trained on 2 ranks for one epoch
#      (checkpoints in ck/), a second model trained on from it (ck2/), both exported with
#      --format onnx; `ringrec predict` scores the first QROWS rows with each (the answers
#      the swap phase checks);
#   2. serve-model --model ck/ --watch on a free port (THREADS scoring threads);
#   3. single-row requests (JSON {"tsv": [line]}; each wrk thread sends its own line, so
#      every answer is checked against predict's score of it), wrk -t2 -c50 for DURATION s:
#      p50/p99 latency and requests/s (target p99 <= 5 ms);
#   4. 512-row requests (-c4): rows/s (target >= 200k rows/s);
#   5. the swap: single-row load again (wrk -t10: ten lines), and mid-run ck2's newest checkpoint appears in ck/
#      (its step directory copied in, then LATEST replaced atomically); every answer is
#      checked in wrk's Lua against the model version it names (predict's score of that
#      line by that model): non-2xx, mismatches and the versions seen are counted;
#   6. scripts/bench/ort_score.py: ONNX Runtime (Python, intra-op THREADS) on the same
#      model's graph, rows/s in 512-row batches and single-row p50/p99 on the first QROWS
#      rows (inference only: inputs prepared before timing).
#   CARGO_INCREMENTAL=0 cargo build --release --features cuda && scripts/bench/serve_model.sh
# Environment: RINGREC (default target/release/ringrec), ROWS (20000), QROWS (200),
# DURATION (10), THREADS (the cores), MAX_WAIT_US (200).
set -euo pipefail
cd "$(dirname "$0")/../.."
R=${RINGREC:-target/release/ringrec}
ROWS=${ROWS:-20000}
QROWS=${QROWS:-200}
DURATION=${DURATION:-10}
THREADS=${THREADS:-$(nproc)}
MAX_WAIT_US=${MAX_WAIT_US:-200}
[ -x "$R" ] || { echo "serve_model.sh: $R not found: cargo build --release --features cuda" >&2; exit 1; }
if ! command -v wrk >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "serve_model.sh: installing wrk (Debian package)" >&2
  $SUDO apt-get install -y -qq --no-install-recommends wrk >/dev/null || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends wrk >/dev/null; }
fi
py=$(scripts/test-venv.sh)
dir=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
export RINGREC_DATA_DIR="$dir/cache"
echo "# $(date -u +%FT%TZ) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) (a machine shared with other agents' builds and tests); $R; $ROWS rows, serve-model --threads $THREADS --max-wait-us $MAX_WAIT_US"

"$R" data synth --rows "$ROWS" --out "$dir/d.tsv" >/dev/null
steps1=$(scripts/mpirun.sh -np 2 "$R" train --data "$dir/d.tsv" --epochs 1 --batch 512 --checkpoint-dir "$dir/ck" --no-progress --json | tail -1 | "$py" -c 'import json,sys; print(json.loads(sys.stdin.read())["steps"])')
cp -a "$dir/ck" "$dir/ck2"
scripts/mpirun.sh -np 2 "$R" train --data "$dir/d.tsv" --epochs 2 --batch 512 --checkpoint-dir "$dir/ck2" --resume --no-progress --json >/dev/null
echo "models: ck/ at step $steps1, ck2/ at $(cat "$dir/ck2/LATEST")"
"$R" export --model "$dir/ck" --out "$dir/b" --format onnx >/dev/null
head -n "$QROWS" "$dir/d.tsv" > "$dir/q.tsv"
"$R" predict --model "$dir/ck" --data "$dir/q.tsv" --out "$dir/s1.tsv" >/dev/null
"$R" predict --model "$dir/ck2" --data "$dir/q.tsv" --out "$dir/s2.tsv" >/dev/null

# wrk scripts: bodies and the answers each model gives, embedded.
"$py" - "$dir" "$QROWS" <<'EOF'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
lines = open(f"{d}/q.tsv").read().splitlines()[:n]
s1 = [l.split("\t")[0] for l in open(f"{d}/s1.tsv").read().splitlines()]
s2 = [l.split("\t")[0] for l in open(f"{d}/s2.tsv").read().splitlines()]
allrows = open(f"{d}/d.tsv").read().splitlines()
def lua_str(s):
    return "[==[" + s + "]==]"
common = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local threads = {}
local started = 0
function setup(thread)
  thread:set("k", started)
  started = started + 1
  table.insert(threads, thread)
end
local i = 0
non2xx, mismatches, v1, v2 = 0, 0, 0, 0
"""
single = common + "local bodies = {\n" + ",\n".join(lua_str(json.dumps({"tsv": [l]})) for l in lines) + "}\n"
single += "local want = {{" + ",".join(s1) + "}, {" + ",".join(s2) + "}}\n"
single += """
-- wrk answers a thread's connections in any order, so each thread sends one line (its
-- own), and every answer is checked against that line's score by the version it names.
function init(args) line = (k * 37) % #bodies + 1 end
function request() return wrk.format(nil, nil, nil, bodies[line]) end
function response(status, headers, body)
  if status < 200 or status > 299 then non2xx = non2xx + 1; return end
  local p = tonumber(string.match(body, '"probabilities":%[([^%]]+)%]'))
  local v = tonumber(string.match(body, '"version":(%d+)'))
  if v == 1 then v1 = v1 + 1 elseif v == 2 then v2 = v2 + 1 end
  if want[v] == nil or p ~= want[v][line] then mismatches = mismatches + 1 end
end
"""
batch = common + "local bodies = {\n" + ",\n".join(lua_str(json.dumps({"tsv": allrows[k * 512:(k + 1) * 512]})) for k in range(8)) + "}\n"
batch += """
function request()
  i = i % #bodies + 1
  return wrk.format(nil, nil, nil, bodies[i])
end
function response(status, headers, body)
  if status < 200 or status > 299 then non2xx = non2xx + 1 end
end
"""
done = """
function done(summary, latency, requests)
  local n2, mm, a, b = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    n2 = n2 + t:get("non2xx"); mm = mm + t:get("mismatches"); a = a + t:get("v1"); b = b + t:get("v2")
  end
  local s = summary.duration / 1e6
  io.write(string.format('{"requests": %d, "seconds": %.3f, "requests_per_sec": %.1f, "p50_ms": %.3f, "p90_ms": %.3f, "p99_ms": %.3f, "max_ms": %.3f, "socket_errors": %d, "non_2xx": %d, "mismatches": %d, "version_1": %d, "version_2": %d}\\n',
    summary.requests, s, summary.requests / s, latency:percentile(50) / 1e3, latency:percentile(90) / 1e3, latency:percentile(99) / 1e3, latency.max / 1e3,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout, n2, mm, a, b))
end
"""
open(f"{d}/single.lua", "w").write(single + done)
open(f"{d}/batch.lua", "w").write(batch + done)
EOF

"$R" serve-model --model "$dir/ck" --listen 127.0.0.1:0 --threads "$THREADS" --max-wait-us "$MAX_WAIT_US" --watch --watch-secs 0.5 > "$dir/serve.out" 2> "$dir/serve.err" &
pid=$!
for _ in $(seq 1 300); do grep -q "listening on" "$dir/serve.out" && break; sleep 0.1; done
addr=$(grep -o 'http://[0-9.:]*' "$dir/serve.out" | head -1)
[ -n "$addr" ] || { cat "$dir/serve.out" "$dir/serve.err"; exit 1; }
echo "serve-model: $(head -1 "$dir/serve.out")"
metric() { curl -s "$addr/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }

wrk -t2 -c8 -d2s -s "$dir/single.lua" "$addr/v1/score" >/dev/null  # warm-up
echo "## single-row requests, wrk -t2 -c50 -d${DURATION}s"
wrk -t2 -c50 -d"${DURATION}s" --timeout 10s -s "$dir/single.lua" "$addr/v1/score" | tail -1 | tee "$dir/single.json"
echo "## 512-row requests, wrk -t2 -c4 -d${DURATION}s"
wrk -t2 -c4 -d"${DURATION}s" --timeout 10s -s "$dir/batch.lua" "$addr/v1/score" | tail -1 | tee "$dir/batch.json"
echo "## a swap under single-row load, wrk -t10 -c50 -d${DURATION}s (10 lines checked; ck2's newest checkpoint appears after $((DURATION / 3)) s)"
wrk -t10 -c50 -d"${DURATION}s" --timeout 10s -s "$dir/single.lua" "$addr/v1/score" > "$dir/swap.out" &
wrk_pid=$!
sleep $((DURATION / 3))
newest=$(cat "$dir/ck2/LATEST")
cp -a "$dir/ck2/$newest" "$dir/ck/$newest"
cp "$dir/ck2/LATEST" "$dir/ck/LATEST.new" && mv "$dir/ck/LATEST.new" "$dir/ck/LATEST"
wait "$wrk_pid"
tail -1 "$dir/swap.out" | tee "$dir/swap.json"
echo "serve-model: swaps $(metric ringrec_serve_model_swaps_total), version $(metric ringrec_serve_model_version), step $(metric ringrec_serve_model_step); $(grep -c swapped "$dir/serve.err" || true) swap line(s) in its log"

echo "## ONNX Runtime's own inference, the same model (scripts/bench/ort_score.py --threads $THREADS)"
"$py" scripts/bench/ort_score.py "$dir/b" "$dir/d.tsv" --batch 512 --single "$QROWS" --repeat 3 --threads "$THREADS" --json | tail -1 | tee "$dir/ort.json"

echo "## summary"
"$py" - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
one, batch, swap, ort = (json.load(open(f"{d}/{n}.json")) for n in ("single", "batch", "swap", "ort"))
rows = batch["requests_per_sec"] * 512
ort_rows = ort["rows_per_s"]
ort_p99 = ort["single_p99_us"] / 1e3
print(f"single-row p99 {one['p99_ms']:.2f} ms (target <= 5 ms: {'met' if one['p99_ms'] <= 5 else 'NOT met'}), p50 {one['p50_ms']:.2f} ms, {one['requests_per_sec']:.0f} requests/s, {one['non_2xx']} non-2xx, {one['mismatches']} answers not predict's")
print(f"512-row requests: {rows:.0f} rows/s (target >= 200000: {'met' if rows >= 200000 else 'NOT met'}), {batch['non_2xx']} non-2xx")
print(f"swap under load: {swap['requests']} requests, {swap['non_2xx']} non-2xx, {swap['socket_errors']} socket errors, {swap['mismatches']} answers not their model's predict score; {swap['version_1']} answered by version 1, {swap['version_2']} by version 2")
print(f"ONNX Runtime {ort['onnxruntime']} (Python, inference only, {ort['threads']} threads): {ort_rows:.0f} rows/s at 512-row batches -> serve-model over HTTP / ORT = {rows / ort_rows:.2f}")
print(f"ONNX Runtime single-row p99 {ort_p99:.3f} ms (one call in-process, no HTTP, no concurrency) -> serve-model p99 at 50 connections / ORT p99 = {one['p99_ms'] / ort_p99:.1f}")
EOF
