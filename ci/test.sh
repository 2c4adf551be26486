#!/usr/bin/env bash
# The test command. Set up, then:
#   1. pytest tests/ (main venv, reference backend): unit tests of helpers, engine parity with transformers,
#      the runner, and every notebook once through papermill with ci/params/cpu.yaml;
#   2. the two neuron lanes (ci/neuron_sim.sh tnx, then nxdi): the contract and stand-in tests of each pinned
#      stack and every notebook with backend="neuron", under the transformers version the stack pins.
# All three run even when one fails; the exit status is non-zero if any failed. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
# tests/contract runs inside each lane (its NxD Inference stand-in needs that stack's transformers)
.venv/bin/python -m pytest tests -q -ra --durations=15 --ignore=tests/contract "$@" || status=1
for stack in tnx nxdi; do
  echo "== neuron lane: $stack"
  bash ci/neuron_sim.sh "$stack" || status=1
done
exit $status
