"""What a run records about itself: the commit it ran, when, and on what machine and packages.

ci/run_notebooks.py writes it into ``report.json`` (``environment``) and ci/neuron_cells.py into every row of its
``results.json``; ci/build_site.py prints it on the book's pages. Only what the machine says: a value it cannot find is
None (the book then says "not recorded"), never a guess.
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path


def now() -> str:
    """The current time, UTC, ISO 8601 to the second (``2026-11-29T03:45:12+00:00``)."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def git_commit(repo: str | Path) -> dict:
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout at ``repo``; ``$GITHUB_SHA`` when git
    cannot tell (an exported tree in CI). ``dirty``: tracked files differ from the commit (untracked ones do not
    count: out/ and the virtual environments are ignored anyway)."""
    def git(*args):
        try:
            proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    sha = git("rev-parse", "--verify", "HEAD") if (Path(repo) / ".git").exists() else None
    if not sha:
        return {"commit": os.environ.get("GITHUB_SHA") or None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": sha, "dirty": None if status is None else bool(status)}


def cpu_model() -> str | None:
    """The CPU's model name as the OS reports it (/proc/cpuinfo; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() in ("model name", "cpu model", "hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def version(distribution: str) -> str | None:
    """The installed version of ``distribution`` in this interpreter's environment (no import), or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(repo: str | Path) -> dict:
    """The record of this machine and environment: commit, CPU, Python, torch, transformers."""
    return {**git_commit(repo), "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "torch": version("torch"), "transformers": version("transformers")}
