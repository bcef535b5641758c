#!/usr/bin/env bash
# Set up a virtualenv, install the project with its test tools, run the whole suite:
# lint (ruff), types (mypy), the core tests, then the real-engine integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy
echo "== core tests"
.venv/bin/pytest
echo "== real-engine integration tests (vLLM on the CPU, Dynamo frontend + workers)"
bash scripts/engines.sh
.venv/bin/pytest -m engine tests/engines
