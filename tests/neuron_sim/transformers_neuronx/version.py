__version__ = '0.13.x'  # src/transformers_neuronx/version.py
