"""gpu-asgd-repro: GPU Asynchronous SGD (Paine et al., arXiv 1312.6186), reproduced.

Public API (see README): :func:`repro.api.simulate` runs the deterministic delay simulator on any
torch module and returns the run's tables as DataFrames.
"""
__version__ = "0.1.0"
