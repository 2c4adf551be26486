"""helpers.notebook.migration: notebook 11's steps behind one call each, and the two findings it answers (the list
row shows seq_len; CONVERT_TO_MHA keeps 8 KV heads at tp 2 and 4)."""
from __future__ import annotations

import types

import pytest
import torch

from helpers.neuron import migration as mapping
from helpers.notebook import migration as lesson


def test_the_list_row_shows_the_seq_len_nxdi_needs():
    row = next(r for r in mapping.mapping_rows() if r.setting.startswith("n_positions=[128, 512]"))
    assert "seq_len=512" in row.nxdi and "token_generation_buckets=[128, 512]" in row.nxdi


def test_convert_to_mha_replicates_only_where_the_kv_heads_split_unevenly(capsys):
    rows = {(r["model"][:7], r["tp"]): r["nxdi:default"] for r in lesson.gqa_names(["embedded", "Llama-3.1-8B"], [2, 4, 8])}
    assert rows[("Llama-3", 2)] == "convert-to-mha (4kv)"  # 8 KV heads over 2 cores: nothing replicated
    assert rows[("Llama-3", 4)] == "convert-to-mha (2kv)"
    assert rows[("Llama-3", 8)] == "replicate-to-tp-degree (1kv)"
    assert rows[("SmolLM2", 2)] == "convert-to-mha (5kv)"  # 3 KV heads -> 10 (the padded query heads), 5 per core


def test_memory_plan_rows_carry_kv_heads_per_core():
    rows = mapping.memory_plan("Llama-3.1-8B", [2, 4], n_positions=1024)
    assert {(r["tp"], r["library"]): r["kv_heads_per_core"] for r in rows} == {
        (2, "tnx"): 4, (2, "nxdi"): 4, (4, "tnx"): 2, (4, "nxdi"): 2}


@pytest.mark.parametrize("bad", [dict(batch_size=0), dict(max_new_tokens=0), dict(prompts=[])])
def test_setup_refuses_bad_parameters(bad):
    with pytest.raises(ValueError):
        lesson.setup(**bad)


class _Tok:
    eos_token_id = 0

    def __call__(self, prompts, return_tensors="pt"):
        return types.SimpleNamespace(input_ids=torch.ones(1, 3, dtype=torch.long))


def test_check_recipe_cells_says_when_none_ran_and_raises_on_a_difference(monkeypatch, capsys):
    run = types.SimpleNamespace(tok=_Tok(), hf=None, eos_ids=[0], bk="reference (test)")
    assert lesson.check_recipe_cells(run, {}) == {}
    assert "No recipe cell ran" in capsys.readouterr().out
    monkeypatch.setattr(lesson, "hf_greedy", lambda hf, enc, n: torch.tensor([[1, 1, 1, 5, 6]]))
    same = {"prompts": ["p"], "tnx_new_tokens": torch.tensor([[5, 6]])}
    assert lesson.check_recipe_cells(run, same)["tnx"]["identical"]
    with pytest.raises(AssertionError):
        lesson.check_recipe_cells(run, {"prompts": ["p"], "nxdi_new_tokens": torch.tensor([[5, 7]])})
    lesson.check_recipe_cells(run, {"prompts": ["p"], "nxdi_new_tokens": torch.tensor([[5, 7]]), "torch_dtype": "bfloat16"})
