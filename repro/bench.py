"""Benchmarks: ``python -m repro.bench sim`` and ``python -m repro.bench real``.

Each prints ratios measured in one run (never asserted by tests; wall times vary by machine):

* ``sim``: wall time of the simulator divided by a plain training loop of the same number of
  minibatch steps (same model, batch size, device and data order machinery), for ``digits_cnn``
  with 8 clients at ``nsync`` 1 and 16. Target <= 1.10 (DESIGN.md). The simulator includes its
  event queue, server applies, fetches, CSV logging and two evaluations; the plain loop is
  ``torch.optim.SGD``, whose per-parameter update costs more than our one flat-vector update,
  so ratios below 1 are possible and honest.
* ``real``: see :mod:`repro.bench_real`.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from repro.components import load_data
from repro.config import AlgoConfig, CostConfig, RunConfig
from repro.data import ClientStream
from repro.models import build_model
from repro.sim import Simulation, build_problem

TARGET_SIM = 1.10


def plain_loop_s(cfg: RunConfig, num_steps: int) -> float:
    """Seconds for ``num_steps`` of an ordinary torch training loop (torch.optim.SGD)."""
    ds = load_data(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model.name, ds.input_shape, ds.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.algo.lr, momentum=cfg.algo.momentum,
                          weight_decay=cfg.algo.weight_decay)
    stream = ClientStream(ds.x_train, ds.y_train, cfg.algo.batch_size, cfg.seed, 1)
    start = time.perf_counter()
    for _ in range(num_steps):
        x, y = stream.next_batch()
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return time.perf_counter() - start


def sim_run_s(cfg: RunConfig) -> tuple[float, int]:
    """Seconds for the simulator's whole run (logging, two evaluations) and its step count."""
    problem = build_problem(cfg, torch.device("cpu"))
    with tempfile.TemporaryDirectory() as run_dir:
        sim = Simulation(cfg, problem, run_dir, compute_s=cfg.cost.compute_s)
        start = time.perf_counter()
        sim.run()
        elapsed = time.perf_counter() - start
        steps = sim.server.version * cfg.nsync
    return elapsed, steps


def bench_sim(num_epochs: float, repeats: int) -> bool:
    torch.set_num_threads(1)
    ok = True
    print(f"simulator overhead: digits_cnn, 8 clients, 1 CPU thread, best of {repeats} (target <= {TARGET_SIM})")
    print(f"{'nsync':>6} {'steps':>7} {'sim s':>8} {'plain s':>8} {'ratio':>7}")
    for nsync in (1, 16):
        cfg = RunConfig(num_clients=8, nsync=nsync, num_epochs=num_epochs, eval_every=num_epochs,
                        progress=False, algo=AlgoConfig(), cost=CostConfig(profile="lan", jitter="lognormal",
                                                                           jitter_sigma=0.1, latency_s=1e-4))
        sims, plains = [], []
        for _ in range(repeats):   # interleaved, so a busy machine slows both alike
            sim_s, steps = sim_run_s(cfg)
            sims.append(sim_s)
            plains.append(plain_loop_s(cfg, steps))
        sim_s, plain_s = min(sims), min(plains)
        ratio = sim_s / plain_s
        ok &= ratio <= TARGET_SIM
        print(f"{nsync:>6} {steps:>7} {sim_s:>8.2f} {plain_s:>8.2f} {ratio:>7.3f}  "
              f"{'PASS' if ratio <= TARGET_SIM else 'FAIL'}", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=("sim", "real"))
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="options of the real benchmark (see --help there)")
    parser.add_argument("--epochs", type=float, default=20.0, help="simulated epochs per measurement (sim)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per setting; the best counts")
    args, rest = parser.parse_known_args(argv)
    if args.which == "sim":
        return 0 if bench_sim(args.epochs, args.repeats) else 1
    from repro.bench_real import main as bench_real

    return bench_real(args.rest + rest)


if __name__ == "__main__":
    sys.exit(main())
