"""The linter: ruff with pyflakes' rules (unused imports and variables, undefined names, ...) on the Python files
of helpers/, ci/ and tests/, as configured in pyproject.toml ``[tool.ruff]`` (ruff is pinned in requirements.txt)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PATHS = ("helpers", "ci", "tests")


def _ruff(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=cwd, capture_output=True, text=True)


def test_the_code_passes_the_linter():
    r = _ruff(*PATHS)
    assert r.returncode == 0, (f"`python -m ruff check {' '.join(PATHS)}` found problems (fix them; "
                               f"`--fix` removes unused imports):\n{r.stdout}{r.stderr}")


def test_the_linter_reads_the_repository_config_and_fails_when_broken(tmp_path):
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    bad = tmp_path / "helpers" / "bad.py"
    bad.parent.mkdir()
    # F401, F841, F821 (pyflakes), and what other rule sets report: unsorted imports (I001), an ambiguous name
    # (E741), a trailing semicolon (E703)
    bad.write_text("import sys\nimport os\n\n\ndef f():\n    unused = 1\n    return undefined_name\n\n\n"
                   "def g():\n    l = 1;\n    return l\n")
    r = _ruff("helpers", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    for code in ("F401", "F841", "F821"):
        assert code in r.stdout, (code, r.stdout)
    assert {line.split()[1] for line in r.stdout.splitlines() if line.startswith("helpers/")} == {"F401", "F841", "F821"}
