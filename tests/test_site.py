"""The book (ci/site.sh, ci/build_site.py): built from a small set of executed notebooks, then read back offline.

Two synthetic executed notebooks (written with nbformat, shaped like ours: title, ``%load_ext``, the
``#neuron-code`` section with a recipe per stack, harness cells, a stream written a word per flush, a progress bar,
a plot, tqdm's IProgress warning and a warning of the lesson) and one notebook that was not executed, with the
records a run leaves (report.json with its environment, the lanes' results.json). The site is built by
ci/build_site.py in .venv-site (set up by ci/test.sh, or here when it is missing), and checked: every internal link and
anchor resolves and nothing points outside the site (ci/site_check.py), each notebook page carries its stamp and its
plot, the recipes page lists every recipe with its stamp, streams are merged, the environment's warning is gone.
"""
from __future__ import annotations

import base64
import html as html_lib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import nbformat.v4 as v4
import pytest

REPO = Path(__file__).resolve().parents[1]
SITE_PYTHON = REPO / ".venv-site" / "bin" / "python"
sys.path.insert(0, str(REPO / "ci"))
import run_record  # noqa: E402
import site_check  # noqa: E402

SHA = "0123456789abcdef0123456789abcdef01234567"
CPU = "Test CPU Model 9000"
IPROGRESS = ("/x/tqdm/auto.py:21: TqdmWarning: IProgress not found. Please update jupyter and ipywidgets. See "
             "https://ipywidgets.readthedocs.io/en/stable/user_install.html\n"
             "  from .autonotebook import tqdm as notebook_tqdm\n")
LESSON_WARNING = "/x/gqa.py:111: UserWarning: Cannot enable \"GQA.SHARD_OVER_BATCH\" here\n  warnings.warn(msg)\n"


def _png() -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([1, 2, 3])
    ax.set_title("measured by: reference engine on cpu")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _stream(name, text):
    return v4.new_output("stream", name=name, text=text)


def _notebook(stem: str, title: str, executed: bool, png: str):
    def code(source, tags=(), outputs=()):
        cell = v4.new_code_cell(source, metadata={"tags": list(tags)} if tags else {})
        cell.outputs = list(outputs) if executed else []
        return cell

    cells = [
        v4.new_markdown_cell(f"# {title}\n\nWhat you will learn. The copy-paste code: "
                             "[the Neuron code](#neuron-code)."),
        code("%load_ext helpers.notebook.recipes"),
        v4.new_markdown_cell('<a id="neuron-code"></a>\n## The same on Neuron\n\nEach cell below stands alone.'),
        code("# transformers-neuronx 0.13 recipe\nimport os\n\n# EDIT\nmodel_dir = '~/m'\n", ("neuron", "tnx"),
             [_stream("stdout", "Skipped: transformers_neuronx is not installed here. This recipe runs on an "
                                "instance.\n")]),
        code("# NxD Inference 0.8 recipe\nimport os\n\n# EDIT\nmodel_dir = '~/m'\n", ("neuron", "nxdi"),
             [_stream("stdout", "Skipped: neuronx_distributed_inference is not installed here.\n")]),
        code("import helpers  # imports_marker", ("harness",), [_stream("stderr", IPROGRESS)]),
        code("backend = 'reference'  # param_marker", ("parameters",)),
        code("backend = 'reference'\ndevice = 'cpu'\n", ("injected-parameters",)),
        v4.new_markdown_cell("## 1. Stream the tokens"),
        code("model.sample(streamer=TextStreamer(tok))  # lesson_marker", (),
             [_stream("stdout", w) for w in ["The ", "sky ", "is ", "blue", ".\n"]]
             + [_stream("stderr", "Loading weights:   0%|  | 0/2\rLoading weights: 100%|##| 2/2\n")]
             + [_stream("stderr", LESSON_WARNING)]),
        code("plt.show()", (), [v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"})]),
        v4.new_markdown_cell("## Conclusion\n\nIt streamed."),
    ]
    nb = v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                               "language": "python"},
                                                "language_info": {"name": "python"}})
    if executed:
        nb.metadata["papermill"] = {"start_time": "2026-11-29T03:38:15.0+00:00",
                                    "end_time": "2026-11-29T03:39:28.1+00:00", "duration": 73.1,
                                    "parameters": {"backend": "reference", "device": "cpu"},
                                    "default_parameters": {}}
    return nb


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if not SITE_PYTHON.exists():  # ci/test.sh builds .venv-site in its set-up; here when run alone
        subprocess.run(["bash", str(REPO / "ci" / "site.sh"), "--setup"], check=True, capture_output=True)
    tmp = tmp_path_factory.mktemp("book")
    records, sources = tmp / "out", tmp / "notebooks"
    run = records / "notebooks" / "cpu"
    (run / "executed").mkdir(parents=True)
    sources.mkdir()
    png = _png()
    titles = {"01_alpha": "01 · Alpha: streaming", "02_beta": "02 · Beta: stopping", "03_gamma": "03 · Gamma"}
    for stem, title in titles.items():
        nbformat.write(_notebook(stem, title, False, png), str(sources / f"{stem}.ipynb"))
        if stem != "03_gamma":  # 03 was not executed in this run
            nbformat.write(_notebook(stem, title, True, png), str(run / "executed" / f"{stem}.ipynb"))
    environment = {"commit": SHA, "dirty": False, "cpu_model": CPU, "cpu_count": 2, "python": "3.11.7",
                   "torch": "2.13.0", "transformers": "5.23.0", "started": "2026-11-29T03:38:00+00:00"}
    report = {"ok": True, "environment": environment,
              "notebooks": {s: {"notebook": s, "status": "PASS", "duration": 74.0,
                                "parameters": {"backend": "reference", "device": "cpu"}} for s in ("01_alpha", "02_beta")}}
    (run / "report.json").write_text(json.dumps(report))
    (run / "metrics").mkdir()
    (run / "metrics" / "01_alpha.json").write_text(json.dumps({"ttft_ms": 12.5, "tokens": 48}))
    rows = [{"notebook": nb, "stack": "tnx", "model": model, "passed": not (nb == "02_beta" and model != "embedded"),
             "seconds": 12.5, "finished": "2026-11-29T03:50:00+00:00", "commit": SHA, "dirty": False,
             "library": "neuron-stand-ins", "stand_in": True, "transformers": "4.47.1"}
            for nb in ("01_alpha", "02_beta") for model in ("embedded", "production-shaped")]
    (records / "neuron-sim-tnx" / "cells").mkdir(parents=True)
    (records / "neuron-sim-tnx" / "cells" / "results.json").write_text(json.dumps({"results": rows}))
    # the tnx lane's whole-notebook run on backend="neuron", and an inf2 run of 01 on the NxD Inference stack
    (records / "neuron-sim-tnx" / "report.json").write_text(json.dumps(
        {"environment": environment, "notebooks": {"01_alpha": {"status": "PASS"}, "02_beta": {"status": "FAIL"}}}))
    inf2 = _notebook("01_alpha", titles["01_alpha"], True, png)
    for cell in inf2.cells:
        if {"neuron", "nxdi"} <= set(cell.metadata.get("tags", [])):
            cell.outputs = [_stream("stdout", "TTFT 41.0 ms; 32 tokens\n")]  # ran: no "Skipped:"
    (records / "inf2-nxdi" / "executed").mkdir(parents=True)
    nbformat.write(inf2, str(records / "inf2-nxdi" / "executed" / "01_alpha.ipynb"))
    (records / "inf2-nxdi" / "report.json").write_text(json.dumps(
        {"environment": {**environment, "commit": "fedcba9876" * 4}, "notebooks": {"01_alpha": {"status": "PASS"}}}))
    out = tmp / "site"
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_REPOSITORY", "OUT_DIR")}
    proc = subprocess.run([str(SITE_PYTHON), str(REPO / "ci" / "build_site.py"), "--records", str(records),
                           "--notebooks-dir", str(sources), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


def _text(page: str) -> str:
    return html_lib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page)))


def test_every_link_and_anchor_resolves_inside_the_site(site):
    out, stdout = site
    assert "0 broken" in stdout
    report = site_check.check_site(out)
    assert not report.broken, report.broken
    assert report.pages >= 4 and report.anchors > 0 and report.links > 20
    recipes = (out / "recipes.html").read_text()
    for stem in ("01_alpha", "02_beta"):  # the recipes link to the section and to each stack's cells
        assert f'href="notebooks/{stem}.html#neuron-code"' in recipes
        for stack in ("tnx", "nxdi"):
            anchor = f"recipe-{stem.replace('_', '-')}-{stack}"
            assert f'notebooks/{stem}.html#{anchor}"' in recipes, anchor
            assert f'id="{anchor}"' in (out / "notebooks" / f"{stem}.html").read_text()
    index = (out / "index.html").read_text()
    assert 'href="recipes.html"' in index and 'href="notebooks/01_alpha.html"' in index


def test_notebook_pages_carry_their_stamp_and_plots(site):
    out, _ = site
    for stem in ("01_alpha", "02_beta"):
        html = (out / "notebooks" / f"{stem}.html").read_text()
        text = _text(html)
        assert "run-stamp" in html and "Last executed and verified" in text
        for fact in ("2026-11-29 03:39 UTC", "PASS", SHA[:10], "reference", "cpu", CPU, "2.13.0", "5.23.0"):
            assert fact in text, (stem, fact)
        assert "standalone script against the stand-in" in text and "Never run on Neuron hardware" in text
        assert "standalone run in the neuron lane: not recorded" in text  # nxdi: no lane record
        status = {"01_alpha": "PASS", "02_beta": "FAIL"}[stem]
        assert f'the whole notebook on backend="neuron" against the stand-in: {status}' in text
        assert ("Ran on an inf2 instance (PASS, 2026-11-29 03:38 UTC, commit fedcba9876)" in text) == (stem == "01_alpha")
        images = re.findall(r'<img[^>]+src="([^"]+\.png)"', html)
        assert images and all((out / "notebooks" / src).resolve().is_file() for src in images)
        assert 'id="neuron-code"' in html
        assert ("2 key figures written by the notebook; against the baselines: 0 regressions" if stem == "01_alpha"
                else "Metrics: not recorded") in text
    assert not (out / "notebooks" / "03_gamma.html").exists()
    assert "03_gamma" in _text((out / "index.html").read_text())  # named as not executed


def test_streams_are_merged_and_the_environment_warning_is_gone(site):
    out, _ = site
    for page in out.rglob("*.html"):
        assert "IProgress" not in page.read_text(), page
    html = (out / "notebooks" / "01_alpha.html").read_text()
    assert "The sky is blue." in html  # one text, not a word per output
    assert "Loading weights: 100%" in html and "Loading weights:   0%" not in html  # as the terminal showed it
    assert "Cannot enable" in _text(html)  # the lesson's own warning stays


def test_harness_is_collapsed_and_recipes_stay_visible(site):
    out, _ = site
    html = (out / "notebooks" / "01_alpha.html").read_text()

    def collapsed(marker):
        at = html.index(marker)
        return html.rfind("<details", 0, at) > html.rfind("</details>", 0, at)

    assert collapsed("imports_marker") and collapsed("param_marker")
    assert not collapsed("lesson_marker")
    assert not collapsed("# transformers-neuronx 0.13 recipe") and not collapsed("# NxD Inference 0.8 recipe")


def test_recipes_page_lists_every_recipe_with_its_stamp(site):
    out, _ = site
    text = _text((out / "recipes.html").read_text())
    pinned = {s: json.loads((REPO / "tests" / "neuron_sim" / "signatures" / f"{s}.json").read_text())["commit"]
              for s in ("tnx", "nxdi")}
    for commit in pinned.values():
        assert commit[:7] in text
    html = (out / "recipes.html").read_text()
    rows = [_text(r) for r in re.findall(r"<tr[^>]*>(.*?)</tr>", html, re.S) if "<td" in r]
    assert len(rows) == 6  # 3 notebooks x 2 stacks, the one not executed included
    stamps = [_text(s) for s in re.split(r'<div class="[^"]*recipe-stamp[^"]*"', html)[1:]]
    assert len(stamps) == 6
    assert [("Ran on an inf2 instance" in s, "01_alpha" in s[:80] and "NxD Inference" in s[:160]) for s in stamps
            if "Never run on Neuron hardware" not in s] == [(True, True)]  # the one recipe an inf2 run has run
    assert any("01_alpha" in s and "PASS on the production-shaped model" in s for s in stamps)
    assert any(s.startswith(" 02_beta") or "02_beta" in s[:80] and "FAIL on the production-shaped model" in s
               for s in stamps)
    assert sum("standalone run in the neuron lane: not recorded" in s for s in stamps) == 4  # tnx of 03, all nxdi
    assert any("03_gamma" in s[:80] and "not executed in this run" in s for s in stamps)
    assert any("02_beta" in r and "FAIL" in r for r in rows)
    assert sorted(r.rstrip().rsplit(" ", 3)[-1] for r in rows) == ["inf2"] + ["never"] * 5


def test_link_check_finds_broken_links_and_paths_outside(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.html").write_text('<h1 id="here">b</h1>')
    (tmp_path / "sub" / "a.html").write_text(
        '<a href="../b.html#here">ok</a><a href="#top">self</a><p id="top"></p><a href="https://example.org/">x</a>'
        '<a href="../b.html#gone">1</a><a href="../../outside.html">2</a><a href="/abs.html">3</a>'
        '<img src="missing.png"><a href="file:///etc/passwd">4</a>')
    report = site_check.check_site(tmp_path)
    assert report.pages == 2 and report.external == 1
    assert len(report.broken) == 5, report.broken
    assert [b for b in report.broken if "gone" in b] and [b for b in report.broken if "outside" in b]


def test_the_run_records_its_environment(tmp_path):
    """report.json carries the run's environment (ci/run_record.py), the stamp's source."""
    env = run_record.environment(REPO)
    assert set(env) >= {"commit", "dirty", "cpu_model", "python", "torch", "transformers"}
    assert env["torch"] and env["transformers"]
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_notebooks_for_site", REPO / "ci" / "run_notebooks.py")
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner  # its dataclasses look their module up
    spec.loader.exec_module(runner)
    runner.write_report(tmp_path, [runner.Result(notebook="01_x")], {}, {**env, "started": run_record.now()})
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["environment"]["torch"] == env["torch"] and report["environment"]["started"].endswith("+00:00")


def test_notebook_links_stay_inside_the_book():
    """A notebook's markdown links as the book rewrites them: raw anchors as HTML links, other notebooks to their
    pages (or text when not executed), repository files to text (no repository known offline), docs/img/ images."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_site_for_test", REPO / "ci" / "build_site.py")
    book = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(book)
    text = ("[code](#neuron-code), [s2](#2-stream), [03](03_streaming.ipynb#x), [05](05_speculative.ipynb), "
            "[h](../helpers/notebook/streaming.py), ![img](../docs/img/a.png), [u](https://x.org)")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("GITHUB_REPOSITORY", raising=False)
        out = book.notebook_links(text, {"neuron-code"}, {"03_streaming"})
    assert out == ('<a href="#neuron-code">code</a>, [s2](#2-stream), [03](03_streaming.ipynb#x), 05, h, '
                   "![img](../img/a.png), [u](https://x.org)")
