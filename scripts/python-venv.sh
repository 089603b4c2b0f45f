#!/usr/bin/env bash
# The Python module's tests' environment (tests/python.rs), in two parts:
#   1. a venv with numpy, torch (CPU use; PyPI's wheel) and maturin, made ONCE and reused by
#      every checkout and CI run on this machine: $HOME/.cache/ringrec/python-venv-<key>,
#      <key> a hash of the requirements and the Python version (a new requirement makes a
#      new venv; RINGREC_PYTHON_VENV names another place). Only what fails to import is
#      installed. Needs PyPI the first time (torch is large: about 3 GB with its CUDA wheels).
#   2. this checkout's extension, built the way `pip install ./python` builds it: pip's PEP 517
#      path into the package's build backend, maturin (`pip wheel --no-build-isolation`: the
#      venv's maturin; the dev profile through MATURIN_PEP517_ARGS, ${CARGO_TARGET_DIR:-target}
#      shared with cargo, so a rerun rebuilds only what changed), then installed with the
#      package's Python files into <target>/python-site, which the tests put first on
#      PYTHONPATH.
# Prints the venv's python on stdout (everything else goes to stderr).
#   RINGREC_TEST_PYTHON_MODULE=$(scripts/python-venv.sh)   (scripts/test.sh does this)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target="$PWD/$target" ;; esac
reqs=("numpy" "torch>=2.1" "maturin>=1.5,<2")
key=$( (printf '%s\n' "${reqs[@]}"; python3 -c 'import sys; print(sys.version_info[:2])') | sha256sum | cut -c1-12)
venv=${RINGREC_PYTHON_VENV:-$HOME/.cache/ringrec/python-venv-$key}
if [ ! -x "$venv/bin/python" ]; then
  echo "python-venv: creating $venv" >&2
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" >&2
fi
missing=()
for i in "${!reqs[@]}"; do
  mod=$(printf '%s' "${reqs[$i]}" | sed 's/[<>=,].*//')
  "$venv/bin/python" -c "import $mod" >/dev/null 2>&1 || missing+=("${reqs[$i]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "python-venv: installing ${missing[*]} from PyPI into $venv" >&2
  trap 'echo "python-venv: FAILED to install ${missing[*]} (PyPI unreachable?)" >&2' ERR
  PIP_ROOT_USER_ACTION=ignore "$venv/bin/python" -m pip install --disable-pip-version-check -q "${missing[@]}" >&2
  trap - ERR
fi
echo "python-venv: building the extension (pip wheel ./python: PEP 517, maturin) into $target/python-site" >&2
rm -rf "$target/python-wheel" "$target/python-site"
PATH="$venv/bin:$PATH" CARGO_TARGET_DIR=$target MATURIN_PEP517_ARGS="--profile dev" \
  "$venv/bin/python" -m pip wheel --disable-pip-version-check -q --no-build-isolation --no-deps -w "$target/python-wheel" ./python >&2
"$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps --target "$target/python-site" "$target/python-wheel"/ringrec-*.whl >&2
PYTHONPATH="$target/python-site" "$venv/bin/python" -c "import ringrec, ringrec.torch, numpy, torch; print('python-venv: ringrec from', ringrec.__file__, 'numpy', numpy.__version__, 'torch', torch.__version__)" >&2
echo "$venv/bin/python"
