"""Build the book: a static site of the executed notebooks, with the Neuron recipes and their verification stamps.

    python ci/build_site.py                    # from the records in out/ into out/site (ci/site.sh sets up and calls it)
    python ci/build_site.py --run out-alt/notebooks/cpu-alt --out out/site-alt

Sphinx with MyST-NB and the book theme (requirements-site.txt) renders the notebooks as they ran (execution off).
This script stages what Sphinx reads into ``--src`` (default ``<out>-src``), then builds and checks it:

- one page per executed notebook (``<run>/executed/NN_name.ipynb``): stream outputs merged as they appeared live
  (carriage returns applied), the warnings of the build environment (``ENVIRONMENT_WARNINGS``) taken out of stderr,
  harness cells (tags ``HARNESS_TAGS``) collapsed behind "Show code cell source", a target before each stack's first
  recipe cell (``#recipe-<notebook>-<stack>``), and under the title the stamp of the run: when it was executed,
  which commit, backend and device, CPU model, torch and transformers, and the lanes' result for its Neuron cells;
- ``recipes``: every recipe (a notebook's cells tagged ``neuron`` + stack) by notebook and stack, linked to its
  place, with its stamp: the pinned source its API was checked against (tests/neuron_sim/signatures/<stack>.json),
  its standalone runs against the stand-in in the neuron lanes (``<lanes>/cells/results.json``, ci/neuron_cells.py),
  and its runs on an inf2 instance (``out/inf2-<stack>``: the inf2 workflow's output), or that it has none;
- ``index``: the README's "Start here" (how to run, the feature table) with its links pointing into the book.

Every figure of a stamp comes from a record of the run (report.json with its ``environment`` from
ci/run_record.py, the executed notebook's papermill metadata, the lanes' results.json); a record that is missing
reads "not recorded". Links to files of the repository point to GitHub when ``$GITHUB_REPOSITORY`` names it (CI),
and are left as plain text otherwise. The site is checked with ci/site_check.py after the build (exit status 1 on a
broken link or anchor, or a Sphinx warning).
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci"))
import site_check  # noqa: E402

# the recipes' headers and releases, from the module that skips them (loaded alone: helpers/__init__ needs torch)
_spec = importlib.util.spec_from_file_location("_recipes", REPO / "helpers" / "notebook" / "recipes.py")
_recipes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_recipes)
RECIPE_HEADERS = _recipes.RECIPE_HEADERS  # stack -> (header prefix, module, "library x.y, Neuron SDK z")
STACKS = tuple(RECIPE_HEADERS)

# Cells a reader may skip: collapsed (the source behind a click, the output shown). papermill adds the last one.
HARNESS_TAGS = {"parameters", "setup", "harness", "injected-parameters"}
# Remarks on the machine that built the book, not on the lesson: dropped from stderr wherever they appear. Each is a
# Python warning line (``file:line: Category: message``, then its indented source line) or a line of its own.
ENVIRONMENT_WARNINGS = [
    r"TqdmWarning: IProgress not found",  # tqdm.auto without ipywidgets (helpers also filters it at import)
    r"TqdmExperimentalWarning: Using `tqdm.autonotebook.tqdm` in notebook mode",
    r"Matplotlib is building the font cache",
    r"Debugger warning: It seems that frozen modules are being used",
]
NOT_RECORDED = "not recorded"
PINNED_SIGNATURES = REPO / "tests" / "neuron_sim" / "signatures"


# --------------------------------------------------------------------------- records


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def find_run(out: Path) -> Path | None:
    """The notebooks' run under ``out``: ci/test.sh's (``notebooks/cpu``) first, then ci/notebooks.sh's (``out``)."""
    for run in (out / "notebooks" / "cpu", out):
        if any((run / "executed").glob("[0-9][0-9]_*.ipynb")):
            return run
    return None


def repo_url() -> str | None:
    repo = os.environ.get("GITHUB_REPOSITORY")
    return f"{os.environ.get('GITHUB_SERVER_URL', 'https://github.com')}/{repo}" if repo else None


def when(iso: str | None) -> str:
    if not iso:
        return NOT_RECORDED
    try:
        t = dt.datetime.fromisoformat(iso).astimezone(dt.timezone.utc)
    except ValueError:
        return iso
    return t.strftime("%Y-%m-%d %H:%M UTC")


def commit_text(record: dict | None) -> str:
    sha = (record or {}).get("commit")
    if not sha:
        return NOT_RECORDED
    url = repo_url()
    text = f"[`{sha[:10]}`]({url}/commit/{sha})" if url else f"`{sha[:10]}`"
    return text + (" (with local changes)" if (record or {}).get("dirty") else "")


def signatures(stack: str) -> dict:
    """The pinned source a stack's stand-in was checked against: repository, release, commit, callables compared."""
    data = read_json(PINNED_SIGNATURES / f"{stack}.json") or {}
    return {"repository": data.get("repository"), "release": data.get("release"), "commit": data.get("commit"),
            "entries": len(data.get("entries") or {})}


def lane_results(lanes: dict[str, Path]) -> dict[tuple[str, str], list[dict]]:
    """{(notebook, stack): [results.json rows]} from each lane's ``cells/results.json`` (ci/neuron_cells.py)."""
    rows: dict[tuple[str, str], list[dict]] = {}
    for stack, folder in lanes.items():
        for row in (read_json(folder / "cells" / "results.json") or {}).get("results", []):
            if row.get("stack") == stack:
                rows.setdefault((row["notebook"], stack), []).append(row)
    return rows


def lane_notebook_runs(lanes: dict[str, Path]) -> dict[tuple[str, str], dict]:
    """{(notebook, stack): the notebook's whole run on backend="neuron" against the stand-in (the lane's report)}."""
    runs = {}
    for stack, folder in lanes.items():
        report = read_json(folder / "report.json") or {}
        for stem, result in (report.get("notebooks") or {}).items():
            runs[(stem, stack)] = {**result, "environment": report.get("environment") or {}}
    return runs


def inf2_runs(inf2: dict[str, Path]) -> dict[tuple[str, str], dict]:
    """{(notebook, stack): record} of the notebooks an inf2 runner executed with the stack's real library: the inf2
    workflow's ``out/inf2-<stack>`` (report.json and the executed copies). A recipe counts as run on Neuron hardware
    when its cells in that copy have outputs, none of them an error or a "Skipped:" line."""
    runs = {}
    for stack, folder in inf2.items():
        report = read_json(folder / "report.json") or {}
        for stem, result in (report.get("notebooks") or {}).items():
            executed = folder / "executed" / f"{stem}.ipynb"
            if not executed.is_file():
                continue
            nb = nbformat.read(str(executed), as_version=4)
            cells = [c for c in nb.cells if c.cell_type == "code" and {"neuron", stack} <= tags(c)]
            outputs = [o for c in cells for o in c.get("outputs", [])]
            ran = bool(cells) and all(c.get("outputs") for c in cells) and not any(
                o.output_type == "error" or "Skipped:" in output_text(o) for o in outputs)
            pm = nb.metadata.get("papermill", {})
            runs[(stem, stack)] = {"ran": ran, "status": result.get("status"), "started": pm.get("start_time"),
                                   "environment": report.get("environment") or {}}
    return runs


# --------------------------------------------------------------------------- notebooks


def tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def output_text(output) -> str:
    text = output.get("text", "")
    return "".join(text) if isinstance(text, list) else text


def recipes_of(nb) -> dict[str, list[int]]:
    """{stack: [cell indexes]} of the notebook's recipe cells (tagged ``neuron`` + the stack), in order."""
    found: dict[str, list[int]] = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "neuron" in tags(cell):
            for stack in STACKS:
                if stack in tags(cell):
                    found.setdefault(stack, []).append(i)
    return found


def title_of(nb, stem: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return stem


def terminal(text: str) -> str:
    """What a terminal shows for ``text``: on each line, a carriage return goes back to its start (progress bars)."""
    lines = []
    for line in text.split("\n"):
        shown = ""
        for piece in line.split("\r"):
            shown = piece + shown[len(piece):]
        lines.append(shown)
    return "\n".join(lines)


_WARNING_LINE = re.compile(r"^\S.*?:\d+: \w+: ")


def drop_environment_warnings(text: str) -> str:
    """``text`` (stderr) without the lines of the build environment's warnings and their source lines."""
    pattern = re.compile("|".join(ENVIRONMENT_WARNINGS))
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if pattern.search(line):
            skipping = bool(_WARNING_LINE.match(line))  # a warning's source line follows, indented
            continue
        if skipping and line.startswith((" ", "\t")):
            continue
        skipping = False
        out.append(line)
    return "".join(out)


def merge_streams(outputs: list) -> list:
    """Consecutive stream outputs of one name joined into one (a TextStreamer writes a word per flush), carriage
    returns applied, environment warnings taken out of stderr (an emptied stderr output is dropped)."""
    merged = []
    for output in outputs:
        if output.get("output_type") == "stream":
            if merged and merged[-1].get("output_type") == "stream" and merged[-1]["name"] == output["name"]:
                merged[-1]["text"] += output_text(output)
                continue
            output = nbformat.from_dict({"output_type": "stream", "name": output["name"], "text": output_text(output)})
        merged.append(output)
    kept = []
    for output in merged:
        if output.get("output_type") == "stream":
            text = terminal(output["text"])
            if output["name"] == "stderr":
                text = drop_environment_warnings(text)
                if not text.strip():
                    continue
            output["text"] = text
        kept.append(output)
    return kept


def md(text: str) -> str:
    """Text for a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def run_stamp(stem: str, nb, result: dict | None, environment: dict, lanes: dict, lane_nbs: dict,
              hardware: dict, metrics: dict | None = None) -> str:
    """The stamp under a notebook's title, as a MyST admonition."""
    pm = nb.metadata.get("papermill", {})
    params = {**(pm.get("default_parameters") or {}), **(pm.get("parameters") or {}), **((result or {}).get(
        "parameters") or {})}
    status = (result or {}).get("status") or NOT_RECORDED
    duration = pm.get("duration") or (result or {}).get("duration")
    executed = when(pm.get("end_time") or pm.get("start_time"))
    if duration:
        executed += f", {float(duration):.0f} s"
    backend = params.get("backend") or NOT_RECORDED
    device = params.get("device") or NOT_RECORDED
    cpu = environment.get("cpu_model") or NOT_RECORDED
    if environment.get("cpu_count"):
        cpu += f" ({environment['cpu_count']} logical CPUs)"
    lines = [
        "```{admonition} Last executed and verified",
        ":class: run-stamp",
        "",
        f":Executed: {executed}: **{status}** (papermill, ci/run_notebooks.py)",
        f":Commit: {commit_text(environment)}",
        f":Backend, device: `{backend}` on `{device}`",
        f":CPU: {cpu}",
        f":torch, transformers: {environment.get('torch') or NOT_RECORDED}, "
        f"{environment.get('transformers') or NOT_RECORDED}",
    ]
    if result and result.get("error"):
        lines.append(f":Error: {md(result['error'])}")
    checks = NOT_RECORDED if metrics is None else f"{len(metrics)} key figures written by the notebook"
    if result is not None and metrics is not None:
        regressions, unmeasurable = result.get("regressions") or [], result.get("not_measurable") or []
        checks += (f"; against the baselines: {len(regressions)} regression" + ("s" if len(regressions) != 1 else "")
                   + (f", {len(unmeasurable)} timing claim(s) not measurable on this machine" if unmeasurable else ""))
    lines.append(f":Metrics: {checks}")
    for stack in STACKS:
        cells = lane_cells_text(lanes.get((stem, stack)))
        whole = lane_nbs.get((stem, stack))
        if whole:
            cells += f"; the whole notebook on `backend=\"neuron\"` against the stand-in: **{whole.get('status')}**"
        lines.append(f":{RECIPE_HEADERS[stack][2].split(',')[0]} recipe: {cells}. "
                     f"{hardware_text(hardware.get((stem, stack)))}.")
    lines += ["", "Figures on this page were measured by the backend above; on `reference` none is a Neuron "
              "measurement. [All recipes and their stamps](../recipes.md).", "```"]
    return "\n".join(lines)


def lane_cells_text(rows: list[dict] | None) -> str:
    """One line: the recipe's standalone runs against its stand-in, per model."""
    if not rows:
        return f"standalone run in the neuron lane: {NOT_RECORDED}"
    parts = []
    for row in rows:
        result = "PASS" if row.get("passed") else "FAIL"
        parts.append(f"**{result}** on the {row.get('model')} model ({row.get('seconds', 0):.0f} s)")
    last = max(rows, key=lambda r: r.get("finished") or "")
    lib = "the stand-in" if last.get("stand_in") else (last.get("library") or "its library")
    return (f"standalone script against {lib} in the neuron lane: " + ", ".join(parts)
            + f" ({when(last.get('finished'))}, commit {commit_text(last)}, transformers "
            + (last.get("transformers") or NOT_RECORDED) + ")")


def hardware_text(record: dict | None) -> str:
    if record and record.get("ran"):
        env = record.get("environment") or {}
        return (f"**Ran on an inf2 instance** ({record.get('status')}, {when(record.get('started'))}, "
                f"commit {commit_text(env)})")
    return "**Never run on Neuron hardware** (no inf2 run recorded)"


RAW_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([\w-]+)\"\s*>\s*</a>")


def notebook_links(text: str, raw_ids: set[str], pages: set[str]) -> str:
    """A notebook's markdown links, made to work in the book: ``[x](#id)`` to an ``<a id="id">`` of the notebook
    becomes an HTML link (MyST resolves headings and labels, not raw ids); a link to another notebook stays (MyST
    makes it a link to its page) or, without a page, becomes its text; a link to a file of the repository points to
    GitHub where the repository is known, else becomes its text; an image of docs/img/ is taken from the book's
    copy. The site never links to a path outside itself."""
    url = repo_url()

    def link(m):
        bang, label, target = m.group(1), m.group(2), m.group(3)
        if re.match(r"^[a-z]+:", target):
            return m.group(0)
        if target.startswith("#"):
            return f'<a href="{target}">{label}</a>' if target[1:] in raw_ids and not bang else m.group(0)
        path, _, anchor = target.partition("#")
        repo_path = os.path.normpath(os.path.join("notebooks", path))
        if bang:
            return f"![{label}](../img/{repo_path[len('docs/img/'):]})" if repo_path.startswith("docs/img/") \
                else label
        if repo_path.startswith("notebooks/") and repo_path.endswith(".ipynb"):
            return m.group(0).replace(target, Path(repo_path).name + (f"#{anchor}" if anchor else "")) \
                if Path(repo_path).stem in pages else label
        return f"[{label}]({url}/blob/HEAD/{repo_path}{'#' + anchor if anchor else ''})" if url else label

    return re.sub(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)", link, text)


def stage_notebook(src: Path, dest: Path, stamp: str, recipe_cells: dict[str, list[int]],
                   pages: set[str] = frozenset()) -> None:
    nb = nbformat.read(str(src), as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs = merge_streams(cell.get("outputs", []))
        if tags(cell) & HARNESS_TAGS:
            cell.metadata["tags"] = sorted(tags(cell) | {"hide-input"})
    raw_ids = {m for c in nb.cells if c.cell_type == "markdown" for m in RAW_ANCHOR.findall(c.source)}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = notebook_links(cell.source, raw_ids, pages)
    targets = {cells[0]: stack for stack, cells in recipe_cells.items()}
    cells = []
    for i, cell in enumerate(nb.cells):
        if i in targets:
            cells.append(nbformat.v4.new_markdown_cell(f"(recipe-{dest.stem}-{targets[i]})="))
        cells.append(cell)
        if i == 0:  # the title
            cells.append(nbformat.v4.new_markdown_cell(stamp))
    nb.cells = cells
    nbformat.write(nb, str(dest))


# --------------------------------------------------------------------------- pages


def rewrite_links(text: str, pages: set[str], commit: str | None) -> str:
    """README links into the book: a notebook's ``notebooks/NN.ipynb#x`` to its page, a repository file to GitHub
    (at the commit) when the repository is known, else plain text; images of docs/img/ copied beside the page."""
    url = repo_url()

    def link(m):
        bang, label, target = m.group(1), m.group(2), m.group(3)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return m.group(0)
        path, _, anchor = target.partition("#")
        if bang:
            return f"![{label}]({path.replace('docs/img/', 'img/')})"
        stem = Path(path).stem
        if path.startswith("notebooks/") and stem in pages:
            return f"<a href=\"notebooks/{stem}.html{'#' + anchor if anchor else ''}\">{label}</a>"
        if url:
            return f"[{label}]({url}/blob/{commit or 'HEAD'}/{path}{'#' + anchor if anchor else ''})"
        return label

    text = re.sub(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)", link, text)
    # the table's first column names each notebook: link it to its page
    return re.sub(r"^\| `(\d\d_\w+)` \|", lambda m: (f"| [`{m.group(1)}`](notebooks/{m.group(1)}.ipynb) |"
                                                       if m.group(1) in pages else m.group(0)), text, flags=re.M)


def index_page(pages: dict[str, str], missing: list[str], environment: dict, commit: str | None) -> str:
    readme = (REPO / "README.md").read_text()
    title = readme.splitlines()[0].lstrip("# ").strip()
    intro = readme.split("\n## ", 1)[0].split("\n", 1)[1].strip()
    start = re.search(r"^## Start here\n(.*?)(?=^## )", readme, re.S | re.M)
    body = start.group(1).strip() if start else ""
    built = (f"This book shows the notebooks as they ran (commit: {commit_text(environment)}; run started: "
             f"{when(environment.get('started'))}; CPU: {environment.get('cpu_model') or NOT_RECORDED}). "
             "Each page carries the stamp of its run under its title; the harness cells (imports, parameters, "
             "set-up, metrics) are collapsed: click \"Show code cell source\" to open one. "
             "[Neuron recipes](recipes.md) lists every recipe for transformers-neuronx and NxD Inference with how it "
             "was verified.")
    if missing:
        built += " Not executed in this run, so without a page: " + ", ".join(f"`{m}`" for m in missing) + "."
    toc = "\n".join(["```{toctree}", ":maxdepth: 1", ":caption: Notebooks", "", *[f"notebooks/{s}" for s in pages],
                     "```", "", "```{toctree}", ":maxdepth: 1", ":caption: Reference", "", "recipes", "```"])
    return "\n\n".join([f"# {title}", rewrite_links(intro, set(pages), commit), "## This book", built,
                        "## Start here", rewrite_links(body, set(pages), commit), toc]) + "\n"


def recipes_page(recipes: list[dict], lanes: dict, hardware: dict) -> str:
    lines = ["# Neuron recipes", "",
             "Every notebook carries one recipe per pinned Neuron stack: its cells tagged `neuron` and the stack, "
             "plain Python that needs only the stack's library, transformers, torch and the standard library, with "
             "the values you edit under one `# EDIT` comment. The stamp of each says how it was verified:", "",
             "- **API**: the stand-in the recipe runs against was compared, callable by callable, with the published "
             "source of the release (tests/neuron_sim/signatures, tests/contract/test_stand_in_signatures.py);",
             "- **Neuron lane**: the recipe ran alone as a script, in an empty folder and without this repository's "
             "`helpers`, against the stand-in of its stack under the transformers version the stack pins, on the "
             "embedded SmolLM2-135M-Instruct and on a production-shaped random checkpoint (ci/neuron_cells.py). "
             "That shows the code matches the pinned API; it does not show compilation, numerics or speed on "
             "NeuronCores;",
             "- **Neuron hardware**: a run of the notebook on an inf2 instance by the owner's runner "
             "(the inf2 workflow), where one is recorded.", ""]
    for stack in STACKS:
        sig = signatures(stack)
        source = NOT_RECORDED
        if sig["commit"]:
            source = (f"[{sig['repository']} {sig['release']}](https://github.com/{sig['repository']}/tree/"
                      f"{sig['commit']}) (commit `{sig['commit'][:7]}`, {sig['entries']} public callables compared)")
        mine = [r for r in recipes if r["stack"] == stack]
        models = sorted({row.get("model") for r in mine for row in lanes.get((r["notebook"], stack)) or []},
                        key=lambda m: (m != "embedded", m))  # the lanes' order: embedded first
        lines += [f"## {RECIPE_HEADERS[stack][2]}", "", f"API checked against {source}. The neuron lane's "
                  "standalone runs by model, and runs on an inf2 instance (each notebook links to its recipe's "
                  "stamp below):", "",
                  "| " + " | ".join(["notebook", "feature", *models, "on inf2"]) + " |",
                  "|" + " --- |" * (len(models) + 3)]
        for r in mine:
            stem = r["notebook"]
            rows = {row.get("model"): row for row in lanes.get((stem, stack)) or []}
            short = [NOT_RECORDED if m not in rows else "**PASS**" if rows[m].get("passed") else "**FAIL**"
                     for m in models]
            on_hw = (hardware.get((stem, stack)) or {}).get("ran")
            lines.append("| " + " | ".join([f"{{ref}}`{stem} <stamp-{stem}-{stack}>`", md(r["title"].split(":")[0]),
                                            *short,
                                            "ran on inf2" if on_hw else "never"]) + " |")
        if not mine:
            lines.append("| no recipe found | |" + " |" * len(models) + " |")
        lines.append("")
        for r in mine:
            stem = r["notebook"]
            cells = f"{len(r['cells'])} code cell" + ("s" if len(r["cells"]) > 1 else "")
            if r["page"]:
                place = (f"{{ref}}`{cells} <recipe-{stem}-{stack}>` in <a href=\"notebooks/{stem}.html#neuron-code\">"
                         "the notebook's Neuron section</a>")
            else:
                place = f"{cells} in `notebooks/{stem}.ipynb` (not executed in this run: no page)"
            lines += [f"(stamp-{stem}-{stack})=", f"```{{admonition}} {stem} · {r['title']} · "
                      f"{RECIPE_HEADERS[stack][2].split(',')[0]}", ":class: recipe-stamp", "",
                      f":The recipe: {place}",
                      f":API: checked against {sig['repository'] or NOT_RECORDED} {sig['release'] or ''} "
                      f"(commit `{(sig['commit'] or NOT_RECORDED)[:7]}`) through its stand-in",
                      f":Neuron lane: {lane_cells_text(lanes.get((stem, stack)))}",
                      f":Neuron hardware: {hardware_text(hardware.get((stem, stack)))}", "```", ""]
    return "\n".join(lines) + "\n"


CONF = '''# Generated by ci/build_site.py: the book's Sphinx configuration (MyST-NB renders the executed notebooks as they ran).
project = {project!r}
author = "the notebooks' authors"
extensions = ["myst_nb"]
html_theme = "sphinx_book_theme"
html_title = {project!r}
html_theme_options = {theme!r}
html_static_path = ["_static"]
html_css_files = ["book.css"]
html_last_updated_fmt = None
exclude_patterns = ["_build"]
nb_execution_mode = "off"          # never run a notebook here: show the run's outputs
nb_merge_streams = True            # a stream written a word at a time reads as one text
nb_output_stderr = "show"          # ci/build_site.py has already taken the build environment's warnings out
myst_enable_extensions = ["colon_fence", "fieldlist"]
myst_heading_anchors = 3           # [x](#2-stream-the-tokens) to a heading, as on GitHub
suppress_warnings = ["mystnb.unknown_mime_type"]
'''

CSS = """/* ci/build_site.py: the stamp under each notebook's title; the recipes' table */
.run-stamp { font-size: 0.9em; }
.run-stamp dl.field-list { grid-template-columns: max-content auto; margin-bottom: 0.5em; }
.run-stamp dl.field-list > dt { padding-right: 1em; }
/* the book theme keeps a margin column for side notes, which these pages have none of: give code and outputs the room */
@media (min-width: 1200px) { .bd-main .bd-content .bd-article-container { max-width: 100%; } }
table.table td { vertical-align: top; }
/* printed text wraps as in JupyterLab (a streamed answer is one long line); code keeps its lines */
div.cell_output div.output pre { white-space: pre-wrap; overflow-wrap: anywhere; }
"""


def build(args) -> int:
    out_root = Path(args.records).resolve()
    run = Path(args.run).resolve() if args.run else find_run(out_root)
    if run is None:
        print(f"no executed notebooks under {out_root} (run bash ci/notebooks.sh first)", file=sys.stderr)
        return 2
    lanes = {s: Path(p).resolve() for s, p in (kv.split("=", 1) for kv in args.lane)} if args.lane else {
        s: out_root / f"neuron-sim-{s}" for s in STACKS}
    inf2 = {s: Path(p).resolve() for s, p in (kv.split("=", 1) for kv in args.inf2)} if args.inf2 else {
        s: out_root / f"inf2-{s}" for s in STACKS}
    src, site = Path(args.src).resolve(), Path(args.out).resolve()
    report = read_json(run / "report.json") or {}
    environment = report.get("environment") or {}
    lane_rows, lane_nbs, hardware = lane_results(lanes), lane_notebook_runs(lanes), inf2_runs(inf2)

    shutil.rmtree(src, ignore_errors=True)
    (src / "notebooks").mkdir(parents=True)
    (src / "_static").mkdir()
    executed = {p.stem: p for p in sorted((run / "executed").glob("[0-9][0-9]_*.ipynb"))}
    sources = {p.stem: p for p in sorted(Path(args.notebooks_dir).glob("[0-9][0-9]_*.ipynb"))}
    pages, recipes = {}, []
    for stem in sorted(set(executed) | set(sources)):
        nb = nbformat.read(str(executed.get(stem) or sources[stem]), as_version=4)
        cells = recipes_of(nb)
        title = title_of(nb, stem)
        if stem in executed:
            stamp = run_stamp(stem, nb, (report.get("notebooks") or {}).get(stem), environment, lane_rows,
                              lane_nbs, hardware, read_json(run / "metrics" / f"{stem}.json"))
            stage_notebook(executed[stem], src / "notebooks" / f"{stem}.ipynb", stamp, cells, set(executed))
            pages[stem] = title
        for stack, idx in cells.items():
            recipes.append({"notebook": stem, "stack": stack, "title": title.split("·", 1)[-1].strip(),
                            "cells": idx, "page": stem in executed})
    missing = [s for s in sources if s not in executed]
    commit = environment.get("commit")
    (src / "index.md").write_text(index_page(pages, missing, environment, commit))
    (src / "recipes.md").write_text(recipes_page(recipes, lane_rows, hardware))
    if (REPO / "docs" / "img").is_dir():
        shutil.copytree(REPO / "docs" / "img", src / "img")
    theme = {"home_page_in_toc": True, "show_toc_level": 2, "use_download_button": True,
             "use_fullscreen_button": False}
    if repo_url():
        theme.update(repository_url=repo_url(), use_repository_button=True)
    project = (REPO / "README.md").read_text().splitlines()[0].lstrip("# ").strip()
    (src / "conf.py").write_text(CONF.format(project=project, theme=theme))
    (src / "_static" / "book.css").write_text(CSS)

    start = time.monotonic()
    shutil.rmtree(site, ignore_errors=True)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", "-j", str(args.jobs),
           str(src), str(site)]
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"})
    print(f"sphinx: {len(pages)} notebook pages, {len(recipes)} recipes, built in {time.monotonic() - start:.1f} s"
          f" into {site}" + ("" if proc.returncode == 0 else f" (exit status {proc.returncode}: warnings above)"))
    if proc.returncode != 0 and not (site / "index.html").is_file():
        return 1
    (site / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ and _images/ as they are
    check = site_check.check_site(site)
    for line in check.broken:
        print("BROKEN", line)
    print("link check:", check.summary())
    return 1 if proc.returncode != 0 or check.broken else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    out = os.environ.get("OUT_DIR", "out")
    ap.add_argument("--records", default=str(REPO / out), help="the folder of the runs' records (default: out/)")
    ap.add_argument("--run", help="the notebooks' run: a folder with executed/, report.json, metrics/ "
                                  "(default: <records>/notebooks/cpu, else <records>)")
    ap.add_argument("--lane", action="append", metavar="STACK=DIR",
                    help="a neuron lane's folder, with cells/results.json (default: <records>/neuron-sim-<stack>)")
    ap.add_argument("--inf2", action="append", metavar="STACK=DIR",
                    help="an inf2 run's folder, the inf2 workflow's artifact (default: <records>/inf2-<stack>)")
    ap.add_argument("--notebooks-dir", default=str(REPO / "notebooks"), help="the source notebooks (all recipes)")
    ap.add_argument("--src", help="where to stage Sphinx's sources (default: <out>-src)")
    ap.add_argument("--out", default=str(REPO / out / "site"), help="the site's folder (default: out/site)")
    ap.add_argument("--jobs", type=int, default=1, help="Sphinx's parallel jobs (default 1)")
    args = ap.parse_args(argv)
    args.src = args.src or str(Path(args.out).resolve()) + "-src"
    return build(args)


if __name__ == "__main__":
    sys.exit(main())
