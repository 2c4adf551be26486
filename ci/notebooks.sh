#!/usr/bin/env bash
# Run every notebook headless through papermill on the default backend (reference, CPU, embedded
# model). Writes executed notebooks, HTML renderings, metrics and a report into out/ (or $OUT_DIR),
# and compares the metrics against ci/baselines/cpu.json. Extra arguments go to the runner
# (e.g. --notebooks 03 04, --params ci/params/cpu-alt.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec .venv/bin/python ci/run_notebooks.py --params ci/params/cpu.yaml --baselines ci/baselines/cpu.json \
  --out "${OUT_DIR:-out}" "$@"
