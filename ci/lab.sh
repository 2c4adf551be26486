#!/usr/bin/env bash
# Open the notebooks in JupyterLab. Sets up what the notebooks need (ci/setup.sh: .venv, the pinned CPU
# requirements, the embedded model), installs JupyterLab (requirements-lab.txt) and this checkout's `helpers`
# package into .venv in editable mode (pyproject.toml), then starts JupyterLab on notebooks/. The notebooks'
# kernel ("Python 3") is .venv's own Python and imports helpers from this checkout: no PYTHONPATH to set,
# and nothing is registered outside .venv. Extra arguments go to `jupyter lab`, e.g.
#   bash ci/lab.sh --no-browser --port 8899
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/python -m pip install -q -r requirements-lab.txt
# helpers importable from any folder (the kernel runs in notebooks/): install it once, editable
if ! (cd notebooks && env -u PYTHONPATH ../.venv/bin/python -c \
      "import importlib.util as u, pathlib, sys; s = u.find_spec('helpers'); sys.exit(s is None or pathlib.Path(s.origin).resolve().parent != pathlib.Path('../helpers').resolve())"); then
  .venv/bin/python -m pip install -q --no-deps -e .
fi
# .venv's kernel spec ("python3", run by .venv's Python) wins over one of the same name in ~/.local/share/jupyter
export JUPYTER_PREFER_ENV_PATH=1
# as root (a container, a fresh cloud VM) Jupyter refuses to start without --allow-root
allow_root=(); if [ "$(id -u)" = 0 ]; then allow_root=(--allow-root); fi
exec .venv/bin/jupyter lab --ServerApp.root_dir=notebooks "${allow_root[@]}" "$@"
