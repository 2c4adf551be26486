"""Notebook 09's serving recipes that CI cannot run: the `vllm serve` block (vLLM is in neither pinned stack) and
the production slot counts of the recipe cells (no inf2 here). Checked against the lines of the SDK 2.28.1 "vLLM
User Guide for NxD Inference" quoted below, and against the KV-cache sizing of ``helpers.planning.memory``.

Guide: https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.1/libraries/nxd-inference/developer_guides/vllm-user-guide-v1.html
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from helpers.planning.memory import GiB, PLATFORM_TP_DEGREES, plan

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "09_continuous_batching.ipynb"
# The guide's "Versioning" and install lines ("Manually install from source"), quoted.
GUIDE_VERSIONS = {"Plugin Version": "0.4.1", "Neuron SDK Version": "2.28.0", "vLLM Version": "0.13.0",
                  "PyTorch Version": "2.9.0"}
GUIDE_INSTALL = ['git clone --branch "0.4.1" https://github.com/vllm-project/vllm-neuron.git',
                 "cd vllm-neuron",
                 "pip install --extra-index-url=https://pip.repos.neuron.amazonaws.com -e ."]
# The guide's serve example, quoted: the flags it uses (the recipe keeps them and adds the production values).
GUIDE_SERVE = ('vllm serve --model "TinyLlama/TinyLlama-1.1B-Chat-v1.0" --tensor-parallel-size 2 --max-model-len 128 '
               "--max-num-seqs 4 --block-size 32 --port 8000")


def _cells():
    return json.loads(NOTEBOOK.read_text())["cells"]


def _bash_block() -> list[str]:
    texts = [t for t in ("".join(c["source"]) for c in _cells() if c["cell_type"] == "markdown") if "```bash" in t]
    assert len(texts) == 1, "one markdown cell of notebook 09 holds the vLLM recipe (a bash block)"
    block = re.search(r"```bash\n(.*?)```", texts[0], flags=re.S).group(1)
    return block.replace("\\\n", " ").strip().splitlines()


def _flags(command: str) -> dict[str, str | bool]:
    words = shlex.split(command)
    assert words[:2] == ["vllm", "serve"]
    out, i = {}, 2
    while i < len(words):
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            out[words[i]] = words[i + 1]
            i += 2
        else:
            out[words[i]] = True
            i += 1
    return out


def _production_slots(stack: str) -> dict:
    """The 'production slots' comment of the stack's first recipe cell: n_slots, GiB of KV cache, tp, positions."""
    for c in _cells():
        if stack in c.get("metadata", {}).get("tags", []):
            m = re.search(r"# production slots: n_slots=(\d+) \(KV cache ([\d.]+) GiB per core at tp_degree=(\d+), "
                          r"(?:n_positions|seq_len)=(\d+); ([\d.]+) GiB with weights\)", "".join(c["source"]))
            assert m, f"the first {stack} cell names its production slots"
            return dict(zip(("n_slots", "kv_gib", "tp", "positions", "total_gib"),
                            (int(m[1]), float(m[2]), int(m[3]), int(m[4]), float(m[5]))))
    raise AssertionError(stack)


def test_install_is_the_guides_for_sdk_2_28():
    lines = _bash_block()
    assert lines[:3] == GUIDE_INSTALL
    assert GUIDE_VERSIONS["Plugin Version"] in lines[0]
    text = "".join("".join(c["source"]) for c in _cells() if c["cell_type"] == "markdown")
    assert all(f"`{v}`" in text for v in GUIDE_VERSIONS.values()), "the notebook names the guide's versions"


def test_serve_keeps_the_guides_flags_and_sets_what_its_known_issues_ask():
    ours, guide = _flags(_bash_block()[3]), _flags(GUIDE_SERVE)
    assert set(guide) <= set(ours)
    assert ours["--block-size"] == guide["--block-size"] == "32"
    assert ours["--no-enable-chunked-prefill"] is True  # known issue: chunked prefill is not supported on Neuron
    blocks = int(ours["--max-num-seqs"]) * int(ours["--max-model-len"]) // int(ours["--block-size"])
    assert int(ours["--num-gpu-blocks-override"]) == blocks  # known issue: num_gpu_blocks_override must be set


def test_serve_uses_the_production_setting():
    ours, prod = _flags(_bash_block()[3]), _production_slots("nxdi")
    assert "Llama-3.1-8B-Instruct" in ours["--model"]
    assert int(ours["--tensor-parallel-size"]) == prod["tp"] == 8 and 8 in PLATFORM_TP_DEGREES["inf2"]
    assert int(ours["--max-model-len"]) == prod["positions"] == 4096
    assert int(ours["--max-num-seqs"]) == prod["n_slots"]


@pytest.mark.parametrize("stack,library,instance", [("tnx", "tnx", "inf2.8xlarge"), ("nxdi", "nxdi", "inf2.24xlarge")])
def test_production_slots_fit_and_state_the_sizing(stack, library, instance):
    prod = _production_slots(stack)
    p = plan("Llama-3.1-8B", prod["tp"], batch_size=prod["n_slots"], n_positions=prod["positions"], library=library)
    assert round(p.kv_bytes / GiB, 1) == prod["kv_gib"]
    assert round(p.total_bytes / GiB, 1) == prod["total_gib"]
    assert p.fits(instance)
