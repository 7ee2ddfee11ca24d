"""Benchmarks: ``python -m repro.bench sim``, ``python -m repro.bench real`` and ``python -m repro.bench grid``.

Each prints ratios measured in one run (never asserted by tests; wall times vary by machine);
README.md (section Benchmarks) has the targets and our measured numbers:

* ``sim``: wall time of the simulator divided by a plain training loop of the same number of
  minibatch steps (same model, batch size, device and data order machinery), for ``digits_cnn``
  with 8 clients at ``nsync`` 1 and 16. Target <= 1.10. The simulator includes its
  event queue, server applies, fetches, CSV logging and two evaluations; the plain loop is
  ``torch.optim.SGD``, whose per-parameter update costs more than our one flat-vector update,
  so ratios below 1 are possible and honest.
* ``real``: see :mod:`repro.bench_real`.
* ``grid``: one figure's grid, one point after another vs in parallel (one job per core); see
  :mod:`repro.bench_grid`.

:func:`build_parser` makes the command line: one subcommand per benchmark. Its help is plain
text written for users (``DESCRIPTION``, ``SIM_DESCRIPTION``, ``bench_real.DESCRIPTION``,
``bench_grid.DESCRIPTION``), not these docstrings.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from repro import bench_grid, bench_real
from repro.components import load_data
from repro.config import AlgoConfig, CostConfig, RunConfig
from repro.data import ClientStream
from repro.models import build_model
from repro.sim import build_problem, simulate

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
    problem = build_problem(cfg, torch.device("cpu"))   # data and model: not the simulator's cost
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.perf_counter()
        summary = simulate(cfg, run_dir, problem=problem)
        elapsed = time.perf_counter() - start
    if summary["status"] != "completed":
        raise RuntimeError(f"the benchmark's simulation ended {summary['status']}: {summary.get('message')}")
    return elapsed, int(summary["version"]) * cfg.nsync


def bench_sim(num_epochs: float, repeats: int) -> bool:
    torch.set_num_threads(1)
    ok = True
    print(f"simulator overhead: digits_cnn, 8 clients, 1 CPU thread, best of {repeats} (target <= {TARGET_SIM:.2f})")
    print(f"{'nsync':>6} {'steps':>7} {'sim s':>8} {'plain s':>8} {'ratio':>7}")
    for nsync in (1, 16):
        # the default optimiser (momentum 0.5); 8 clients at nsync 16 may blow the loss up, which
        # would stop the run early: the benchmark times steps, not learning, so only a non-finite
        # loss stops it (divergence_factor at its maximum)
        cfg = RunConfig(num_clients=8, nsync=nsync, num_epochs=num_epochs, eval_every=num_epochs,
                        progress=False, divergence_factor=1e6, algo=AlgoConfig(),
                        cost=CostConfig(profile="lan", jitter="lognormal", jitter_sigma=0.1, latency_s=1e-4))
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


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

DESCRIPTION = """\
Benchmarks of the two drivers. Each measures ratios of wall times or
throughputs in one run, so the machine's speed largely cancels out, and prints
each ratio against its target with PASS or FAIL. Ratios on a busy machine move
by about 10% between runs."""

EPILOG = """\
'python -m repro.bench sim --help', 'python -m repro.bench real --help' and
'python -m repro.bench grid --help' say more about each benchmark and list its
options. Exit status: 0 when every ratio meets its target, 1 when one does
not, 2 on a usage error."""

SIM_DESCRIPTION = f"""\
Simulator overhead: wall time of the delay simulator divided by a plain torch
training loop (torch.optim.SGD) that takes the same number of minibatch steps,
for digits_cnn with 8 clients at nsync 1 and at nsync 16, on 1 CPU thread.
The simulator's time includes its event queue, server applies, fetches, CSV
logging and two evaluations. Target <= {TARGET_SIM:.2f} at both settings. Ratios
below 1 are possible: the simulator updates one flat parameter vector,
torch.optim.SGD each parameter separately.

Exit status 0 when both ratios meet the target, 1 otherwise."""


def build_parser() -> argparse.ArgumentParser:
    """One subcommand per benchmark, each owning its options, so they go after its name."""
    raw = argparse.RawDescriptionHelpFormatter   # keep the hand-wrapped paragraphs
    parser = argparse.ArgumentParser(prog="python -m repro.bench", description=DESCRIPTION,
                                     epilog=EPILOG, formatter_class=raw)
    sub = parser.add_subparsers(dest="which", required=True, metavar="{sim,real,grid}", title="benchmarks")
    sim = sub.add_parser("sim", formatter_class=raw, description=SIM_DESCRIPTION,
                         help=f"simulator overhead: simulator wall time / a plain training loop "
                              f"taking the same steps (target <= {TARGET_SIM:.2f})")
    sim.add_argument("--epochs", type=bench_real.positive(float), default=20.0,
                     help="simulated epochs per measurement (default: %(default)s)")
    sim.add_argument("--repeats", type=bench_real.positive(int), default=3,
                     help="measurements per setting, interleaved with the plain loop's; the best "
                          "counts (default: %(default)s)")
    real = sub.add_parser("real", formatter_class=raw, description=bench_real.DESCRIPTION,
                          help=f"real driver: (a) push+fetch round trips / raw gloo send+recv "
                               f"(target >= {bench_real.PROTOCOL_TARGET}); (b) training samples/s, "
                               f"2 CPU clients / 1 client (target >= {bench_real.THROUGHPUT_TARGET})")
    bench_real.add_arguments(real)
    grid = sub.add_parser("grid", formatter_class=raw, description=bench_grid.DESCRIPTION,
                          help=f"grid launchers: one figure's grid run one point after another / in "
                               f"parallel, one job per core (target >= {bench_grid.TARGET} on 2 cores)")
    bench_grid.add_arguments(grid)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.which == "sim":
        return 0 if bench_sim(args.epochs, args.repeats) else 1
    if args.which == "grid":
        return bench_grid.run(args)
    return bench_real.run(args)


if __name__ == "__main__":
    sys.exit(main())
