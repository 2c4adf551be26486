#!/usr/bin/env bash
# The test command: set up, then unit tests + engine parity + every notebook with small parameters.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec .venv/bin/python -m pytest tests -q -ra --durations=15 "$@"
