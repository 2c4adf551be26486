"""The pinned Neuron libraries' rules, and the planners built on them (no engine needed: plan before you build).

Layer: above ``helpers.model_store``; imports nothing else from ``helpers``.

- ``dtypes``: amp and weight-storage names -> torch dtypes (the one map)
- ``buckets``: bucket computation and selection of transformers-neuronx and NxD Inference
- ``gqa``: the GQA strategies (the enums' one home), their fallbacks and the per-rank head layouts
- ``memory``: bytes per NeuronCore, instance types and the tp degrees each family runs
- ``bucket_planner``: choose buckets from a sample of lengths
- ``config_search``: the (tp, batch, sequence length) search (``python -m helpers.planning.config_search``)
"""
