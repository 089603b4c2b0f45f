"""Runs one benchmark command and appends its result (its last JSON object line) to a JSONL file.

Tolerant: when the command fails, or prints no JSON object, an error record is appended
instead (rc and the end of stderr) and this script still exits 0, so a benchmark script
goes on with its other runs. Fields given with --set are added to the record when the
command's JSON lacks them (impl, procs, ...); `label` and `cmd` are always set.

    python json_run.py --out docs/bench/train.jsonl --label "ringrec np=2" \\
        --set impl=ringrec --set procs=2 -- scripts/mpirun.sh -np 2 target/release/ringrec train ...
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time


def parse_value(v):
    try:
        return json.loads(v)
    except ValueError:
        return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="JSONL file to append to")
    ap.add_argument("--label", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--log", help="file to append the command's stderr to")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        ap.error("no command")
    extra = {}
    for kv in a.set:
        k, _, v = kv.partition("=")
        extra[k] = parse_value(v)

    print(f"==> {a.label}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except OSError as e:
        rc, out, err = 127, "", f"{e}\n"
    wall = time.perf_counter() - t
    if a.log:
        with open(a.log, "a") as fh:
            fh.write(f"==> {a.label}: {shlex.join(cmd)} (rc {rc}, {wall:.1f}s)\n{err}")
    # Show the command's progress lines after the fact, trimmed.
    tail = err.strip().splitlines()[-4:]
    for line in tail:
        print(f"    {line}", file=sys.stderr)

    rec = None
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                rec = obj
                break
    if rec is None or rc != 0:
        why = f"exit status {rc}" if rc != 0 else "no JSON line on stdout"
        rec = {"error": why, "stderr_tail": "\n".join(err.strip().splitlines()[-15:]),
               "stdout_tail": "\n".join(out.strip().splitlines()[-5:]), **(rec or {})}
    for k, v in extra.items():
        rec.setdefault(k, v)
    rec["label"] = a.label
    rec["cmd"] = shlex.join(cmd)
    rec["wall_seconds"] = round(wall, 3)
    with open(a.out, "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    print(json.dumps(rec), flush=True)
    if "error" in rec:
        print(f"    !! {a.label} failed: {rec['error']} (recorded, going on)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
