"""transformers_neuronx/generation_utils.py (v0.13.0): only the constructor is transcribed."""
import _neuron_contract as contract


class HuggingFaceGenerationModelAdapter:
    def __init__(self, config, model):
        self.config, self.model = config, model

    def generate(self, *args, **kwargs):
        raise contract.ContractError("HuggingFaceGenerationModelAdapter.generate is not transcribed in the stand-in: "
                                     "transcribe it from generation_utils.py before using it")

    def reset_generation(self):
        pass
