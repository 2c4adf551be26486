"""Contract test: every Neuron code path matches the pinned releases' API.

What it proves: Neuron cells (``neuron`` + ``tnx`` / ``nxdi`` tags; the fixture notebook's here, every
notebook's in the neuron lanes, see ``_cases``) and the helpers
entry point (``helpers.build_model`` on the neuron backend -> ``helpers.neuron``) call only classes,
keywords, enum members and call orders that exist in transformers-neuronx 0.13 (v0.13.0) and NxD
Inference 0.8 (SDK 2.28). The stand-in packages in ``tests/neuron_sim/`` transcribe those signatures and
rules and raise on anything else, including keywords the real libraries silently swallow.
What it does not prove: that anything runs on an inf2 instance (that is the inf2 workflow's job).

A stack's Neuron cells run in order in one fresh namespace on their ``# EDIT`` literals: a recipe that reads a name
from another cell fails. The cell convention is in ``contract_harness.py`` (and docs/inf2.md); its static half (tags,
headers, imports, one ``# EDIT`` block, no free names) is checked without stand-ins by ``tests/test_neuron_cells.py``,
and the lanes run every notebook's cells as scripts (``ci/neuron_cells.py``).
"""
from __future__ import annotations

import importlib.util
import keyword
import re
import sys
from pathlib import Path

import nbformat
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contract_harness as harness  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "00_contract_sample.ipynb"
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def _cases():
    """The fixture notebook's Neuron cells, run in-process here. The notebooks' own Neuron cells run in the neuron
    lanes, twice: inside the whole notebook (ci/run_notebooks.py on backend=neuron) and each alone as a script in
    its own process (ci/neuron_cells.py)."""
    nb = nbformat.read(str(FIXTURE), as_version=4)
    return [pytest.param(FIXTURE, stack, id=f"{FIXTURE.stem}-{stack}") for stack in harness.neuron_stacks(nb)]


@pytest.fixture
def contract(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with harness.stand_ins(compiled_dir=tmp_path / "compiled-cache") as c:
        yield c


@pytest.mark.parametrize("path,stack", _cases())
def test_neuron_cells_match_pinned_api(path, stack, contract):
    run = harness.run_neuron_cells(path, stack)
    made = [name for name, _ in contract.calls(f"{stack}.")]
    assert made, f"{path.stem}: the {stack} cells made no {stack} call (were they all skipped?)\n{run.stdout}"
    assert "Skipped:" not in run.stdout, f"{path.stem}: a {stack} cell skipped itself\n{run.stdout}"
    assert not contract.calls("tnx." if stack == "nxdi" else "nxdi."), "a cell called the other stack"


# ------------------------------------------------------------------------- the helpers entry point
def _build(stack, **settings):
    import helpers
    from helpers.notebook.backend import Backend

    return helpers.build_model(Backend("neuron", stack), None, **settings)


class Recorder:
    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(torch.as_tensor(value))

    def end(self):
        self.ends += 1


@pytest.mark.parametrize("stack", harness.STACKS)
def test_entry_point_all_settings(stack, contract, tmp_path):
    import helpers

    nc = helpers.NeuronConfig(group_query_attention="shard-over-heads", quant={"quant_dtype": "s8"})
    extra = {"quantized_checkpoints_path": str(tmp_path / "q.pt")} if stack == "nxdi" else {}
    model = _build(stack, batch_size=2, n_positions=[128, 256], tp_degree=2, amp="bf16",
                   context_length_estimate=[64, 128], neuron_config=nc, **extra)
    ids = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    streamer = Recorder()
    out = model.sample(ids, 10, attention_mask=mask, top_k=1, streamer=streamer, temperature=1)
    assert out.shape == (2, 10) and torch.equal(out[:, :4], ids)
    assert len(streamer.puts) == 6 and all(p.shape == (2, 1) for p in streamer.puts) and streamer.ends == 1
    names = [n for n, _ in contract.calls(stack)]
    if stack == "tnx":
        (_, kw), = contract.calls("tnx.LlamaForSampling.from_pretrained")
        assert kw["n_positions"] == [128, 256] and kw["context_length_estimate"] == [64, 128]
        assert kw["tp_degree"] == 2 and kw["amp"] == "bf16" and kw["batch_size"] == 2
    else:
        (_, kw), = contract.calls("nxdi.NeuronConfig")
        assert kw["token_generation_buckets"] == [128, 256] and kw["context_encoding_buckets"] == [64, 128]
        assert kw["seq_len"] == 256 and kw["max_context_length"] == 128
        assert kw["quantized"] and kw["quantization_dtype"] == "int8"
        assert names.index("nxdi.save_quantized_state_dict") < names.index("nxdi.compile") < names.index("nxdi.load")
        assert model.stats["ttft_s"] is None  # NxDI drives no per-token streamer


def test_entry_point_tnx_reuses_saved_artifacts(contract):
    _build("tnx", n_positions=128, tp_degree=1)
    _build("tnx", n_positions=128, tp_degree=1)
    loads = contract.calls("tnx.load")
    assert [kw["loaded"] for _, kw in contract.calls("tnx.to_neuron")] == [False, True] and len(loads) == 1


def test_entry_point_tnx_stopping_criteria_see_generated_ids(contract):
    model = _build("tnx", batch_size=2, n_positions=128, tp_degree=1)
    seen = []

    def stop_after_three(ids, scores):  # per-row flags, as Hugging Face criteria return
        seen.append(ids.shape[1])
        return torch.full((ids.shape[0],), ids.shape[1] >= 7)

    out = model.sample(torch.ones(2, 4, dtype=torch.long), 20, top_k=1, stopping_criteria_list=stop_after_three)
    assert seen[0] == 5 and out.shape[1] == 7  # prompt + generated so far, not the prompt alone
    assert model.stats["row_new_tokens"] == [3, 3]


@pytest.mark.parametrize("stack", harness.STACKS)
def test_entry_point_rows_stop_one_by_one(stack, contract):
    model = _build(stack, batch_size=2, n_positions=128, tp_degree=1)

    def stop_row0(ids, scores):
        return torch.tensor([ids.shape[1] >= 6, ids.shape[1] >= 9])

    out = model.sample(torch.ones(2, 4, dtype=torch.long), 20, top_k=1, stopping_criteria_list=stop_row0,
                       pad_token_id=0)
    assert model.stats["row_new_tokens"] == [2, 5] and out.shape == (2, 9)
    assert out[0, 6:].tolist() == [0, 0, 0] and (out[1, 4:] != 0).all()


@pytest.mark.parametrize("stack", harness.STACKS)
def test_entry_point_refuses_bad_inputs_before_the_library(stack, contract):
    model = _build(stack, batch_size=1, n_positions=128, tp_degree=1)
    calls = len(contract.CALLS)
    for ids, match in [(torch.full((1, 4), 49152), "outside the vocabulary"), (torch.zeros(1, 0, dtype=torch.long),
                       "prompt is empty"), (torch.ones(1, 4), "dtype"), (torch.ones(1, 4, dtype=torch.long), None)]:
        if match is None:  # lengths the compiled graphs cannot take
            with pytest.raises(ValueError, match="exceeds the compiled 128 positions"):
                model.sample(ids, 129, top_k=1)
            continue
        with pytest.raises(ValueError, match=match):
            model.sample(ids, 10, top_k=1)
    assert len(contract.CALLS) == calls, "the library was called with an input the adapter must refuse"


@pytest.mark.parametrize("stack", harness.STACKS)
def test_entry_point_speculation_is_greedy_and_full_length(stack, contract, tmp_path):
    """A 2-layer draft that often disagrees with the target: greedy speculation must return exactly the
    target's greedy tokens, as many as asked (tnx: the default acceptor would sample at temperature 1; NxDI:
    the assisted loop would stop up to k-1 tokens short)."""
    import helpers
    from helpers.prompts import encode_prompts
    from helpers.model_store import write_truncated_draft

    draft = write_truncated_draft(helpers.resolve_model_path(None), 2, tmp_path / "draft")
    enc = encode_prompts(helpers.load_tokenizer(), ["Name three colours."], 1)
    seq_len = enc.input_ids.shape[1] + 14
    plain = _build(stack, n_positions=128, tp_degree=1)
    expected = plain.sample(enc.input_ids, seq_len, top_k=1, attention_mask=enc.attention_mask, eos_token_override=[]
                            if stack == "tnx" else None)
    spec = _build(stack, n_positions=128, tp_degree=1, draft_model_path=str(draft), speculation_length=4)
    names = [n for n, _ in contract.calls(stack)]
    if stack == "tnx":  # k scored per target pass = 4 drafts + 1, built before to_neuron()
        (_, kw), = contract.calls("tnx.enable_speculative_decoder")
        assert kw["speculation_length"] in (5, [5]), kw
        assert names.index("tnx.enable_speculative_decoder") < len(names) - 1 - names[::-1].index("tnx.to_neuron")
    else:
        assert [kw["speculation_length"] for _, kw in contract.calls("nxdi.NeuronConfig") if "speculation_length" in kw] == [5]
    streamer = Recorder()
    out = spec.sample(enc.input_ids, seq_len, top_k=1, attention_mask=enc.attention_mask, streamer=streamer,
                      eos_token_override=[] if stack == "tnx" else None)
    assert torch.equal(out, expected), (out, expected)
    assert len(streamer.puts) == spec.stats["new_tokens"] == expected.shape[1] - enc.input_ids.shape[1]
    with pytest.raises(ValueError, match="greedy only"):
        spec.sample(enc.input_ids, seq_len, top_k=5, attention_mask=enc.attention_mask)


@pytest.mark.parametrize("stack", harness.STACKS)
def test_entry_point_speculation_stops_at_eos_as_the_plain_loop(stack, contract, tmp_path):
    """An EOS inside a speculation window: the speculative loops of both libraries run past it (tnx returns
    tokens[:, :sequence_length], NxDI checks only the last accepted token); helpers gives what the plain loop
    gives, up to and including the EOS."""
    import helpers
    from helpers.prompts import encode_prompts
    from helpers.model_store import write_truncated_draft

    draft = write_truncated_draft(helpers.resolve_model_path(None), 2, tmp_path / "draft")
    enc = encode_prompts(helpers.load_tokenizer(), ["Name three colours."], 1)
    seq_len = enc.input_ids.shape[1] + 14
    plain = _build(stack, n_positions=128, tp_degree=1)
    free = plain.sample(enc.input_ids, seq_len, top_k=1, attention_mask=enc.attention_mask,
                        eos_token_override=[] if stack == "tnx" else [0])
    stop = int(free[0, enc.input_ids.shape[1] + 5])  # a token the greedy run produces at step 6: the "EOS"
    first = int((free[0, enc.input_ids.shape[1]:] == stop).nonzero()[0]) + 1
    expected = plain.sample(enc.input_ids, seq_len, top_k=1, attention_mask=enc.attention_mask,
                            eos_token_override=[stop])
    assert expected.shape[1] == enc.input_ids.shape[1] + first
    spec = _build(stack, n_positions=128, tp_degree=1, draft_model_path=str(draft), speculation_length=4)
    out = spec.sample(enc.input_ids, seq_len, top_k=1, attention_mask=enc.attention_mask, eos_token_override=[stop])
    assert torch.equal(out, expected), (out, expected)
    assert spec.stats["row_new_tokens"] == [first]


def test_entry_point_refuses_mistral_on_nxdi(contract, tmp_path):
    import json
    import shutil

    import helpers

    src = Path(helpers.resolve_model_path(None))
    dst = tmp_path / "mistral"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))
    with pytest.raises(ValueError, match="no models.mistral"):
        helpers.build_model(helpers.Backend("neuron", "nxdi"), str(dst))


# ------------------------------------------------------------------------- the contract can fail
def _misspell(target_cell_text, old, new):
    def edit(i, source):
        return source.replace(old, new) if target_cell_text in source else source
    return edit


@pytest.mark.parametrize("stack,cell_text,old,new", [
    ("tnx", "tnx_model = LlamaForSampling.from_pretrained(", "n_positions=n_positions", "n_position=n_positions"),
    ("tnx", "tnx_model = LlamaForSampling.from_pretrained(", "tp_degree=tp_degree,", "tp_degree=tp_degree, prompt_batch_size=2,"),
    ("tnx", "tnx_reloaded.sample(", "top_k=1", "topk=1"),
    ("tnx", "GQA.REPLICATED_HEADS", "GQA.REPLICATED_HEADS", "GQA.REPLICATE_HEADS"),
    ("nxdi", "nxdi_config = NeuronConfig(", "seq_len=n_positions", "seq_length=n_positions"),
    ("nxdi", "nxdi_config = NeuronConfig(", "tp_degree=tp_degree,", "tp_degree=tp_degree, trace_tokengen_model=False,"),
    ("nxdi", "adapter.generate(", "max_length=sequence_length", "max_lenght=sequence_length"),
])
def test_misspelled_keyword_fails_the_contract(stack, cell_text, old, new, contract):
    assert any(cell_text in c.source and old in c.source for c in nbformat.read(str(FIXTURE), as_version=4).cells), \
        "the edit must apply"
    with pytest.raises((contract.ContractError, AttributeError, TypeError)) as err:
        harness.run_neuron_cells(FIXTURE, stack, edit=_misspell(cell_text, old, new))
    wrong = {w for w in set(re.findall(r"[A-Za-z_]\w*", new)) - set(re.findall(r"[A-Za-z_]\w*", old))
             if not keyword.iskeyword(w)}  # the misspelled or unknown name
    assert wrong and all(w in str(err.value) for w in wrong), (wrong, str(err.value))


@pytest.mark.parametrize("stack,cell_text,old,new,match", [
    ("tnx", "tnx_model.enable_speculative_decoder", "tnx_model.enable_speculative_decoder(speculation_length)  # before to_neuron()\ntnx_model.to_neuron()",
     "tnx_model.to_neuron()\ntnx_model.enable_speculative_decoder(speculation_length)", "before"),
    ("tnx", "tnx_reloaded.load", "tnx_reloaded.load(compiled_dir)  # before to_neuron(): skips compilation\ntnx_reloaded.to_neuron()",
     "tnx_reloaded.to_neuron()\ntnx_reloaded.load(compiled_dir)", "load"),
    ("tnx", "tnx_model.save(", "tnx_model.save(compiled_dir)", "tnx_model.save(compiled_dir, sharded_weights=True)",
     "on_device_embedding"),
    ("tnx", "tnx_reloaded.sample(", "temperature=1.0", "temperature=1", "temperature"),
    ("nxdi", "nxdi_model.load(", "nxdi_model.compile(compiled_dir)\n", "", "model.pt does not exist"),
])
def test_wrong_call_order_fails_the_contract(stack, cell_text, old, new, match, contract):
    edit = _misspell(cell_text, old, new)
    assert any(cell_text in c.source and old in c.source for c in nbformat.read(str(FIXTURE), as_version=4).cells), \
        "the edit must apply"
    with pytest.raises((contract.ContractError, AssertionError, ValueError)) as err:
        harness.run_neuron_cells(FIXTURE, stack, edit=edit)
    assert match in str(err.value)


# ------------------------------------------------------------------------- the harness runs each recipe alone
def _replace_cells(stack, bodies):
    """edit= hook: the fixture's ``stack`` Neuron cells become recipe cells with these bodies, in order (the first
    with the ``# EDIT`` block)."""
    indexes = [i for i, _ in harness.neuron_cells(nbformat.read(str(FIXTURE), as_version=4), stack)]
    assert len(indexes) == len(bodies) >= 2, "the fixture needs two Neuron cells per stack"
    header = harness.RECIPE_HEADERS[stack][0]
    cells = {i: f"{header}\n" + ("# EDIT\nmodel_dir = 1\n\n" if k == 0 else "") + f"{body}\n"
             for k, (i, body) in enumerate(zip(indexes, bodies))}

    def edit(i, source):
        return cells[i]
    return edit, indexes


@pytest.mark.parametrize("stack", harness.STACKS)
def test_a_stacks_cells_run_in_one_namespace_of_their_own(stack, contract):
    edit, indexes = _replace_cells(stack, ["seen = sorted(globals())", "later = sorted(globals())"])
    run = harness.run_neuron_cells(FIXTURE, stack, edit=edit)
    ns = run.namespaces[indexes[1]]
    assert "model_dir" in ns["seen"] and "tokenizer" not in ns["seen"]  # only what the recipe binds
    assert "seen" in ns["later"] and "tokenizer" not in ns["later"] and "bk" not in ns["later"]  # one recipe
    assert [s.index for s in run.steps] == indexes


@pytest.mark.parametrize("stack,body,name", [
    ("tnx", "print(bk)", "bk"),  # set by an untagged cell of the fixture
    ("nxdi", "print(tokenizer)", "tokenizer"),
])
def test_a_name_from_another_cell_fails(stack, body, name, contract):
    edit, indexes = _replace_cells(stack, ["marker = 1", body])
    with pytest.raises(harness.HarnessError) as err:
        harness.run_neuron_cells(FIXTURE, stack, edit=edit)
    message = str(err.value)
    assert f"cell {indexes[1]}" in message and repr(name) in message, message
    assert "name from another cell" in message and "must stand alone" in message, message


def test_a_name_error_from_deeper_down_stays_a_name_error(contract):
    edit, _ = _replace_cells("tnx", ["x = 1", "exec('not_a_cell_name')"])
    with pytest.raises(NameError, match="not_a_cell_name") as err:
        harness.run_neuron_cells(FIXTURE, "tnx", edit=edit)
    assert not isinstance(err.value, harness.HarnessError)


def test_mistral_sample_has_no_cache_ids(contract):
    from transformers_neuronx import MistralForSampling  # the stand-in, transcribed from mistral/model.py

    with pytest.raises(TypeError, match="cache_ids"):
        MistralForSampling.sample(object(), torch.ones(1, 2, dtype=torch.long), 8, cache_ids=torch.arange(2))
    with pytest.raises(TypeError, match="no_repeat_ngram_size"):
        MistralForSampling.sample(object(), torch.ones(1, 2, dtype=torch.long), 8, no_repeat_ngram_size=3)


def test_helpers_keyword_list_matches_the_stand_in(contract):
    """helpers.neuron's NxDI keyword guard and the stand-in are two transcriptions of models/config.py."""
    from neuronx_distributed_inference.models.config import NEURON_CONFIG_KEYWORDS

    from helpers.neuron import NXDI_NEURON_CONFIG_KEYS

    assert NXDI_NEURON_CONFIG_KEYS == NEURON_CONFIG_KEYWORDS


def test_stand_ins_leave_no_trace():
    from helpers.notebook.backend import installed_stacks

    before = installed_stacks()  # [] in the main venv; the real stacks on an inf2 instance
    if importlib.util.find_spec("_neuron_contract") is not None:
        pytest.skip("the stand-ins are installed in this environment (a neuron lane): nothing to leave a trace in")
    with harness.stand_ins():
        import transformers_neuronx

        assert transformers_neuronx.__file__.startswith(str(harness.STUBS))
    assert all(not p.endswith("neuron_sim") for p in sys.path)
    assert installed_stacks() == before
    assert not any(str(harness.STUBS) in str(getattr(m, "__file__", "") or "") for m in list(sys.modules.values()))
