"""neuronx_distributed_inference/utils/tensor_replacement/registry.py at aws-neuron/neuronx-distributed-inference
cd3abf3 (SDK 2.28.0): TensorReplacementRegister.get_instance, its signature only (tensor replacement, a debugging
feature, is not transcribed: the call raises NotImplementedError).
"""
from typing import Dict, List, Optional


class TensorReplacementRegister:
    @classmethod
    def get_instance(
        cls,
        ref_dir: Optional[str] = None,
        neuron_dir: Optional[str] = None,
        tr_map: Optional[Dict[int, List[str]]] = None,
        config=None,
        ref_equiv_map: Optional[Dict[str, str]] = None,
    ) -> "TensorReplacementRegister":
        raise NotImplementedError("stand-in: tensor replacement is not transcribed")
