"""gpu-asgd-repro: GPU Asynchronous SGD (Paine et al., arXiv 1312.6186), reproduced. The Python API:
:mod:`repro.api` (docs/api.md)."""
__version__ = "0.1.0"
