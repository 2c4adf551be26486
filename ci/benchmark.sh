#!/usr/bin/env bash
# The engine's speed against Hugging Face generate() and the memory-bandwidth roofline, in one run
# (same checkpoint, prompt and settings). Sets up first, like the other ci/ scripts. Extra
# arguments go to ci/benchmark.py (e.g. --json bench.json, --quick, --compiled, --batch-sizes 1 4).
# Run it on an idle machine: load from other processes lowers and spreads every figure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec .venv/bin/python ci/benchmark.py "$@"
