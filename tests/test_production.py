"""The production setting (helpers.planning.production): what it computes for Llama-3.1-8B on each stack, why it
refuses the smaller instances, and that the notebooks and docs/inf2.md name the same setting."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.planning import memory as M
from helpers.planning import production as P

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))  # the contract fixture is not among them


def test_host_memory_per_instance_is_the_architecture_pages():
    assert {n: i.host_memory_gib for n, i in M.INSTANCES.items()} == {
        "inf2.xlarge": 16, "inf2.8xlarge": 128, "inf2.24xlarge": 384, "inf2.48xlarge": 768,
        "trn1.2xlarge": 32, "trn1.32xlarge": 512, "trn2.48xlarge": 2048}


def test_the_host_estimate_is_the_factor_times_the_checkpoint_and_exceeds_the_reported_host():
    ckpt = P.checkpoint_bytes("Llama-3.1-8B")
    assert 16.0e9 < ckpt < 16.1e9  # 8.03 B parameters in bf16
    assert P.host_memory_estimate("Llama-3.1-8B") == P.HOST_FACTOR * ckpt
    # the reports: killed compiling on a trn1.2xlarge (32 GiB host): the estimate must not fit there
    assert P.host_memory_estimate("Llama-3.1-8B") > M.INSTANCES["trn1.2xlarge"].host_memory_bytes
    assert P.size_label("Llama-3.1-8B") == "8B"


@pytest.mark.parametrize("stack,instance,tp", [("tnx", "inf2.8xlarge", 2), ("nxdi", "inf2.24xlarge", 8)])
def test_the_computed_setting(stack, instance, tp):
    s = P.production_setting(stack)
    assert (s.instance, s.tp_degree, s.batch_size, s.seq_len, s.amp) == (instance, tp, 1, 4096, "bf16")
    assert s.checkpoint == "Llama-3.1-8B-Instruct" and s.plan.fits(instance)
    assert s.buckets == (128, 256, 512, 1024, 2048, 4096)


def test_the_default_buckets_follow_each_library():
    assert P.default_buckets("tnx", 3000) == [128, 256, 512, 1024, 2048, 3000]
    assert P.default_buckets("nxdi", 3000) == [128, 256, 512, 1024, 2048, 3000]
    assert P.default_buckets("nxdi", 5000) == [128, 256, 512, 1024, 2048, 5000]  # up to 2**round(log2(5000)), excluded
    assert P.default_buckets("tnx", 5000) == [128, 256, 512, 1024, 2048, 4096, 5000]
    with pytest.raises(ValueError):
        P.default_buckets("vllm", 4096)


@pytest.mark.parametrize("stack", P.STACKS)
def test_an_inf2_xlarge_is_refused_for_its_host_memory(stack):
    for tp in (1, 2):
        r = P.refusal(stack, "Llama-3.1-8B", "inf2.xlarge", tp)
        assert r.rule == "host" and "aws-neuron-sdk#1222" in r.reason


def test_nxdi_at_tp_2_is_refused_for_1289_and_tnx_is_not():
    r = P.refusal("nxdi", "Llama-3.1-8B", "inf2.8xlarge", 2)
    assert r.rule == "kv_heads" and r.reason.endswith("8 KV heads over 2 cores: aws-neuron-sdk#1289")
    assert P.refusal("tnx", "Llama-3.1-8B", "inf2.8xlarge", 2) is None
    assert P.refusal("nxdi", "Llama-3.1-8B", "inf2.24xlarge", 8) is None
    assert P.refusal("tnx", "Llama-3.1-8B", "inf2.8xlarge", 1).rule == "device"  # 8B bf16 on one 16 GiB core


def test_a_small_model_fits_the_smallest_instance_and_a_large_one_nothing():
    s = P.production_setting("tnx", "Llama-3.2-1B", checkpoint="Llama-3.2-1B")
    assert (s.instance, s.tp_degree) == ("inf2.xlarge", 1)
    with pytest.raises(ValueError, match="no trn1 instance"):
        P.production_setting("tnx", "Llama-3.1-70B", seq_len=4096, batch_size=64, platform="trn1")


def test_recipe_comment_is_the_two_canonical_lines():
    assert P.recipe_comment("tnx") == (
        '# production: Llama-3.1-8B-Instruct in bf16 (amp="bf16", n_positions=4096, batch_size=1) at tp_degree=2 on an\n'
        "# inf2.8xlarge (not an inf2.xlarge, 16 GiB host: an 8B compile ran out of a 32 GiB trn1.2xlarge in aws-neuron-sdk#1222)")
    assert P.recipe_comment("nxdi") == (
        '# production: Llama-3.1-8B-Instruct in bf16 (torch_dtype="bfloat16", seq_len=4096, batch_size=1) at '
        "tp_degree=8\n# on an inf2.24xlarge (NxD Inference 0.8 is reported not to compile 8 KV heads over 2 cores: "
        "aws-neuron-sdk#1289)")


def _first_cells(path):
    """{stack: source of the notebook's first Neuron cell of that stack}."""
    out = {}
    for cell in json.loads(path.read_text())["cells"]:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if "neuron" in tags:
            for stack in tags & set(P.STACKS):
                out.setdefault(stack, "".join(cell["source"]))
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_names_the_production_setting(path):
    """Each stack's first recipe cell carries the two lines verbatim, and no other "production:" variant."""
    cells = _first_cells(path)
    assert set(cells) == set(P.STACKS), f"{path.name}: recipe cells for {sorted(cells)}"
    for stack, src in cells.items():
        comment = P.recipe_comment(stack)
        assert comment in src, f"{path.name}, {stack}: the first recipe cell lacks the production lines:\n{comment}"
        assert src.count("production:") == 1, f"{path.name}, {stack}: another 'production:' line besides the two"


def test_docs_inf2_carries_the_table_and_the_lines():
    doc = (REPO / "docs" / "inf2.md").read_text()
    assert P.production_markdown() in doc, "docs/inf2.md: regenerate the production table (production_markdown())"
    for stack in P.STACKS:
        assert P.recipe_comment(stack) in doc, f"docs/inf2.md lacks the {stack} production lines"
