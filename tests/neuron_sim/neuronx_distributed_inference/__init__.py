"""Stand-in of NxD Inference 0.8 (neuronx-distributed-inference, Neuron SDK 2.28.0), for the neuron lanes and
the contract test only; see tests/neuron_sim/pyproject.toml.

Transcribed from aws-neuron/neuronx-distributed-inference at commit cd3abf30558fe1a14dadfb1397c2118e3fcfcc11
("Neuron SDK Release 2.28.0"), Apache License 2.0, Copyright Amazon.com, Inc. or its affiliates: each module
names its source file. Its numbers come from this repository's reference engine (helpers.engine), computed at
tensor-parallel degree 1, and are never Neuron measurements.
"""
