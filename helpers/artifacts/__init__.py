"""Compiled graphs and their persistence, one family the engine does not import.

Layer: above ``helpers.engine`` (and ``helpers.planning``, ``helpers.model_store``); imports nothing above.

- ``graphs``: a decoder layer's attention and MLP units per bucket, compiled ahead of time (torch.export / AOTInductor)
- ``manifest``: fingerprints, each rank's manifest, loading without recompiling
- ``presharded``: one rank's weights as built, one safetensors file per rank
- ``serialization``: save / load / compile / from_compiled for a model and for each rank
- ``model``: ``NeuronModel`` (``helpers.NeuronModel``) and its aliases ``LlamaForSampling`` & co.
"""
