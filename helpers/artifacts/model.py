"""``helpers.NeuronModel``: the reference engine with its graphs compiled ahead of time and saved, in the
call shapes of the Neuron libraries: transformers-neuronx ``save(dir[, sharded_weights])`` and ``load(dir)``
before ``to_neuron()``; NxD Inference ``compile(path)`` and ``load(path)`` (``from_compiled``).

The engine (``helpers.engine.generation.CausalLM``) knows nothing of this family: this class adds it by
overriding two steps of ``to_neuron()``, where the weights come from (presharded files) and how the graph
of each bucket is made (loaded, built ahead of time, or eager: ``serialization.rank_graphs``).
"""
from __future__ import annotations

from ..engine.generation import CausalLM
from ..engine.weights import RankWeights
from .graphs import artifact_mode
from .serialization import (check_saved, compile_to, from_compiled, graph_fields, load_presharded, rank_graphs, save,
                            saved_kernels)

LOAD_AFTER_BUILD = ("load() must come before to_neuron() (as in transformers-neuronx): construct the model again, "
                    "call load(dir), then to_neuron()")


class NeuronModel(CausalLM):
    """``CausalLM`` (its differences from transformers-neuronx included) with graphs compiled ahead of time and
    saved. Prefer the aliases ``LlamaForSampling`` / ``MistralForSampling`` / ``NeuronAutoModelForCausalLM``.
    ``tp_degree > 1`` runs in ``helpers.parallel.ParallelModel`` (one process per rank, the same API).
    """

    def __init__(self, model_path=None, **kwargs):
        super().__init__(model_path, **kwargs)
        # save(dir, sharded_weights=True) marks its config.json so (as transformers-neuronx's
        # from_pretrained) the weights load presharded, without fusing / casting / sharding again
        self.presharded = bool(self.args.hf_config.get("is_presharded_checkpoint", False))
        if self.presharded and not self.neuron_config.on_device_embedding:  # tnx base.py
            raise ValueError("on_device_embedding must be True to save and load presharded weights: pass "
                             "neuron_config=NeuronConfig(on_device_embedding=True)")
        if self.presharded and self.neuron_config.quant is not None:
            raise ValueError("Presharded weights are stored unquantized: load them without neuron_config.quant")
        self._artifacts_dir = None  # set by load(dir): to_neuron() then loads graphs instead of building
        self._workdir = None  # an "aoti" build's packages

    def _load_weights(self) -> RankWeights:
        if self.presharded:
            return load_presharded(self, 0)
        return super()._load_weights()

    def _recorded_kernels(self) -> dict | None:
        """The matmul kernels the saved model given to ``load()`` ran with: the build uses them again."""
        return saved_kernels(self, 0)

    def _build_graphs(self) -> tuple[dict, list[dict]]:
        """One callable per (kind, bucket) — context, token and (after ``enable_speculative_decoder``)
        speculative: eager, or built per bucket as ``neuron_config.compiled`` says ("export" or True:
        torch.export programs; "aoti": AOTInductor packages), or loaded from the directory given to
        ``load()`` (no compilation). ``build_report`` lists each graph and its seconds."""
        graphs, report, self._workdir = rank_graphs(
            self.model, self._graph_kinds(), self.batch_size, artifact_mode(self.neuron_config.compiled),
            self._artifacts_dir, self._graph_fields(), self.model.comm.rank)
        return graphs, report

    # -- serialization (helpers.artifacts.serialization): transformers-neuronx save/load, NxDI compile/load ----
    def _graph_fields(self) -> dict:
        return graph_fields(self)

    def save(self, directory, sharded_weights: bool = False) -> dict:
        """transformers-neuronx ``save(dir, sharded_weights=False)``: one artifact per graph; with
        ``sharded_weights`` (needs ``on_device_embedding=True``) also the presharded weights, and the
        directory becomes a checkpoint that ``from_pretrained(dir)`` loads without re-sharding."""
        return save(self, directory, sharded_weights)

    def load(self, directory) -> "NeuronModel":
        """transformers-neuronx ``load(dir)``: call before ``to_neuron()``, which then loads the saved graphs
        instead of compiling. Refuses now, before any weight is read, a directory saved for another model,
        bucket set, batch, tp degree, dtype or torch version, or with a changed file."""
        if self._is_built():
            raise RuntimeError(LOAD_AFTER_BUILD)
        check_saved(self, directory)
        self._artifacts_dir = str(directory)
        return self

    def compile(self, compiled_model_path, save_sharded_checkpoint: bool = False) -> dict:
        """NxD Inference ``compile(path)``: build the graphs (if not yet) and write the config and artifacts
        (+ ``weights/tp{rank}_sharded_checkpoint.safetensors`` with ``save_sharded_checkpoint``)."""
        return compile_to(self, compiled_model_path, save_sharded_checkpoint)

    @classmethod
    def from_compiled(cls, compiled_model_path, model_path=None, device: str = "cpu") -> "NeuronModel":
        """NxD Inference ``load(path)``: a model rebuilt from ``compile(path)``'s directory, no compilation."""
        return from_compiled(cls, compiled_model_path, model_path, device)


class LlamaForSampling(NeuronModel):
    pass


class MistralForSampling(NeuronModel):
    pass


class NeuronAutoModelForCausalLM(NeuronModel):
    pass
