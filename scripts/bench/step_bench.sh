# Sourced by scripts/bench/step_write_back.sh and step_csr.sh (not run on its own): one
# `ringrec bench step` run on the Zipf set of 11M distinct keys, 1 rank, batch 8192, cache 0
# and 1 GiB (write-through and write-back), appended to "$txt" (its table) and "$jsonl" (its
# JSON report, labelled). Needs ZIPF, STEPS, txt, jsonl set; a run's job id is TAG-...
step_bench() { # label binary tag
  local label=$1 R=$2 tag=$3
  echo "## $label: $R bench step --data $ZIPF --batch 8192 --gpu-cache-mib 0,1024 --write-back --table-capacity 16777216 --steps $STEPS" | tee -a "$txt"
  echo "## $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores, $(git rev-parse --short HEAD)" | tee -a "$txt"
  env RINGREC_JOB_ID="$tag-$$-$RANDOM" "$R" bench step --data "$ZIPF" --data-dir target/bench/step-cache-data --batch 8192 \
    --gpu-cache-mib 0,1024 --write-back --table-capacity 16777216 --steps "$STEPS" --json \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); d["label"]=sys.argv[1]; print(json.dumps(d))' "$label" | tee -a "$jsonl" \
    | python3 -c 'import json,sys; sys.path.insert(0, "scripts/device"); import i30_report; i30_report.bench_table(json.load(sys.stdin))' | tee -a "$txt"
}
