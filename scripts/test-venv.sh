#!/usr/bin/env bash
# Makes (once) the tests' Python venv, ${CARGO_TARGET_DIR:-target}/test-venv, with what the
# tests that check ringrec against an independent implementation need: numpy, onnx (its
# checker), onnxruntime (tests/onnx.rs scores an exported model.onnx with it) and pyarrow
# (tests/formats.rs reads Parquet files it writes). Reused
# when present: only the packages whose import fails are installed. Prints the venv's
# python on stdout (everything else goes to stderr).
#   scripts/test-venv.sh      scripts/test.sh runs it and exports RINGREC_TEST_PYTHON
# Needs PyPI the first time (about 110 MB of wheels). ringrec itself never uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target="$PWD/$target" ;; esac
venv="$target/test-venv"
# Each package's import name is its PyPI name.
want=(numpy onnx onnxruntime pyarrow)
if [ ! -x "$venv/bin/python" ]; then
  echo "test-venv: creating $venv" >&2
  python3 -m venv "$venv" >&2
fi
missing=()
for m in "${want[@]}"; do
  "$venv/bin/python" -c "import $m" >/dev/null 2>&1 || missing+=("$m")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test-venv: installing ${missing[*]} from PyPI into $venv" >&2
  trap 'echo "test-venv: FAILED to install ${missing[*]} (PyPI unreachable?)" >&2' ERR
  PIP_ROOT_USER_ACTION=ignore "$venv/bin/python" -m pip install --disable-pip-version-check -q "${missing[@]}" >&2
fi
"$venv/bin/python" -c "import numpy, onnx, onnxruntime, pyarrow; print('test-venv: numpy', numpy.__version__, 'onnx', onnx.__version__, 'onnxruntime', onnxruntime.__version__, 'pyarrow', pyarrow.__version__)" >&2
echo "$venv/bin/python"
