"""The real driver (``backend=real``): one parameter server and N client processes on torch.distributed.

Entry points: ``run_real(cfg, run_dir) -> summary`` on rank 0, ``run_torchrun_worker(cfg) -> exit code`` on the
other torchrun ranks; its modules, one line each: docs/architecture.md.
"""
from repro.real.launch import run_real, run_torchrun_worker

__all__ = ["run_real", "run_torchrun_worker"]
