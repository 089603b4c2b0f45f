#!/usr/bin/env bash
# The "Reliability" figures of docs/BENCHMARKS.md (issue 19):
#   1. the fault suite of tests/reliability.rs (release build) with SEEDS seeded faults of
#      each kind (a rank SIGKILLed, a rank SIGSTOPped; every third one on 4 ranks as 2
#      simulated hosts) under an mpirun that does NOT kill the survivors, plus the
#      signal, restart and mismatched-flag scenarios: counts, and the distribution of the
#      time from the fault to each survivor's exit;
#   2. the cost of the watchdog (deadlines + heartbeat): `ringrec train` (default run,
#      1 and 2 ranks) of this tree against the commit before the watchdog (BASE, default
#      f33ad98), interleaved, REPEATS runs each, median samples/s.
# Output: docs/bench/reliability.txt (raw) and a summary on stdout.
#   SEEDS=10 REPEATS=5 scripts/bench/reliability.sh
#   PART=throughput REPEATS=9 scripts/bench/reliability.sh     # only part 2 (appends)
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${SEEDS:-10}
REPEATS=${REPEATS:-5}
BASE=${BASE:-f33ad98}
out=docs/bench/reliability.txt
mkdir -p docs/bench
PART=${PART:-all}
log=$(mktemp)
if [ "$PART" = all ]; then
{
  echo "# scripts/bench/reliability.sh, $(date -u +%F), SEEDS=$SEEDS REPEATS=$REPEATS BASE=$BASE, $(nproc) cores"
  echo "## fault suite: RINGREC_RELIABILITY_SEEDS=$SEEDS cargo test --release --test reliability -- --nocapture --test-threads 1"
} >"$out"
RINGREC_RELIABILITY_SEEDS=$SEEDS cargo test --release --locked --test reliability -- --nocapture --test-threads 1 2>&1 | tee "$log" | grep -E '^(fault |test |--|RINGREC_)' >>"$out" || true
grep -q 'test result: ok' "$log" || { echo "the fault suite failed; see $log" >&2; exit 1; }

python3 - "$log" <<'EOF' | tee -a "$out"
import re, statistics, sys
faults, times = {}, []
for line in open(sys.argv[1]):
    m = re.search(r"fault (\w+) seed \d+ ranks (\d+): victim \d+, survivors' exits (\[.*\])", line)
    if m:
        k = f"{m.group(1)} ({m.group(2)} ranks)"
        faults[k] = faults.get(k, 0) + 1
        times += [float(t) for t in re.findall(r"\(\d+, ([0-9.]+)\)", m.group(3))]
text = open(sys.argv[1]).read()
tests = re.findall(r"test result: ok\. (\d+) passed; (\d+) failed", text)
print("## summary")
for k, n in sorted(faults.items()):
    print(f"faults injected: {k}: {n}, all ended cleanly (survivors named the peer, exited in time, no shm left)")
print(f"scenario tests (kill, stop, SIGTERM + resume, restart, mismatched flags, data length): {sum(int(p) + int(f) for p, f in tests)}, passed: {sum(int(p) for p, _ in tests)}")
q = statistics.quantiles(times, n=10)
print(f"fault -> survivor exit (s), {len(times)} survivors: min {min(times):.2f}, median {statistics.median(times):.2f}, p90 {q[8]:.2f}, max {max(times):.2f} (limit: timeout 3 + 10 = 13)")
EOF
fi

echo "## throughput: this tree vs $BASE (before the watchdog), default run, median of $REPEATS" | tee -a "$out"
old=/tmp/ringrec-reliability-base
if [ ! -x "$old-target/release/ringrec" ]; then
  rm -rf "$old"; git worktree prune
  git worktree add -f "$old" "$BASE" >/dev/null
  (cd "$old" && CARGO_TARGET_DIR="$old-target" cargo build --release --locked -q)
fi
cargo build --release --locked -q
python3 - "$old-target/release/ringrec" target/release/ringrec "$REPEATS" <<'EOF' | tee -a "$out"
import json, os, statistics, subprocess, sys
old, new, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
rs = {}
for i in range(reps):
    for np in (1, 2):
        for name, b in (("before", old), ("after", new)):
            p = subprocess.run(["scripts/mpirun.sh", "-np", str(np), b, "train", "--json", "--no-progress"], capture_output=True, text=True, check=True)
            s = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
            rs.setdefault((np, name), []).append((s["samples_per_sec"], s["params_fnv"]))
for np in (1, 2):
    b = [x for x, _ in rs[(np, "before")]]
    a = [x for x, _ in rs[(np, "after")]]
    fnv = {f for _, f in rs[(np, "before")] + rs[(np, "after")]}
    print(f"{np} rank(s): before median {statistics.median(b):,.0f} (max {max(b):,.0f}) samples/s, after median {statistics.median(a):,.0f} (max {max(a):,.0f}): after/before {statistics.median(a)/statistics.median(b):.3f}; params_fnv {'identical' if len(fnv) == 1 else 'DIFFERENT ' + str(fnv)}")
EOF
rm -f "$log"
