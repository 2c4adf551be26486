"""Fidelity check of the Neuron stand-ins (tests/neuron_sim) against the pinned sources, read at run time.

    NXDI_SRC=/path/neuronx-distributed-inference  (checkout of cd3abf3, NxD Inference 0.8 / SDK 2.28.0)
    NXD_SRC=/path/neuronx-distributed             (checkout of v2.28.0: its pure-Python modules are loaded)
    TNX_SRC=/path/transformers-neuronx            (checkout of v0.13.0, f4e3818)
    python ci/fidelity.py [--nxdi-python .venv-neuron-nxdi/bin/python] [--tnx-python .venv-neuron-tnx/bin/python]

(a) Runs the pinned NxD Inference unit tests whose subject the stand-ins reproduce (``UNIT_TESTS``: autobucketing,
    2-D bucketing, prefix-caching bucket selection, model wrapper, input truncation, config, sampling) with the
    stand-in package importable as ``neuronx_distributed_inference``, under the lane's Python. Tests about what the
    stand-ins do not reproduce are listed in ``OUT_OF_SCOPE`` with the reason; they run, and are reported, but
    do not count.
(b) Runs the same probes (``probes_nxdi`` / ``probes_tnx``: generated inputs to the transcribed pure-Python
    functions) once against the pinned modules and once against the stand-ins, each in its own process, and
    compares every outcome (value, or exception type and message). A difference is *declared* when a row of the
    deviation table (tests/neuron_sim/deviations.py) names the probe in ``probes``; every other difference fails.

Nothing of the pinned sources is stored in this repository. Heavy imports of the pinned modules (torch_neuronx,
torch_xla, neuronxcc, the parts of neuronx_distributed that need them) are replaced by inert stubs inside the
child processes of this script only. Exit status: 0 when every in-scope pinned test passes and no undeclared
divergence is found; 1 otherwise; a stack whose checkout is absent is skipped with a message (exit 0), so CI can
run offline.
"""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAND_INS = REPO / "tests" / "neuron_sim"

UNIT_TESTS = [
    "test/unit/modules/test_autobucketing.py",
    "test/unit/modules/test_2d_bucketing.py",
    "test/unit/models/test_prefix_caching_bucket_selection.py",
    "test/unit/models/test_model_wrapper.py",
    "test/unit/models/test_input_truncation.py",
    "test/unit/models/test_config.py",
    "test/unit/modules/generation/test_sampling.py",
]

# Pinned unit tests about features the stand-ins do not reproduce (regular expression on the test id -> reason).
OUT_OF_SCOPE = {
    r"test_sampling\.py::TestSampling::": "on-device sampling traced with parallel_model_trace on XLA (not reproduced)",
    r"test_sampling\.py::TestSamplerMultinomialEdgeCases": "on-device multinomial kernel path (XLA; not reproduced)",
    r"test_sampling\.py::test_cumsum": "NKI cumsum kernel (not reproduced)",
    r"test_model_wrapper\.py::test_(compiler_args_by_tag|custom_compiler_args|token_generation_tiling_factor|"
    r"fused_speculation_tiling_factor|vectorize_strided_dma_\w+|long_context_mode|scratchpad_page_size|"
    r"block_kv_layout_flags|context_encoding_optimization|vision_encoder_optimization|other_models_get_o2|"
    r"spill_reload_dge|target_flag|layer_boundary_markers|quantization_f8e4m3|kv_cache_quant|"
    r"output_completion_notifications|hlo2tensorizer_always_present|quantization_flags)":
        "neuronx-cc compiler arguments (the stand-ins compile nothing)",
    r"test_model_wrapper\.py::test_convert_int64_to_int32": "XLA input conversion for tracing (not reproduced)",
    r"test_model_wrapper\.py::test_tensor_replacement_config_padding": "tensor replacement (not transcribed)",
    r"test_model_wrapper\.py::test_batch_bucketing_\w+": "batch bucketing (token_generation_batches; not transcribed)",
    r"test_2d_bucketing\.py::TestAsync2DTokenGenBucketing": "async-mode 2-D token-generation buckets (async_mode is "
                                                            "not transcribed)",
    r"test_autobucketing\.py::test_generate_buckets_for_chunked_prefill\w*": "chunked prefill (not transcribed)",
    r"test_autobucketing\.py::test_generate_buckets_on_chunk_size": "chunked prefill (not transcribed)",
    r"test_autobucketing\.py::test_generate_buckets_for_fused_spec": "fused speculation (not transcribed)",
    r"test_autobucketing\.py::test_generate_buckets_for_tkg_batch_bucketing\w*": "batch bucketing (not transcribed)",
    r"test_config\.py::test_(validate_chunked_attention_config|serialize_deserialize_inference_config_with_nested_"
    r"lora_config|serialize_deserialize_inference_config_with_nested_chunked_prefill_config|serialize_deserialize_"
    r"inference_config_with_fused_spec_config\w*|multi_modal_preloaded_pretrained_config|get_text_config_multi_modal|"
    r"serialize_deserialize_mllama_inference_config|get_draft_neuron_class|router_config\w*|serialize_deserialize_"
    r"moe_neuron_config\w*|valid_cp_dp_configurations|invalid_cp_tp_configuration|invalid_cp_dp_configuration|"
    r"inference_config_from_json_string_invalid_fused_spec_worker_cls)":
        "LoRA, chunked prefill/attention, fused speculation, multi-modal (mllama), MoE router and context/data "
        "parallel configs (not transcribed)",
    r"test_config\.py::TestGetPlatformLNC": "trn2 logical NeuronCores (the stand-in answers as inf2/trn1)",
    r"test_config\.py::test_neuron_config_lnc": "trn2 logical NeuronCores (the stand-in answers as inf2/trn1)",
}

# ------------------------------------------------------------------------------------------ stubs (children only)
STUB_ROOTS = ("torch_neuronx", "torch_xla", "neuronxcc", "libneuronxla", "nki", "neuronx_distributed")
OVERRIDES = {"torch_neuronx.utils": {"get_platform_target": lambda: "trn1"}}


class _StubMeta(type):
    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_stub_leaf") and len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # a stub used as a decorator (nki_jit, ...): keep the function
        return super().__call__(*args, **kwargs)

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__name__}.{name}")

    def __getitem__(cls, item):
        return cls

    def __iter__(cls):
        return iter(())

    def __or__(cls, other):
        return cls

    __ror__ = __or__


class _Stub(metaclass=_StubMeta):
    """An inert stand-in for anything a heavy import provides: callable, subclassable, attribute-rich."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # a decorator: keep the function
        return _Stub()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub()

    def __iter__(self):
        return iter(())

    def __mro_entries__(self, bases):
        return (_stub_class("base"),)


def _stub_class(name):
    return _StubMeta(name.rsplit(".", 1)[-1], (_Stub,), {"__qualname__": name, "_stub_leaf": True})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


def _as_stub(module):
    module.__class__ = _StubModule
    module.__dict__.setdefault("__path__", [])
    for k, v in OVERRIDES.get(module.__name__, {}).items():
        setattr(module, k, v)


class _Loader(importlib.abc.Loader):
    def __init__(self, file=None, package_dir=None):
        self.file, self.package_dir = file, package_dir

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if self.package_dir is not None:  # a package of the real source: its __init__ is not executed
            module.__path__ = [str(self.package_dir)]
            module.__class__ = _StubModule
            return
        if self.file is None:
            _as_stub(module)
            return
        try:
            code = compile(Path(self.file).read_text(), str(self.file), "exec")
            exec(code, module.__dict__)
        except Exception:  # noqa: BLE001 - a module that needs what is not here becomes a stub
            _as_stub(module)


class _HeavyFinder(importlib.abc.MetaPathFinder):
    """torch_neuronx, torch_xla, neuronxcc, ...: stubs; neuronx_distributed: its real pure-Python modules from
    NXD_SRC where they import, stubs elsewhere."""

    def __init__(self, nxd_src=None, extra_stubs=()):
        self.nxd = Path(nxd_src) / "src" if nxd_src else None
        self.extra = set(extra_stubs)

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".")[0]
        if fullname in self.extra:
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        if root not in STUB_ROOTS:
            return None
        if root == "neuronx_distributed" and self.nxd is not None:
            base = self.nxd.joinpath(*fullname.split("."))
            if base.is_dir():
                return importlib.machinery.ModuleSpec(fullname, _Loader(package_dir=base), is_package=True)
            if base.with_suffix(".py").is_file():
                return importlib.machinery.ModuleSpec(fullname, _Loader(file=base.with_suffix(".py")),
                                                      origin=str(base.with_suffix(".py")))
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


class _MissingNames(importlib.abc.MetaPathFinder):
    """Stand-in side of the pinned unit tests: a stand-in module gets a module-level ``__getattr__`` giving stubs
    for the names it does not transcribe (so a test file imports; the tests using them are out of scope), and a
    module the stand-in lacks becomes a stub."""

    def __init__(self, package):
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.package + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        inner = spec.loader

        class Wrapped(importlib.abc.Loader):
            def create_module(self, s):
                return inner.create_module(s)

            def exec_module(self, module):
                inner.exec_module(module)
                if "__getattr__" not in module.__dict__:
                    module.__getattr__ = lambda name: (_ for _ in ()).throw(AttributeError(name)) \
                        if name.startswith("__") else _stub_class(f"{fullname}.{name}")

        spec.loader = Wrapped()
        return spec


def install_stubs(side: str, nxd_src=None, package="neuronx_distributed_inference"):
    sys.meta_path.insert(0, _HeavyFinder(nxd_src))
    if side == "stand-in-tests":
        sys.meta_path.insert(0, _MissingNames(package))


# ------------------------------------------------------------------------------------------ probes
def _outcome(fn):
    try:
        value = fn()
    except BaseException as e:  # noqa: BLE001 - the exception is the outcome
        return {"raises": type(e).__name__, "message": str(e)[:300]}
    return {"value": _plain(value)}


def _plain(v):
    import enum

    import torch

    if isinstance(v, torch.Tensor):
        return {"tensor": v.tolist(), "dtype": str(v.dtype)}
    if isinstance(v, enum.Enum):
        return f"{type(v).__name__}.{v.name}"
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    if isinstance(v, torch.dtype):
        return str(v)
    return repr(type(v).__name__)


def probes_nxdi() -> dict:
    import copy
    import logging
    import warnings
    from types import SimpleNamespace

    import torch

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from neuronx_distributed_inference.models import config as cfg
    from neuronx_distributed_inference.models import model_wrapper as mw
    from neuronx_distributed_inference.modules import autobucketing as ab
    from neuronx_distributed_inference.modules.attention import gqa
    from neuronx_distributed_inference.modules.generation import sampling
    from neuronx_distributed_inference.utils import hf_adapter

    out = {}
    hf = dict(hidden_size=576, num_attention_heads=9, num_hidden_layers=2, num_key_value_heads=3, vocab_size=1000,
              pad_token_id=0, max_position_embeddings=2048, rope_theta=100000.0, rms_norm_eps=1e-5,
              hidden_act="silu")

    def icfg(**kw):
        return cfg.InferenceConfig(cfg.NeuronConfig(**kw), load_config=lambda self: self.__dict__.update(hf))

    for lo in (1, 2, 3, 100, 128, 129, 512):
        for hi in (1, 2, 100, 128, 200, 256, 300, 384, 1000, 2048, 4096):
            out[f"generate_buckets({lo},{hi})"] = _outcome(lambda: ab.generate_buckets(lo, hi))
    settings = [dict(seq_len=256), dict(seq_len=300, max_context_length=200), dict(seq_len=512, enable_bucketing=True),
                dict(seq_len=512, enable_bucketing=True, context_encoding_buckets=[64, 128],
                     token_generation_buckets=[256, 512], max_context_length=128),
                dict(seq_len=2048, enable_bucketing=True, max_context_length=1024),
                dict(seq_len=512, enable_bucketing=True, speculation_length=4),
                dict(seq_len=100, enable_bucketing=True)]
    for i, kw in enumerate(settings):
        for fn in ("generate_buckets_for_cte", "generate_buckets_for_tkg", "generate_buckets_for_speculation"):
            out[f"{fn}#{i}"] = _outcome(lambda: getattr(ab, fn)(icfg(**kw)))
    for a, b, c, d in [(1, 128, 1, 128), (16, 64, 0, 64), (8, 32, 8, 32), (16, 256, 16, 512)]:
        out[f"generate_2d_buckets_for_prefix_caching({a},{b},{c},{d})"] = _outcome(
            lambda: ab.generate_2d_buckets_for_prefix_caching(a, b, c, d, False))

    def wrapper(tag, **kw):
        w = mw.ModelWrapper(icfg(**kw), None, tag=tag)
        w.neuron_config.buckets = kw.get("_buckets", [128, 256, 512])
        return w

    for tag in (mw.CONTEXT_ENCODING_MODEL_TAG, mw.TOKEN_GENERATION_MODEL_TAG, mw.SPECULATION_MODEL_TAG):
        for trunc in (False, True):
            for spec in (0, 4):
                for n in (1, 100, 127, 128, 129, 255, 256, 508, 511, 512, 513, 700):
                    case = f"[{tag},trunc={trunc},spec={spec},n={n}]"

                    def run(what, tag=tag, trunc=trunc, spec=spec, n=n):
                        w = wrapper(tag, seq_len=512, max_context_length=512, allow_input_truncation=trunc,
                                    speculation_length=spec, enable_bucketing=True)
                        ids = torch.arange(n)[None]
                        args = (ids, torch.ones_like(ids), ids.clone(), torch.tensor([0]))
                        if what == "bucket":
                            return w.get_target_bucket(*args)
                        with warnings.catch_warnings(record=True) as seen:
                            warnings.simplefilter("always")
                            padded = w.pad_inputs(*args)
                        if what == "shapes":
                            return [tuple(a.shape) for a in padded[:3]]
                        return [str(x.message) for x in seen]
                    for what in ("bucket", "warnings", "shapes"):
                        out[f"pad_inputs {what}{case}"] = _outcome(lambda: run(what))
    for q, kv in [(9, 3), (32, 8), (8, 8), (12, 4), (6, 3)]:
        for tp in (1, 2, 3, 4, 8, 24, 32):
            out[f"gqa[{q},{kv},tp={tp}]"] = _outcome(lambda: [
                gqa.determine_sharding_strategy(tp, kv),
                gqa.get_shardable_head_counts(tp, q, kv, gqa.determine_sharding_strategy(tp, kv))])
    for bs in (1, 3):
        for tk, tp_, te in [(1, 1.0, 1.0), (50, 0.9, 0.7), ([1, 5, 7], [1.0, 0.5, 0.2], [1.0, 1.0, 2.0]), (-1, 1.0, 1.0)]:
            out[f"prepare_sampling_params[{bs},{tk},{tp_},{te}]"] = _outcome(
                lambda: sampling.prepare_sampling_params(bs, top_k=tk, top_p=tp_, temperature=te))
    for params in ([[1, 1.0, 1.0]], [[0, 1.0, 1.0]], [[-1, 0.5, 1.0]], [[5, 1.5, 1.0]], [[5, 0.5, 0.0]],
                   [[5, 0.5, -1.0]], [[2000, 1.0, 1.0]]):
        for ods in (None, dict(top_k=1), dict(top_k=50, dynamic=True), dict(top_k=1, dynamic=True)):
            out[f"validate_sampling_params[{params},{ods}]"] = _outcome(lambda: sampling.validate_sampling_params(
                torch.tensor(params, dtype=torch.float32), None if ods is None else cfg.OnDeviceSamplingConfig(**ods)))
        out[f"infer_sampling_params[{params}]"] = _outcome(
            lambda: sampling.infer_sampling_params(torch.tensor(params, dtype=torch.float32)))
    neuron_configs = [
        {}, dict(batch_size=2, seq_len=256), dict(tp_degree=3), dict(torch_dtype="float16"),
        dict(torch_dtype="int8"), dict(quantized=True), dict(quantized=True, quantized_checkpoints_path="q"),
        dict(quantized=True, quantized_checkpoints_path="q", quantization_dtype="f8e4m3fn_x4"),
        dict(quantized=True, quantized_checkpoints_path="q", quantization_dtype="int4"),
        dict(quantized=True, quantized_checkpoints_path="q", quantization_dtype="f8e5m2"),
        dict(activation_quantization_type="dynamic"), dict(activation_quantization_type="STATIC"),
        dict(activation_quantization_type="static", fused_qkv=True), dict(kv_cache_quant=True),
        dict(kv_quant_config={"quant_dtype": torch.float8_e5m2}),
        dict(kv_quant_config={"direct_cast": True, "k_quant_method": "per_tensor_symmetric"}),
        dict(tensor_capture_config=["layers.0"]), dict(tensor_replacement_config="x"),
        dict(speculation_length=4, batch_size=2), dict(padding_side="left"), dict(cast_type="nope"),
        dict(is_prefix_caching=True), dict(is_prefix_caching=True, is_block_kv_layout=True),
        dict(enable_bucketing=True, context_encoding_buckets=[64, 128], max_context_length=128, seq_len=256),
        dict(is_continuous_batching=True, batch_size=4, ctx_batch_size=1), dict(max_context_length=512, seq_len=256),
        dict(on_device_sampling_config={"top_k": 5}), dict(attention_dtype="float16", torch_dtype="bfloat16"),
    ]
    skip = {"_record_calls"}
    for i, kw in enumerate(neuron_configs):
        def make(kw=kw):
            nc = cfg.NeuronConfig(**copy.deepcopy(kw))
            return {k: v for k, v in sorted(cfg.to_dict(nc).items()) if k not in skip}
        out[f"NeuronConfig#{i}({sorted(kw)})"] = _outcome(make)

        def roundtrip(kw=kw):
            with tempfile.TemporaryDirectory() as d:
                c = icfg(**copy.deepcopy(kw))
                c.save(d)
                back = cfg.InferenceConfig.load(d)
                return back.to_json_string() == c.to_json_string()
        out[f"InferenceConfig.save/load#{i}({sorted(kw)})"] = _outcome(roundtrip)

    for populated in (False, True):
        for with_global in (False, True):
            def prep(populated=populated, with_global=with_global):
                if with_global:
                    hf_adapter.tensor_capture_hook = None
                elif hasattr(hf_adapter, "tensor_capture_hook"):
                    del hf_adapter.tensor_capture_hook
                me = SimpleNamespace(
                    neuron_model=SimpleNamespace(kv_cache_populated=populated, get_required_kwargs=lambda: []),
                    input_start_offsets=None, neuron_config=SimpleNamespace(tensor_replacement_config=None))
                ids = torch.tensor([[5, 6, 7, 0], [1, 2, 3, 4]])
                mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
                r = hf_adapter.HuggingFaceGenerationAdapter.prepare_inputs_for_generation(
                    me, ids, attention_mask=mask, sampling_params=None)
                return {k: v for k, v in r.items()}
            out[f"prepare_inputs_for_generation[populated={populated},global={with_global}]"] = _outcome(prep)
    _nxdi_routing_probes(out, hf)
    return out


# neuronx-distributed's NxDModel (trace/spmd.py) cannot be scripted whole without Neuron; its ``router`` can: the
# pinned side scripts a module holding the pinned method's text (read from NXD_SRC), as ModelBuilder scripts NxDModel.
_PINNED_ROUTER = """import torch
from typing import Dict, List, Tuple


class PinnedNxDModelRouter(torch.nn.Module):
    input_shape_map: Dict[str, Tuple[str, int]]

    def __init__(self, input_shape_map: Dict[str, Tuple[str, int]]):
        super().__init__()
        self.input_shape_map = input_shape_map

    {router}

    def forward(self, inputs: List[torch.Tensor]) -> Tuple[str, int]:
        model_name, bucket_idx = self.router(inputs)
        return model_name, bucket_idx
"""


def _pinned_router_class():
    import ast

    path = Path(os.environ["NXD_SRC"]) / "src" / "neuronx_distributed" / "trace" / "spmd.py"
    text = path.read_text()
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "NxDModel")
    router = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "router")
    d = Path(tempfile.mkdtemp(prefix="fidelity-router-"))
    (d / "pinned_nxd_router.py").write_text(_PINNED_ROUTER.format(router=ast.get_source_segment(text, router)))
    spec = importlib.util.spec_from_file_location("pinned_nxd_router", d / "pinned_nxd_router.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a file: TorchScript reads the method's source from it
    return module.PinnedNxDModelRouter


def _jit_outcome(fn):
    """_outcome, with a TorchScript error reduced to its last line (the raised Python error; the lines above it are
    the TorchScript traceback, with file paths)."""
    r = _outcome(fn)
    if r.get("raises") == "Error":
        import torch

        try:
            fn()
        except torch.jit.Error as e:
            r = {"raises": "torch.jit.Error", "message": str(e).strip().splitlines()[-1][:600]}
    return r


def _nxdi_routing_probes(out, hf):
    """Which inputs reach the compiled graphs, and their shapes against the traced ones: ModelWrapper.input_generator
    (the example inputs, one per bucket), ModelBuilder's input_shape_map, NxDModel.router, and
    NeuronBaseForCausalLM.forward down to the graph call (default sampling params, _process_args, pad_inputs, the
    batch's slices or padding). The graph returns zero logits [rows, 1, 8]; the probes compare the logits' shape or
    the error."""
    import copy
    from types import SimpleNamespace

    import torch

    from neuronx_distributed_inference.models import config as cfg
    from neuronx_distributed_inference.models import model_base as mb
    from neuronx_distributed_inference.models import model_wrapper as mw
    from neuronx_distributed_inference.modules import autobucketing as ab
    from neuronx_distributed_inference.modules.generation.sampling import prepare_sampling_params

    pinned = Path(mw.__file__).resolve().is_relative_to(Path(os.environ.get("NXDI_SRC", "/nonexistent")).resolve())
    if pinned:
        router_cls = _pinned_router_class()

        class Executor(torch.jit.ScriptModule):  # NxDModelExecutor: the graph call, routed, then zero logits
            def __init__(self, nxd_model):
                super().__init__()
                self.nxd_model = nxd_model

            def forward(self, *inputs):
                self.nxd_model(list(inputs))
                return torch.zeros(inputs[0].shape[0], 1, 8)

        def traced(shape_map):
            return Executor(torch.jit.script(router_cls(shape_map)))
    else:
        from neuronx_distributed_inference.models.application_base import _TracedModel

        def traced(shape_map):
            return torch.jit.script(_TracedModel("{}", shape_map))

    class Runtime:  # the stand-in's engine, faked: zero logits for the rows it is given
        def __init__(self, continuous_batching):
            self.continuous_batching = continuous_batching

        def _check_seq_ids(self, seq_ids):
            return [int(s) for s in seq_ids.reshape(-1)]

        def context_encoding(self, input_ids, *rest):
            return torch.zeros(input_ids.shape[0], 1, 8)

        token_generation = speculation = context_encoding

    extra = dict(hf, output_attentions=False, output_hidden_states=False, use_return_dict=True)

    def build(kw):
        config = cfg.InferenceConfig(cfg.NeuronConfig(**copy.deepcopy(kw)), load_config=lambda self: self.__dict__.update(extra))
        nc = config.neuron_config
        wrappers = {}
        plan = [(mw.CONTEXT_ENCODING_MODEL_TAG, nc.ctx_batch_size, nc.max_context_length, True, True,
                 ab.generate_buckets_for_cte)]
        if nc.speculation_length > 0:
            plan.append((mw.SPECULATION_MODEL_TAG, nc.spec_batch_size, nc.speculation_length, False, False,
                         ab.generate_buckets_for_speculation))
        else:
            plan.append((mw.TOKEN_GENERATION_MODEL_TAG, nc.tkg_batch_size, 1, False, False,
                         ab.generate_buckets_for_tkg))
        for tag, batch, active, bucket_active, prefill, buckets in plan:  # model_base.py enable_*
            new = copy.deepcopy(config)
            new.neuron_config.batch_size = batch
            new.neuron_config.n_active_tokens = active
            new.neuron_config.bucket_n_active_tokens = bucket_active
            new.neuron_config.is_prefill_stage = prefill
            if not prefill:
                new.neuron_config.sequence_parallel_enabled = False
            new.neuron_config.buckets = buckets(new)
            wrappers[tag] = mw.ModelWrapper(new, None, tag=tag)
        shape_map = {}  # neuronx-distributed trace/model_builder.py, as ModelBuilder builds it
        for w in wrappers.values():
            for i, example_input in enumerate(w.input_generator()):
                shape_map[str([list(t.shape) for t in example_input])] = (w.tag, i)
        model = traced(shape_map)
        me = mb.NeuronBaseForCausalLM.__new__(mb.NeuronBaseForCausalLM)
        torch.nn.Module.__init__(me)
        me.config, me.neuron_config, me.text_config = config, nc, config
        me.on_device_sampling, me.async_mode, me.kv_cache_populated, me.prior_seq_ids = False, False, False, None
        me.sampler, me.padding_side, me.models = None, nc.padding_side, []
        me.default_sampling_params = prepare_sampling_params(batch_size=nc.batch_size, top_k=[1], top_p=[1.0],
                                                             temperature=[1.0])
        app = SimpleNamespace(_runtime=Runtime(nc.is_continuous_batching))
        for tag, w in wrappers.items():
            w.model = model
            w._application = [app]
            setattr(me, tag, w)
        return me, shape_map

    configs = {
        "batch 1": dict(seq_len=256, max_context_length=128, enable_bucketing=True),
        "batch 2": dict(seq_len=256, max_context_length=128, enable_bucketing=True, batch_size=2),
        "continuous batching 2, ctx 1": dict(seq_len=256, max_context_length=128, enable_bucketing=True,
                                             is_continuous_batching=True, batch_size=2, ctx_batch_size=1,
                                             tkg_batch_size=2, max_batch_size=2),
        "speculation 4": dict(seq_len=256, max_context_length=128, enable_bucketing=True, speculation_length=4),
    }
    for name, kw in configs.items():
        built = _outcome(lambda: build(kw))
        if "raises" in built:
            out[f"routing[{name}] build"] = built
            continue
        me, shape_map = build(kw)
        out[f"routing[{name}] input_shape_map"] = _outcome(lambda: list(shape_map.items()))
        bs = me.neuron_config.batch_size
        for rows in (1, 2, 3):
            for sp in ("none", "rows", "batch_size"):
                params = {"none": None, "rows": prepare_sampling_params(rows),
                          "batch_size": prepare_sampling_params(bs)}[sp]
                for phase, (n, start) in {"context": (5, 0), "token": (1, 5), "speculation": (4, 5)}.items():
                    def call(rows=rows, params=params, n=n, start=start, me=me):
                        me.reset()
                        pos = torch.arange(start, start + n).expand(rows, n)
                        return list(me(input_ids=torch.full((rows, n), 7), position_ids=pos,
                                       attention_mask=torch.ones(rows, start + n, dtype=torch.long),
                                       seq_ids=torch.arange(rows), sampling_params=params).logits.shape)
                    out[f"routing[{name}] {phase} rows={rows} sampling_params={sp}"] = _jit_outcome(call)


def _tnx_fn(side: str, name: str):
    """A tnx function by name: the stand-in's module function, or the pinned definition (nested or a method)."""
    import ast

    if side == "stand-in":
        import transformers_neuronx.base as base
        return getattr(base, name)
    src = Path(os.environ["TNX_SRC"]) / "src" / "transformers_neuronx"
    file, qual = {"_sanity_check": ("module.py", "PretrainedModel.from_pretrained._sanity_check"),
                  "check_gqa_fallback": ("decoder.py", "DecoderLmHeadForSamplingNoEmbedding.check_gqa_fallback")}[name]
    tree = ast.parse((src / file).read_text())
    node = tree
    for part in qual.split("."):
        node = next(n for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
    import warnings

    import transformers_neuronx.constants as constants
    import transformers_neuronx.utils as utils
    scope = {"constants": constants, "utils": utils, "warnings": warnings}
    exec(compile(ast.Module([node], []), str(src / file), "exec"), scope)
    return scope[name]


def probes_tnx(side: str) -> dict:
    import itertools
    import warnings

    import torch

    warnings.simplefilter("ignore")
    from transformers_neuronx import bucket
    from transformers_neuronx.config import ContinuousBatchingConfig, GenerationConfig, NeuronConfig, QuantizationConfig
    from transformers_neuronx.constants import GQA, Layout

    out = {}
    for n in (1, 64, 128, 129, 200, 256, 300, 2048, [128, 512], [512, 128, 256], [100]):
        out[f"token_sizes({n})"] = _outcome(lambda: bucket.token_sizes(n))
        for c in (None, 0, 64, 128, 200, 1024, [64, 128], [128, 64]):
            out[f"context_sizes({c},{n})"] = _outcome(lambda: bucket.context_sizes(c, bucket.token_sizes(n)))
    for b in ([128, 256, 512], [64]):
        for length in (1, 64, 65, 128, 129, 256, 512, 600):
            out[f"find({b},{length})"] = _outcome(lambda: bucket.find(b, length))
    sanity = _tnx_fn(side, "_sanity_check")
    for kw in [dict(), dict(n_positions=128, context_length_estimate=256), dict(n_positions=[128, 512],
               context_length_estimate=[256]), dict(neuron_config=NeuronConfig(cache_layout=Layout.BSH)),
               dict(batch_size=2, neuron_config=NeuronConfig(continuous_batching=ContinuousBatchingConfig(
                   batch_size_for_shared_caches=2), cache_layout=Layout.BSH), n_positions=[256, 512],
                   context_length_estimate=[128]),
               dict(batch_size=2, neuron_config=NeuronConfig(continuous_batching=ContinuousBatchingConfig(
                   batch_size_for_shared_caches=2), cache_layout=Layout.BSH), n_positions=[512],
                   context_length_estimate=[128]),
               dict(batch_size=4, neuron_config=NeuronConfig(continuous_batching=ContinuousBatchingConfig(
                   batch_size_for_shared_caches=2)))]:
        out[f"_sanity_check({sorted(kw)},{kw.get('n_positions')},{kw.get('batch_size')})"] = _outcome(
            lambda: sanity(**kw))
    out["Layout hash"] = _outcome(lambda: hash(Layout.BSH) is not None)
    out["Layout == str"] = _outcome(lambda: [Layout.BSH == "BSH", Layout.SBH == Layout.HSB])
    fallback = _tnx_fn(side, "check_gqa_fallback")
    for gqa, (q, kv), tp, bs in itertools.product([None, GQA.SHARD_OVER_HEADS, GQA.SHARD_OVER_BATCH,
                                                     GQA.REPLICATED_HEADS, GQA.ALL_GATHER_HEADS],
                                                    [(9, 3), (32, 8), (8, 8), (12, 1)], (1, 2, 3, 4, 8), ([1], [2, 4])):
        def run(gqa=gqa, q=q, kv=kv, tp=tp, bs=bs):
            nc = NeuronConfig(group_query_attention=gqa)
            if side == "pinned":  # a method reading the decoder's attributes
                me = type("Decoder", (), {})()
                me.neuron_config, me.tp_degree, me.batch_size = nc, tp, bs
                me.n_head, me.n_kv_head, me.attention_head_size = q, kv, 64
                fallback(me)
            else:
                fallback(nc, q, kv, 64, tp, bs)
            return nc.group_query_attention
        out[f"check_gqa_fallback[{gqa},{q},{kv},tp={tp},bs={bs}]"] = _outcome(run)
    for kw in [dict(), dict(quant_dtype="s8", dequant_dtype="f16"), dict(quant_dtype="u8"),
               dict(quantize_method="per_tensor"), dict(quant_dtype="s8", quantize_method="direct_cast"),
               dict(quant_dtype="f8e4m3fn", quantize_method="direct_cast")]:
        out[f"QuantizationConfig({kw})"] = _outcome(lambda: vars(QuantizationConfig(**kw)))
    for kw in [dict(), dict(fuse_qkv=True), dict(padding_side="right"), dict(on_device_embedding=True),
               dict(attention_layout="BSH"), dict(group_query_attention="shard-over-heads"),
               dict(continuous_batching=ContinuousBatchingConfig(batch_size_for_shared_caches=2))]:
        out[f"NeuronConfig({sorted(kw)})"] = _outcome(lambda: sorted(k for k, v in vars(NeuronConfig(**kw)).items()))
    for kw in [dict(), dict(top_k=1), dict(top_k=5, top_p=0.9, temperature=0.7, do_sample=True),
               dict(max_length=10, eos_token_id=[2, 3])]:
        out[f"GenerationConfig({kw})"] = _outcome(lambda: {k: _plain(v) for k, v in vars(GenerationConfig(**kw)).items()})
    from transformers_neuronx import speculation

    for seed in range(4):
        def accept(seed=seed):
            torch.manual_seed(seed)
            k, V = 4, 11
            draft_ids = torch.randint(0, V, (1, k))
            draft = torch.randn(k, 1, V)
            target = torch.randn(k + 1, 1, V)
            torch.manual_seed(100 + seed)
            return speculation.DefaultTokenAcceptor()(draft_ids, draft, target)
        out[f"DefaultTokenAcceptor#{seed}"] = _outcome(accept)
    _tnx_loop_probes(out)
    _tnx_batch_probes(out, side)
    return out


def _tnx_batch_probes(out, side):
    """A forward() whose batch size (or, token by token, position) reaches a graph lookup: the pinned side runs
    base.py NeuronModelBase._forward / context / decode and decoder.py DecoderLmHeadForSamplingNoEmbedding.forward /
    forward_single with DecoderProgram.find_bucket_id and DecoderProgramFullyUnrolled.execute on fake graphs (dicts
    of the compiled (bucket, batch size) pairs); the stand-in side runs NeuronModelBase._check_compiled_batch.
    Outcome: "ok" or the lookup's error. Prompt lengths are context buckets or longer than the largest (the padding
    of _prepare_for_par_ctx_rhs_padding is not run here)."""
    import itertools
    from types import SimpleNamespace

    import torch

    from transformers_neuronx import base
    from transformers_neuronx.config import NeuronConfig

    vocab = 8

    def graph(hidden, cache_ids, start_ids, *rest):
        return torch.zeros(vocab, hidden.shape[1], start_ids.shape[0])

    for ctx, batches, (batch, length, first) in itertools.product(
            ([64, 128], [4], []), ([1], [2], [1, 2]),
            [(b, n, 0) for b in (1, 2, 3) for n in (4, 6, 64, 128, 200)] + [(b, 1, p) for b in (1, 2, 3)
                                                                            for p in (5, 127, 128, 200)]):
        if length > 1 and ctx and length < min(ctx):
            continue  # the caller pads up to the bucket first
        tokens = [128, 256]

        def run(ctx=ctx, batches=batches, batch=batch, length=length, first=first):
            if side == "stand-in":
                me = SimpleNamespace(context_buckets=ctx, context_batch_sizes=batches, batch_sizes=batches,
                                     token_buckets=tokens, unroll=2, layers_after_partition=[0, 1])
                base.NeuronModelBase._check_compiled_batch(me, batch, length, first)
                return "ok"
            from transformers_neuronx import decoder

            class Program:
                find_bucket_id = decoder.DecoderProgram.find_bucket_id
                execute = decoder.DecoderProgramFullyUnrolled.execute
                debug_tensors_to_host = decoder.DecoderProgram.debug_tensors_to_host

            program = Program()
            program.n_positions_list = tokens
            program.executors = {(n, b): (lambda inputs, ranks: graph(*inputs)) for n in tokens for b in batches}

            class TokenDecoder:
                forward = decoder.DecoderLmHeadForSamplingNoEmbedding.forward
                forward_single = decoder.DecoderLmHeadForSamplingNoEmbedding.forward_single
                __call__ = forward

            dec = TokenDecoder()
            dec.neuron_config, dec.inputs_sdim, dec.program = NeuronConfig(), (1, 0, None, None), program
            dec.use_executor, dec.return_ranks, dec.n_active_tokens = True, -1, 1

            class Model:
                _forward = base.NeuronModelBase._forward
                context = base.NeuronModelBase.context
                decode = base.NeuronModelBase.decode
                _cast_logits = base.NeuronModelBase._cast_logits

            me = Model()
            me.neuron_config, me.is_fid, me.config = NeuronConfig(), False, SimpleNamespace(vocab_size=vocab)
            me.context_buckets, me.decoder_lm_head = ctx, dec
            me.decoder_lm_head_for_context = {(e, b): graph for e in ctx for b in batches}
            cache_ids = torch.arange(first, first + length, dtype=torch.int32)
            me._forward(torch.zeros(batch, length, 4), cache_ids, torch.zeros(batch, dtype=torch.int32),
                        torch.as_tensor([length - 1]))
            return "ok"
        out[f"forward batch lookup[context_buckets={ctx},batch_sizes={batches},batch={batch},tokens={length},"
            f"first={first}]"] = _outcome(run)


# ------------------------------------------------------------------------------------------ tnx loop probes
class _FakeLM:
    """A deterministic stand-in "model" for the pinned loops (sampling.py, speculation.py).

    The scores after token t at KV-cache position p are a fixed mix of N(0, 9) draws seeded by (salt, t, p), so a
    draft (two salts) is close to its target (one). Token 0, the pad id, is never proposed (-inf: an accepted 0
    would stall the pinned speculation loop, which counts accepted tokens with count_nonzero); tokens 2 and 3, the
    probes' EOS ids, are rare (-6) except where ``boost[(row, p + 1)] = token`` pushes a token (+30) to be the one
    at position p + 1 of that row (EOS inside a speculation window, at different steps per row). It answers what
    the loops call: ``model(input_ids, cache_ids, start_ids)`` -> [batch, vocab] (the last real position of each
    row), ``speculative_forward(...)`` -> [k, vocab, batch], attributes ``neuron_config`` and ``context_hook``;
    with ``emit_tokens`` it returns the argmax token [batch, 1] (on-device generation), with ``log_softmax`` a
    (scores, log_softmax) pair. Every call is logged; more than ``MAX_CALLS`` raise (a loop that never ends)."""

    MAX_CALLS = 300

    def __init__(self, vocab=24, salts=((1, 1.0),), boost=None, neuron_config=None, emit_tokens=False,
                 log_softmax=False):
        self.vocab, self.salts, self.boost = vocab, salts, dict(boost or {})
        self.neuron_config, self.emit_tokens, self.log_softmax = neuron_config, emit_tokens, log_softmax
        self.context_hook = None
        self.calls = []

    def _scores(self, row, token, pos):
        import torch

        s = torch.zeros(self.vocab)
        for salt, weight in self.salts:
            g = torch.Generator().manual_seed(salt * 1_000_003 + int(token) * 10_007 + int(pos) * 101)
            s += weight * 3 * torch.randn(self.vocab, generator=g)
        s[0] = -float("inf")
        s[2:4] -= 6.0  # the EOS ids of the probes come mostly where boosted
        if (row, int(pos) + 1) in self.boost:
            s[self.boost[row, int(pos) + 1]] += 30.0
        return s

    @staticmethod
    def _list(t):
        return None if t is None else t.tolist()

    def _log(self, *entry):
        if len(self.calls) >= self.MAX_CALLS:
            raise RuntimeError("fake model: too many calls (the loop does not end)")
        self.calls.append(list(entry))

    def __call__(self, input_ids, cache_ids=None, start_ids=None):
        import torch

        self._log("call", input_ids.tolist(), self._list(cache_ids), self._list(start_ids))
        rows, n = [], input_ids.shape[1]
        for b in range(input_ids.shape[0]):
            pos = torch.arange(n) if cache_ids is None else \
                (cache_ids[b] if cache_ids.dim() == 2 else cache_ids).flatten()
            if pos.numel() == n:  # the last real token (a right-padded row has positions arange * mask)
                j = int(torch.argmax(pos))
                rows.append(self._scores(b, input_ids[b, j], pos[j]))
            else:
                rows.append(self._scores(b, input_ids[b, -1], pos.max()))
        scores = torch.stack(rows)
        if self.emit_tokens:
            return torch.argmax(scores, dim=1, keepdim=True)
        if self.log_softmax:
            return scores, torch.log_softmax(scores, dim=-1)
        return scores

    forward = __call__

    def speculative_forward(self, input_ids, cache_ids=None, start_ids=None, speculation_length=None):
        import torch

        self._log("speculative_forward", input_ids.tolist(), self._list(cache_ids), self._list(start_ids),
                  speculation_length)
        batch, k = input_ids.shape
        out = torch.zeros(k, self.vocab, batch)
        for b in range(batch):
            pos = cache_ids[b] if cache_ids.dim() == 2 else cache_ids
            for j in range(k):
                out[j, :, b] = self._scores(b, input_ids[b, j], pos[j])
        return out


class _Streamer:
    def __init__(self, response_with_prefix=None):
        self.log = []
        if response_with_prefix is not None:
            self.response_with_prefix = response_with_prefix

    def put(self, value):
        self.log.append(["put", value.tolist()])

    def end(self):
        self.log.append("end")


class _StopAfter:
    """A stopping criterion that logs the ids and the shape of the scores it is given; True from its n-th call."""

    def __init__(self, n):
        self.n, self.log = n, []

    def __call__(self, input_ids, scores, **kwargs):
        self.log.append([input_ids.tolist(), list(scores.shape)])
        return len(self.log) >= self.n


def _loop_outcome(run, model=None, streamer=None, stops=(), scores=None):
    """Run one loop under a fixed seed: its result with everything the loop showed the outside world."""
    import torch

    def go():
        result = run()
        seen = {"result": _plain(result), "rng_after": torch.randint(0, 2 ** 30, (1,)).item()}
        if model is not None:
            seen["model_calls"] = model.calls
        if streamer is not None:
            seen["streamer"] = streamer.log
        for i, s in enumerate(stops):
            seen[f"stopping_criteria_{i}"] = s.log
        if scores is not None:
            seen["scores_after"] = _plain(scores)  # the loops divide / mask the caller's scores in place
        return seen
    return _outcome(go)


def _tnx_loop_probes(out):
    """sampling.py's loops and filters, speculation.py's acceptors, draft provider and SpeculativeGenerator, on
    _FakeLM; each run under torch.manual_seed so both sides draw the same random numbers."""
    import itertools
    from types import SimpleNamespace

    import torch

    from transformers_neuronx import sampling, speculation
    from transformers_neuronx.stopping_criteria import MaxTimeCriteria, StoppingCriteriaList

    prompts = {1: [[5, 9, 3]], 2: [[5, 9, 3], [7, 1, 4]], 3: [[5, 9, 3], [7, 1, 4], [11, 12, 13]]}
    eos_cases = {"none": {}, "row0@5": {(0, 5): 2}, "row1@4,row0@7": {(1, 4): 2, (0, 7): 2},
                 "list[2,3],row0@4=3": {(0, 4): 3}}
    decodings = {"greedy": dict(top_k=1), "default": dict(), "k5p0.9t0.7": dict(top_k=5, top_p=0.9, temperature=0.7),
                 "p0.5": dict(top_k=None, top_p=0.5), "k1t2.0": dict(top_k=1, temperature=2.0)}
    nc = SimpleNamespace(use_2d_cache_ids=False, log_softmax_scores=False)

    # sample_llama -> sample_loop_llama: top-k/top-p/temperature, EOS per row, streamer, batch 1..3, seeds
    for seed, batch, (dname, dec), (ename, boost) in itertools.product(
            (0, 1), (1, 2, 3), decodings.items(), eos_cases.items()):
        def run(seed=seed, batch=batch, dec=dec, ename=ename, boost=boost):
            model, streamer = _FakeLM(boost=boost, neuron_config=nc), _Streamer()
            eos = [2, 3] if ename.startswith("list") else 2
            torch.manual_seed(seed)
            return _loop_outcome(lambda: sampling.sample_llama(
                model, torch.tensor(prompts[batch]), None, 10, eos_token_id=eos, streamer=streamer, **dec),
                model, streamer)
        out[f"sample_llama[seed={seed},batch={batch},{dname},eos={ename}]"] = run()

    def llama_case(name, batch=1, seq=10, boost=None, stop=None, prefix=None, model_kw=None, **kw):
        def run():
            model = _FakeLM(boost=boost, **(model_kw or dict(neuron_config=nc)))
            streamer = _Streamer(prefix)
            stops = [] if stop is None else [_StopAfter(stop)]
            if stop is not None:
                kw["stopping_criteria_list"] = StoppingCriteriaList(stops)
            torch.manual_seed(0)
            return _loop_outcome(lambda: sampling.sample_llama(model, torch.tensor(prompts[batch]), kw.pop(
                "start_ids", None), seq, streamer=streamer, **kw), model, streamer, stops)
        out[f"sample_llama[{name}]"] = run()

    # stopping criteria get the prompt ids (transformers-neuronx#75) and the step's top-k probabilities
    llama_case("stop after 1", stop=1, top_k=5)
    llama_case("stop after 3,batch=2", batch=2, stop=3)
    llama_case("stop after 3,batch=2,eos row1@4", batch=2, stop=3, top_k=1, boost={(1, 4): 2})
    llama_case("MaxTimeCriteria(-1)", stopping_criteria_list=StoppingCriteriaList([MaxTimeCriteria(-1.0)]))
    llama_case("MaxTimeCriteria(1e9)", stopping_criteria_list=StoppingCriteriaList([MaxTimeCriteria(1e9)]))
    llama_case("stopping_criteria_list=[]", stopping_criteria_list=[])
    llama_case("response_with_prefix", batch=2, prefix=True, boost={(0, 5): 2})
    llama_case("response_with_prefix=False", prefix=False)
    llama_case("no_repeat_ngram_size=2", batch=2, top_k=1, no_repeat_ngram_size=2, seq=14)
    llama_case("no_repeat_ngram_size=1", top_k=1, no_repeat_ngram_size=1)
    llama_case("seq=3 (=prompt)", seq=3)
    llama_case("seq=2 (<prompt)", seq=2)
    llama_case("seq=4", seq=4, top_k=1)
    llama_case("start_ids", batch=2, start_ids=torch.tensor([0, 1]), top_k=1)
    llama_case("cache_ids 1-D", cache_ids=torch.tensor([4, 5, 6]), top_k=1)
    llama_case("cache_ids 2-D", batch=2, cache_ids=torch.tensor([[0, 1, 2], [0, 1, 2]]), top_k=1,
               model_kw=dict(neuron_config=SimpleNamespace(use_2d_cache_ids=True)))
    llama_case("cache_ids 2-D, use_2d_cache_ids=False", batch=2, cache_ids=torch.tensor([[0, 1, 2], [0, 1, 2]]),
               top_k=1)
    for bad in (dict(temperature=1), dict(temperature=0.0), dict(top_p=1), dict(top_p=0.0), dict(top_k=0),
                dict(top_k=2.0), dict(top_k=None, top_p=None), dict(no_repeat_ngram_size=-1),
                dict(eos_token_id=None), dict(eos_token_id=[])):
        llama_case(f"{bad}", **bad)

    def hooked():
        model, seen = _FakeLM(neuron_config=nc), []
        model.context_hook = lambda: seen.append(len(model.calls))
        torch.manual_seed(0)
        return _loop_outcome(lambda: [sampling.sample_llama(model, torch.tensor(prompts[1]), None, 6, top_k=1), seen],
                             model)
    out["sample_llama[context_hook]"] = hooked()

    # sample_loop_llama directly: the caller's scores are divided in place by the temperature
    for temperature in (1.0, 0.5):
        def direct(temperature=temperature):
            model = _FakeLM(neuron_config=nc)
            scores = model(torch.tensor(prompts[2]))
            torch.manual_seed(3)
            return _loop_outcome(lambda: sampling.sample_loop_llama(
                model, torch.tensor(prompts[2]), None, scores, 7, eos_token_id=2, top_k=4, temperature=temperature),
                model, scores=scores)
        out[f"sample_loop_llama[temperature={temperature}]"] = direct()

    # the older loop (simple_sample -> sample_loop): EOS is never sampled, `if cache_ids:` on a tensor
    for seed, batch, top_k, boost in itertools.product((0, 1), (1, 2), (1, 5, 20), ({}, {(0, 5): 2})):
        def old(seed=seed, batch=batch, top_k=top_k, boost=boost):
            model, streamer = _FakeLM(boost=boost), _Streamer()
            torch.manual_seed(seed)
            return _loop_outcome(lambda: sampling.simple_sample(
                model, torch.tensor(prompts[batch]), None, 9, eos_token_id=2, top_k=top_k, streamer=streamer),
                model, streamer)
        out[f"simple_sample[seed={seed},batch={batch},top_k={top_k},boost={sorted(boost)}]"] = old()
    for name, kw in {"output_scores": dict(output_scores=True), "cache_ids=[0]": dict(cache_ids=torch.tensor([0])),
                     "cache_ids=[4]": dict(cache_ids=torch.tensor([4])), "seq=3": dict(sequence_length=3),
                     "log_softmax_scores": dict(output_scores=True, neuron_config=SimpleNamespace(
                         log_softmax_scores=True), log_softmax_scores="first"),
                     "top_k>vocab": dict(top_k=30)}.items():
        def loop(kw=kw):
            model = _FakeLM(log_softmax="log_softmax_scores" in kw)
            scores = model(torch.tensor(prompts[2]))
            if model.log_softmax:
                scores = scores[0]
            kw = dict(dict(sequence_length=8, eos_token_id=2, top_k=3), **kw)
            torch.manual_seed(0)
            return _loop_outcome(lambda: sampling.sample_loop(model, torch.tensor(prompts[2]), None, scores, **kw),
                                 model, scores=scores)
        out[f"sample_loop[{name}]"] = loop()

    # sample_greedy, and sample_tokens (on-device generation: the model returns tokens)
    for batch in (1, 2):
        def greedy(batch=batch):
            model = _FakeLM(boost={(0, 5): 2})
            torch.manual_seed(0)
            return _loop_outcome(lambda: sampling.sample_greedy(model, torch.tensor(prompts[batch]), None, 8), model)
        out[f"sample_greedy[batch={batch}]"] = greedy()
        for eos in (None, 2, [2, 3]):
            def tokens(batch=batch, eos=eos):
                from transformers_neuronx.config import GenerationConfig
                model = _FakeLM(boost={(batch - 1, 5): 2, (0, 7): 3}, emit_tokens=True, neuron_config=nc)
                streamer = _Streamer()
                torch.manual_seed(0)
                return _loop_outcome(lambda: sampling.sample_tokens(
                    model, torch.tensor(prompts[batch]), None, sequence_length=9,
                    config=GenerationConfig(eos_token_id=eos), streamer=streamer), model, streamer)
            out[f"sample_tokens[batch={batch},eos={eos}]"] = tokens()

    # the filters the loops use, on generated scores
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(3, 12, generator=g) * 2
    for top_k, top_p, keep in itertools.product((None, 1, 3, 20), (None, 0.3, 0.9, 1.0), (1, 2, 13)):
        out[f"top_k_top_p_filtering[{top_k},{top_p},{keep}]"] = _outcome(
            lambda: sampling.top_k_top_p_filtering(scores.clone(), top_k, top_p, keep))
    for bad in ((0, None, 1), (None, 1.5, 1), (None, 1, 1), (2, 0.5, -1), ("3", None, 1)):
        out[f"top_k_top_p_filtering{bad}"] = _outcome(lambda: sampling.top_k_top_p_filtering(scores.clone(), *bad))
    for seed, (top_k, top_p, temperature) in itertools.product((0, 1), ((1, 1.0, 1.0), (4, 0.8, 1.0),
                                                                         (None, 0.6, 0.5))):
        def select(seed=seed, top_k=top_k, top_p=top_p, temperature=temperature):
            torch.manual_seed(seed)
            return [sampling.select_tokens(scores.clone(), top_k, top_p, temperature),
                    torch.randint(0, 2 ** 30, (1,))]
        out[f"select_tokens[seed={seed},{top_k},{top_p},{temperature}]"] = _outcome(select)
    ids = torch.tensor([[1, 2, 1, 2, 1], [3, 3, 3, 4, 3]])
    for n, cur in itertools.product((1, 2, 3, 6), (2, 4, 5)):
        out[f"filter_ngrams[{n},{cur}]"] = _outcome(
            lambda: sampling.filter_ngrams(n, ids, torch.zeros(2, 6), cur))

    # acceptors (fixed seed): random scores, draft == target (all accepted), target elsewhere (first rejected),
    # accepted token id 0 (zero padding), shape errors
    def acceptor_inputs(seed, batch, k, vocab, case):
        g = torch.Generator().manual_seed(seed)
        draft = torch.randn(batch, k, vocab, generator=g) * 2
        target = torch.randn(batch, k + 1, vocab, generator=g) * 2
        draft_ids = torch.argmax(draft, dim=-1)
        if case == "equal":
            target[:, :k] = draft
        elif case == "reject":
            target[:, :k] = -draft
        elif case == "zero-ids":
            draft[:, :, 0] += 20
            target[:, :, 0] += 20
            draft_ids = torch.zeros(batch, k, dtype=torch.int64)
        return draft_ids, draft, target
    for seed, batch, k, case in itertools.product((0, 1, 2), (1, 2, 3), (1, 3, 4),
                                                  ("random", "equal", "reject", "zero-ids")):
        def accept(seed=seed, batch=batch, k=k, case=case):
            inputs = acceptor_inputs(seed, batch, k, 11, case)
            torch.manual_seed(100 + seed)
            return [speculation.DefaultTokenAcceptor()(*inputs), torch.randint(0, 2 ** 30, (1,))]
        out[f"DefaultTokenAcceptor[seed={seed},batch={batch},k={k},{case}]"] = _outcome(accept)
    for name, (d, t) in {"vocab mismatch": ((1, 3, 11), (1, 4, 12)), "k+1 mismatch": ((1, 3, 11), (1, 3, 11)),
                         "2-D": ((3, 11), (4, 11))}.items():
        out[f"DefaultTokenAcceptor[{name}]"] = _outcome(lambda: speculation.DefaultTokenAcceptor()(
            torch.zeros(1, d[-2], dtype=torch.int64), torch.zeros(d), torch.zeros(t)))
    for seed, case in itertools.product((0, 1, 2), ("random", "equal", "reject")):
        def reference(seed=seed, case=case):
            draft_ids, draft, target = acceptor_inputs(seed, 1, 3, 11, case)
            torch.manual_seed(seed)
            return [speculation.ReferenceTokenAcceptor()(draft_ids, draft[0], target[0]),
                    torch.randint(0, 2 ** 30, (1,))]
        out[f"ReferenceTokenAcceptor[seed={seed},{case}]"] = _outcome(reference)
    for seed in (0, 1):
        def tree(seed=seed):
            g = torch.Generator().manual_seed(seed)
            target = torch.randn(5, 7, generator=g)
            draft_ids = torch.tensor([[0, int(torch.argmax(target[0])), 3, int(torch.argmax(target[1])), 2]])
            return speculation.DefaultTokenTreeAcceptor()(draft_ids, torch.zeros(5, 7), target,
                                                         {0: [1, 2], 1: [3, 4], 2: [], 3: []})
        out[f"DefaultTokenTreeAcceptor[seed={seed}]"] = _outcome(tree)

    # the draft provider over the fake
    for name, (ids, k, cache) in {"context": ([[5, 9, 3]], 4, None), "context cache 0": ([[5, 9, 3]], 4, [0, 1, 2]),
                                  "k=3 at 5": ([[8]], 3, [5]), "k=1 at 5": ([[8]], 1, [5]),
                                  "batch 2 at 5": ([[8], [4]], 3, [[5], [5]])}.items():
        def draft(ids=ids, k=k, cache=cache):
            model = _FakeLM(salts=((1, 1.0), (2, 0.5)))
            torch.manual_seed(0)
            return _loop_outcome(lambda: speculation.DraftModelForSpeculation(model)(
                torch.tensor(ids), k, None if cache is None else torch.tensor(cache)), model)
        out[f"DraftModelForSpeculation[{name}]"] = draft()

    # SpeculativeGenerator.sample: default (sampling) and greedy acceptors, EOS inside the window (proposed and
    # accepted, or only the target's), tokens past sequence_length cut, streamer puts, batch > 1
    class GreedyAcceptor(speculation.TokenAcceptor):
        def __call__(self, draft_ids, draft_scores, target_scores):
            target_ids = torch.argmax(target_scores, dim=-1)
            accepted = torch.zeros_like(target_ids)
            for b in range(draft_ids.shape[0]):
                n = 0
                while n < draft_ids.shape[1] and draft_ids[b, n] == target_ids[b, n]:
                    n += 1
                accepted[b, :n + 1] = target_ids[b, :n + 1]
            return accepted

    spec_eos = {"none": ({}, {}, None), "eos unused": ({}, {}, 2), "draft+target@6": ({(0, 6): 2}, {(0, 6): 2}, 2),
                "draft+target@5,@9": ({(0, 5): 2, (0, 9): 2}, {(0, 5): 2, (0, 9): 2}, 2),
                "target@7": ({}, {(0, 7): 2}, 2), "draft@7": ({(0, 7): 2}, {}, 2), "eos=first": ({}, {(0, 3): 2}, 2)}
    for seed, k, acc, (ename, (dboost, tboost, eos)) in itertools.product(
            (0, 1, 2), (2, 4, 5), ("default", "greedy"), spec_eos.items()):
        def spec(seed=seed, k=k, acc=acc, dboost=dboost, tboost=tboost, eos=eos):
            draft = _FakeLM(salts=((1, 1.0), (2, 0.5)), boost=dboost)
            target, streamer = _FakeLM(boost=tboost), _Streamer()
            gen = speculation.SpeculativeGenerator(speculation.DraftModelForSpeculation(draft), target, k=k,
                                                   acceptor=GreedyAcceptor() if acc == "greedy" else None)
            torch.manual_seed(seed)
            return _loop_outcome(lambda: [gen.sample(torch.tensor(prompts[1]), 13, eos_token_id=eos,
                                                     streamer=streamer), draft.calls], target, streamer)
        out[f"SpeculativeGenerator[seed={seed},k={k},{acc},eos={ename}]"] = spec()

    def spec_case(name, batch=1, k=4, seq=12, mask=None, **kw):
        def run():
            draft = _FakeLM(salts=((1, 1.0), (2, 0.5)), boost={(0, 6): 2, (1, 5): 2})
            target, streamer = _FakeLM(boost={(0, 6): 2, (1, 5): 2}), _Streamer()
            gen = speculation.SpeculativeGenerator(speculation.DraftModelForSpeculation(draft), target, k=k)
            torch.manual_seed(0)
            return _loop_outcome(lambda: [gen.sample(
                torch.tensor(prompts[batch]), seq, streamer=streamer,
                attention_mask=None if mask is None else torch.tensor(mask), **kw), draft.calls], target, streamer)
        out[f"SpeculativeGenerator[{name}]"] = run()

    spec_case("pad_token_id=7", pad_token_id=7, eos_token_id=2)
    spec_case("output_logits", output_logits=True)
    spec_case("seq=4", seq=4)
    spec_case("seq=3 (=prompt)", seq=3)
    spec_case("mask all ones", mask=[[1, 1, 1]], eos_token_id=2)
    spec_case("mask right-padded", mask=[[1, 1, 0]])
    spec_case("mask left-padded", mask=[[0, 1, 1]])
    spec_case("start_ids", start_ids=torch.tensor([0]))
    spec_case("batch 2 without attention_mask", batch=2)
    spec_case("batch 2", batch=2, mask=[[1, 1, 1], [1, 1, 1]], eos_token_id=2)
    spec_case("batch 2 right-padded", batch=2, mask=[[1, 1, 1], [1, 1, 0]], eos_token_id=2)
    spec_case("batch 3", batch=3, mask=[[1, 1, 1]] * 3)


# ------------------------------------------------------------------------------------------ driver
def _child_env(**extra):
    env = dict(os.environ)
    env.update(extra)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run_probes(python, stack, side, pythonpath, src_env):
    code = (f"import sys, json; sys.path[:0] = {json.dumps(pythonpath)}; sys.path.insert(0, {str(Path(__file__).parent)!r});"
            f"import fidelity as f; f.install_stubs({side!r}, {src_env.get('NXD_SRC')!r});"
            f"r = f.probes_nxdi() if {stack!r} == 'nxdi' else f.probes_tnx({side!r});"
            "print('@@' + json.dumps(r))")
    proc = subprocess.run([str(Path(python).absolute()), "-c", code], capture_output=True, text=True, cwd=tempfile.gettempdir(),
                          env=_child_env(**src_env))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("@@")), None)
    if line is None:
        raise RuntimeError(f"{stack} probes ({side}) produced no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[2:])


def _stand_in_path(stack):
    """Only the stack's own stand-in package, as in ci/neuron_sim.sh."""
    d = Path(tempfile.mkdtemp(prefix=f"fidelity-{stack}-"))
    pkg = "neuronx_distributed_inference" if stack == "nxdi" else "transformers_neuronx"
    os.symlink(STAND_INS / pkg, d / pkg)
    os.symlink(STAND_INS / "_neuron_contract.py", d / "_neuron_contract.py")
    return [str(d), str(REPO)]


def load_deviations():
    """tests/neuron_sim/deviations.py (its DEVIATIONS table and render()), read from its file: putting
    tests/neuron_sim on sys.path would make the stand-ins importable in this process under the real libraries' names."""
    spec = importlib.util.spec_from_file_location("neuron_sim_deviations", STAND_INS / "deviations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def declared_probes(stack):
    DEVIATIONS = load_deviations().DEVIATIONS
    return [(d["id"], re.compile(p)) for d in DEVIATIONS if d["stack"] in (stack, "both") for p in d.get("probes", ())]


def compare(pinned: dict, stand_in: dict, declared) -> tuple[list, list, list]:
    """(agreements, declared divergences, undeclared divergences); a divergence is (probe, pinned, stand-in, id)."""
    agree, known, unknown = [], [], []
    for key in sorted(set(pinned) | set(stand_in)):
        a, b = pinned.get(key, {"missing": True}), stand_in.get(key, {"missing": True})
        if a == b:
            agree.append(key)
            continue
        ids = [i for i, pattern in declared if pattern.search(key)]
        (known if ids else unknown).append((key, a, b, ids[0] if ids else None))
    return agree, known, unknown


def run_unit_tests(python, nxdi_src, nxd_src):
    work = Path(tempfile.mkdtemp(prefix="fidelity-unit-"))
    for rel in UNIT_TESTS:
        dst = work / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(nxdi_src) / rel, dst)
    for res in ("test/unit/resources",):
        if (Path(nxdi_src) / res).is_dir():
            shutil.copytree(Path(nxdi_src) / res, work / res, dirs_exist_ok=True)
    (work / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nimport fidelity\n"
        f"fidelity.install_stubs('stand-in-tests', {str(nxd_src) if nxd_src else None!r})\n")
    junit = work / "junit.xml"
    python = str(Path(python).absolute())
    pythonpath = os.pathsep.join(_stand_in_path("nxdi"))
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(work),
                           f"--junitxml={junit}", *[str(work / r) for r in UNIT_TESTS]],
                          capture_output=True, text=True, cwd=work, env=_child_env(PYTHONPATH=pythonpath))
    if not junit.exists():
        raise RuntimeError(f"pinned unit tests did not run:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return parse_junit(junit.read_text()), proc.stdout


def parse_junit(xml_text: str) -> dict:
    """test id (file::Class::name) -> 'passed' | 'failed' | 'skipped' (errors count as failed)."""
    import xml.etree.ElementTree as ET

    results = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        cls = case.get("classname", "")
        parts = cls.split(".")
        file_idx = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        tid = "/".join(parts[:file_idx + 1]) + ".py" + "".join("::" + p for p in parts[file_idx + 1:]) + \
            "::" + case.get("name")
        status = "passed"
        if case.find("failure") is not None or case.find("error") is not None:
            status = "failed"
        elif case.find("skipped") is not None:
            status = "skipped"
        results[tid] = status
    return results


def classify(results: dict) -> dict:
    """in-scope passed / failed / skipped, and out-of-scope outcomes with their reason."""
    report = {"passed": [], "failed": [], "skipped": [], "out_of_scope": []}
    for tid, status in sorted(results.items()):
        reason = next((r for pattern, r in OUT_OF_SCOPE.items() if re.search(pattern, tid)), None)
        if reason:
            report["out_of_scope"].append((tid, status, reason))
        else:
            report[status].append(tid)
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nxdi-python", default=str(REPO / ".venv-neuron-nxdi" / "bin" / "python"))
    ap.add_argument("--tnx-python", default=str(REPO / ".venv-neuron-tnx" / "bin" / "python"))
    ap.add_argument("--stack", choices=("nxdi", "tnx"), action="append")
    ap.add_argument("--verbose", action="store_true", help="print every agreement too")
    args = ap.parse_args(argv)
    stacks = args.stack or ["nxdi", "tnx"]
    failures = 0
    nxd = os.environ.get("NXD_SRC")
    for stack in stacks:
        src = os.environ.get("NXDI_SRC" if stack == "nxdi" else "TNX_SRC")
        python = args.nxdi_python if stack == "nxdi" else args.tnx_python
        if not src or not Path(src).is_dir():
            print(f"[{stack}] SKIPPED: set {'NXDI_SRC' if stack == 'nxdi' else 'TNX_SRC'} to a checkout of the pinned "
                  "source (nothing is downloaded)")
            continue
        if stack == "nxdi":
            results, _ = run_unit_tests(python, src, nxd)
            rep = classify(results)
            for tid in rep["failed"]:
                print(f"[nxdi] pinned unit test FAILED on the stand-in: {tid}")
            for tid, status, reason in rep["out_of_scope"]:
                if args.verbose:
                    print(f"[nxdi] out of scope ({status}): {tid}: {reason}")
            print(f"[nxdi] pinned unit tests in scope: {len(rep['passed'])} passed, {len(rep['failed'])} failed, "
                  f"{len(rep['skipped'])} skipped; out of scope: {len(rep['out_of_scope'])} "
                  f"({sum(s == 'passed' for _, s, _ in rep['out_of_scope'])} of them pass anyway)")
            failures += len(rep["failed"])
        src_env = {"NXDI_SRC": src} if stack == "nxdi" else {"TNX_SRC": src}
        if nxd:
            src_env["NXD_SRC"] = nxd
        pinned_path = [str(Path(src) / "src")]
        pinned = _run_probes(python, stack, "pinned", pinned_path, src_env)
        stand = _run_probes(python, stack, "stand-in", _stand_in_path(stack), src_env)
        agree, known, unknown = compare(pinned, stand, declared_probes(stack))
        if args.verbose:
            for key in agree:
                print(f"[{stack}] agrees: {key}")
        for key, a, b, dev in known:
            print(f"[{stack}] declared divergence ({dev}): {key}\n    pinned:   {a}\n    stand-in: {b}")
        for key, a, b, _ in unknown:
            print(f"[{stack}] UNDECLARED divergence: {key}\n    pinned:   {a}\n    stand-in: {b}")
        print(f"[{stack}] probes: {len(agree) + len(known) + len(unknown)} compared, {len(agree)} agree, "
              f"{len(known)} declared divergences, {len(unknown)} undeclared divergences")
        failures += len(unknown)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
