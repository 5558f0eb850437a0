#!/usr/bin/env bash
# The Python package's CI, on a machine without a GPU: builds the wheel from this repository,
# installs it in a fresh virtual environment, and runs its tests there (python/tests; the GPU
# tests skip, each saying why). Needs Python 3 with venv and pip, cargo, and PyPI.
#
# MRSTACK_CARGO_PROFILE picks cargo's profile for the wheel (default here: dev, which reuses the
# debug build the Rust tests made; `release` for a wheel to ship).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
start=$SECONDS

export MRSTACK_CARGO_PROFILE="${MRSTACK_CARGO_PROFILE:-dev}"
work="$(mktemp -d "${TMPDIR:-/tmp}/mrstack-python-ci.XXXXXX")"
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/build-env"
"$work/build-env/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
# The wheel: cargo builds libmrstack_c.so and the mrstack command into the package.
"$work/build-env/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation \
    --wheel-dir "$work/dist" ./python
wheel="$(ls "$work"/dist/mrstack-*.whl)"
echo "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) with cargo profile $MRSTACK_CARGO_PROFILE"

# A fresh environment with only the wheel and pytest: what a user's would hold.
python3 -m venv "$work/test-env"
"$work/test-env/bin/python" -m pip install --quiet "$wheel" pytest
# The tests of the installed package, not of the source folder: run them from elsewhere.
cp -r python/tests "$work/tests"
set +e
(cd "$work" && MRSTACK_REPO="$repo" "$work/test-env/bin/python" -m pytest -q -rs \
    -p no:cacheprovider tests)
status=$?
set -e
# pytest's exit statuses: 0 all passed, 5 no tests collected (an error here), others failures.
case $status in
    0) echo "python tests passed in $((SECONDS - start)) s (skipped tests are listed above, with why)" ;;
    5) echo "error: pytest collected no tests" >&2; exit 1 ;;
    *) echo "error: python tests failed (pytest exit status $status)" >&2; exit 1 ;;
esac
