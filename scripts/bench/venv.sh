#!/usr/bin/env bash
# Creates (once) target/bench-venv with what the benchmark plots and references need,
# and prints its python path. Not used by CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/target/bench-venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c "import matplotlib" 2>/dev/null; then
  "$venv/bin/pip" install -q matplotlib >&2
fi
if [ "${WITH_TORCH:-0}" = 1 ] && ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  "$venv/bin/pip" install -q torch >&2
fi
if [ "${WITH_TORCH:-0}" = 1 ] && ! "$venv/bin/python" -c "import pyarrow" 2>/dev/null; then
  "$venv/bin/pip" install -q pyarrow >&2 # torch_multihot.py reads Parquet
fi
echo "$venv/bin/python"
