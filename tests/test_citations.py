"""Citations a reader can open: nothing in the notebooks, helpers, docs or the README points to a file outside this
repository (the guides the project started from are cited by their public URLs, a user's report is described, not
cited by a file name), and no absolute path of an author's machine appears."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# A path outside this repository: the folder of reference documents beside the authors' checkouts, a conventions
# file only they have, an absolute home or work directory, or a reference by its number.
OUTSIDE = re.compile(r"shared/(?:reference|CONVENTIONS|hooks)|CONVENTIONS\.md|(?<![\w~.])/(?:work|home|Users|root)/"
                     r"|\b[Rr]eference 00\d\b|reference/00\d")
SCOPES = ("notebooks", "helpers", "docs", "README.md", "ci", ".github")


def _files():
    out = subprocess.run(["git", "ls-files", *SCOPES], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / f for f in out.split() if Path(f).suffix in {".py", ".ipynb", ".md", ".sh", ".yml", ".yaml", ".txt"}]


def test_the_scan_sees_files_in_every_scope():
    seen = {p.relative_to(REPO).parts[0] for p in _files()}
    assert {"notebooks", "helpers", "docs", "README.md", "ci"} <= seen, seen


@pytest.mark.parametrize("text", ["see shared/reference/001_a.txt", "(`/work/shared/CONVENTIONS.md`)",
                                  "reference 000 reports", "/home/ubuntu/models"])
def test_the_pattern_catches(text):
    assert OUTSIDE.search(text)


@pytest.mark.parametrize("text", ["~/.cache/neuron-llm-notebooks", "https://github.com/x/y/blob/abc/home/z",
                                  "a shared prefix", "the reference engine"])
def test_the_pattern_passes(text):
    assert not OUTSIDE.search(text)


def test_no_citation_points_outside_the_repository():
    found = [f"{p.relative_to(REPO)}:{n}: {m.group(0)!r}" for p in _files()
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) for m in OUTSIDE.finditer(line)]
    assert not found, ("cite public URLs (the guides' addresses, GitHub permalinks at the pinned commits), never a "
                       "path outside this repository:\n  " + "\n  ".join(found))
