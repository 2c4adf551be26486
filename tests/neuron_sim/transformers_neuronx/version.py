"""Stand-in of ``src/transformers_neuronx/version.py`` at aws-neuron/transformers-neuronx v0.13.0 (commit f4e3818)."""
__version__ = '0.13.x'
