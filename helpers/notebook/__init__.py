"""What the notebooks share: the backend switch, one way to build a model on every backend, measurements,
reports and plots, metrics and provenance, the deploy step.

Layer: the top floor; may import every layer below (``helpers.parallel``, ``helpers.neuron``,
``helpers.artifacts``, ``helpers.engine``, ``helpers.planning``, ``helpers.model_store``, ``helpers.prompts``).

- ``backend``: ``backend`` = auto | reference | neuron, and the guards of Neuron-only cells
- ``recipes``: ``%load_ext helpers.notebook.recipes``: the Neuron recipe cells run where their library imports
- ``published``: what AWS and Hugging Face publish for a feature on inf2/trn1 (published, not measured here)
- ``build``: ``build_model`` / ``load_model``, dispatching to the reference engine, its ranks or a Neuron stack
- ``sharding``: tensor-parallel and GQA-sharding runs, tables and drawings (notebooks 01, 02)
- ``tensor_parallel``, ``gqa_sharding``, ``speculation_run``, ``int8``, ``round_trip``, ``batching``,
  ``prefix_caching``, ``migration``: notebooks 01, 02, 05, 06, 08, 09, 10 and 11's set-up, checks, tables, plots
  and metrics, one call each
- ``bucket_bench``, ``bucket_sections``: TTFT and per-position latency per bucket, and notebook 07's sections
- ``evaluate``: perplexity, greedy agreement, decode speed (notebooks 05, 06)
- ``streaming``, ``stopping``, ``speculation``, ``timing``: the measurements of notebooks 03, 04 and 05 (token
  latency, criteria runs, speculation sweeps and distribution checks, the cost of one step by the rows it carries)
- ``prompt_setup``: the prompts, tokenizer and model folder the streaming and stopping notebooks start from
- ``lmi``: the DJL LMI ``serving.properties`` of the notebook's settings
- ``quant_formats``: what each 8-bit format keeps of the weights (notebook 06)
- ``metrics``, ``provenance``: the figures a notebook writes, and what produced them
"""
