"""The real driver (``backend=real``): one parameter server and N client processes on torch.distributed.

* :mod:`repro.real.frames` -- the message format: a frame (header + payload), the header's slots.
* :mod:`repro.real.groups` -- process groups: the world, one gloo group per client; gloo's interface.
* :mod:`repro.real.transport` -- bounded-wait channels and the server's receiver threads (gloo).
* :mod:`repro.real.server` -- rank 0: the push loop, evaluator thread, checkpoints.
* :mod:`repro.real.client` -- ranks 1..N: fetch, ``nsync`` local steps, push.
* :mod:`repro.real.launch` -- the entry points: rank 0's start-up, serving and ending, or joining torchrun.
* :mod:`repro.real.processes` -- the client processes: fork server, readiness, signals, clean-up.

Entry points: ``run_real(cfg, run_dir) -> summary`` on rank 0 (single node: it spawns the
clients; under torchrun: it joins the world), ``run_torchrun_worker(cfg) -> exit code`` on the
other torchrun ranks.
"""
from repro.real.launch import run_real, run_torchrun_worker

__all__ = ["run_real", "run_torchrun_worker"]
