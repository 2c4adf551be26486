"""neuronx_distributed_inference/models/application_base.py (0.8.0): NeuronApplicationBase's call order.

``compile(path)`` writes ``neuron_config.json`` and ``model.pt`` (COMPILED_MODEL_FILE_NAME);
``load(path)`` ``torch.jit.load``s ``path/model.pt`` (so it needs a compiled folder) and must come
before generation; ``save_quantized_state_dict`` is a classmethod that writes the quantized checkpoint.
"""
import os

import _neuron_contract as contract
from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig

COMPILED_MODEL_FILE_NAME = "model.pt"


def normalize_path(path):
    path = str(path)
    return path if path.endswith("/") else path + "/"


class NeuronApplicationBase:
    _model_cls = None

    def __init__(self, model_path: str, config: InferenceConfig = None, neuron_config: NeuronConfig = None):
        model_path = normalize_path(model_path)
        if config is None:
            config = self.get_config_cls().load(model_path)
        if neuron_config is not None:
            config.neuron_config = neuron_config
        if not isinstance(config, self.get_config_cls()):
            raise contract.ContractError(f"{type(self).__name__} takes a {self.get_config_cls().__name__}")
        self.config, self.neuron_config, self.model_path = config, config.neuron_config, model_path
        self.is_loaded_to_neuron = False
        contract.record(f"nxdi.{type(self).__name__}", model_path=model_path)

    @classmethod
    def get_config_cls(cls):
        raise NotImplementedError

    def compile(self, compiled_model_path, debug=False, pre_shard_weights_hook=None, dry_run=False):
        path = normalize_path(compiled_model_path)
        os.makedirs(path, exist_ok=True)
        self.config.save(path)
        contract.record("nxdi.compile", path=path, dry_run=dry_run)
        if dry_run:
            return
        with open(path + COMPILED_MODEL_FILE_NAME, "wb") as fh:
            fh.write(b"stand-in traced model")

    def load(self, compiled_model_path, start_rank_id=None, local_ranks_size=None, skip_warmup=False):
        path = normalize_path(compiled_model_path)
        if not os.path.exists(path + COMPILED_MODEL_FILE_NAME):  # torch.jit.load would fail
            raise ValueError(f"The provided filename {path + COMPILED_MODEL_FILE_NAME} does not exist: "
                             "compile(path) before load(path)")
        self.is_loaded_to_neuron = True
        contract.record("nxdi.load", path=path)

    def reset(self):
        pass

    @classmethod
    def save_quantized_state_dict(cls, model_path: str, config: InferenceConfig):
        target = config.neuron_config.quantized_checkpoints_path
        if target is None:
            raise contract.ContractError("save_quantized_state_dict needs neuron_config.quantized_checkpoints_path")
        if not os.path.isdir(target):
            os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
            with open(target, "wb") as fh:
                fh.write(b"stand-in quantized state dict")
        contract.record("nxdi.save_quantized_state_dict", model_path=str(model_path), target=str(target))
