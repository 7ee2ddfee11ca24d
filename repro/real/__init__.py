"""The real driver (``backend=real``): one parameter server and N client processes on torch.distributed.

Its modules, one line each: docs/architecture.md. Entry points: ``run_real(cfg, run_dir) ->
summary`` on rank 0 (single node: it spawns the clients; under torchrun: it joins the world),
``run_torchrun_worker(cfg) -> exit code`` on the other torchrun ranks.
"""
from repro.real.launch import run_real, run_torchrun_worker

__all__ = ["run_real", "run_torchrun_worker"]
