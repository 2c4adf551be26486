"""Stand-in of ``src/transformers_neuronx/generation_utils.py`` at aws-neuron/transformers-neuronx v0.13.0
(commit f4e3818): only the constructor is transcribed (``generate`` raises ContractError)."""
import _neuron_contract as contract


class HuggingFaceGenerationModelAdapter:
    def __init__(self, config, model):
        self.config, self.model = config, model

    def generate(self, *args, **kwargs):
        raise contract.ContractError("HuggingFaceGenerationModelAdapter.generate is not transcribed in the stand-in: "
                                     "transcribe it from generation_utils.py before using it")

    def reset_generation(self):
        pass
