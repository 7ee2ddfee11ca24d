"""The public Python API: :func:`simulate` runs the delay simulator on your own module and data, with
the command line's semantics, returning the run's tables as DataFrames; the classroom's functions follow
it. The guide: docs/api.md.
"""
from __future__ import annotations

import contextlib
import functools
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.errors import HydraException
from torch import nn

# the classroom (exercises, grader, notebook) imports only this module: Push, the policies and their
# registries (a class registered runs wherever it is named), validate, the quadratic, build_model
from repro.asgd.algorithm import Push
from repro.asgd.flatnet import quadratic_loss
from repro.asgd.optimal import Ringmaster
from repro.asgd.protocols import PROTOCOLS, SSP, Decision, Policy, Sync, View
from repro.asgd.rules import RULES, StalenessScaledRule
from repro.config.loader import composed, composition_line, group_options
from repro.config.checks import check_leaves, from_dict, validate
from repro.config.settings import CostConfig, DataConfig, ModelConfig, RunConfig, plain, to_dict
from repro.errors import ConfigError, numbers
from repro.files import schema
from repro.workload.build import Problem
from repro.workload.custom import ArrayLike, check_objects, check_trainable, custom_problem, names
from repro.workload.data import QUADRATIC_CURVATURES, load_dataset
from repro.workload.models import build_model
from repro.runtime import resolve_device, seeded
from repro.sim.driver import simulate as sim_run

# ``python -m repro.run`` with no overrides: simulate()'s defaults, and every setting it does not take
DEFAULTS = composed()
_composed = functools.cache(composed)   # cost=NAME composed once a process: Hydra takes ~0.2 s a call
# simulate()'s settings: argument -> the config key it sets (the others: the same name)
API_KEYS = {**{name: name for name in ("num_clients", "nsync", "num_epochs", "eval_every", "seed", "target_error",
                                        "divergence_factor", "device", "force", "progress")},
            **{name: f"algo.{name}" for name in ("lr", "momentum", "weight_decay", "batch_size", "server_rule",
                                                 "lr_server", "dc_lambda")},
            **{name: f"protocol.{name}" for name in ("backup_workers", "staleness_bound")}, "protocol": "protocol.name"}


@dataclass(eq=False)   # the dataclass's == compared DataFrames: "truth value ... is ambiguous"
class Result:
    """A finished simulation: its tables as DataFrames, its summary (``time_to_target`` keyed by the
    target error as a float, ``{0.05: 12.3}``, where summary.json keys it by text) and where they were
    written (``run_dir``: None when no folder was asked for). See :func:`simulate`, Returns. ``==``
    is identity: compare the tables (``a.updates.equals(b.updates)``); summaries differ in wall time."""

    updates: pd.DataFrame
    evals: pd.DataFrame
    summary: dict
    run_dir: Path | None


def cost_profile(cost: str | dict | CostConfig) -> CostConfig:
    """A cost model from a profile name in ``conf/cost`` (e.g. "lan", "paper2013"), composed once a process as
    ``python -m repro.run cost=NAME`` composes it; a dict of :class:`CostConfig` fields, set on
    the profile it names (``{"profile": "straggler", "straggler_factor": 8}``), else (no profile,
    or a label of your own) on CostConfig's defaults; or a CostConfig. A schedule that replays a
    recorded run is refused: the API simulates."""
    if isinstance(cost, dict):   # on the profile it names: else its label and its settings disagree
        named = cost.get("profile") in group_options("cost")   # else "profile" is a free label
        base = to_dict(cost_profile(cost["profile"])) if named else {}
        cost = from_dict({**base, **{k: {**base.get(k, {}), **v} if isinstance(v, dict) else v
                                     for k, v in cost.items()}}, CostConfig, "cost.")
    elif not isinstance(cost, CostConfig):
        if cost not in group_options("cost"):
            raise ConfigError("cost", cost, group_options("cost"))
        if cost != "replay":   # which would need a recorded run's folder to compose
            cost = _composed((f"cost={cost}",)).cost
    if cost == "replay" or cost.schedule == "replay":
        raise ConfigError("cost", "replay", "a cost model; replay a recorded run with "
                          "python -m repro.run cost=replay cost.path=RUN_DIR")
    return cost


def simulate(module: nn.Module, train: tuple[ArrayLike, ArrayLike], test: tuple[ArrayLike, ArrayLike], *,
             num_clients: int = DEFAULTS.num_clients, nsync: int = DEFAULTS.nsync,
             num_epochs: float = DEFAULTS.num_epochs, eval_every: float = DEFAULTS.eval_every,
             lr: float = DEFAULTS.algo.lr, momentum: float = DEFAULTS.algo.momentum,
             weight_decay: float = DEFAULTS.algo.weight_decay, batch_size: int = DEFAULTS.algo.batch_size,
             server_rule: str = DEFAULTS.algo.server_rule, lr_server: float | None = DEFAULTS.algo.lr_server,
             dc_lambda: float = DEFAULTS.algo.dc_lambda, protocol: str = DEFAULTS.protocol.name,
             backup_workers: int = DEFAULTS.protocol.backup_workers,
             staleness_bound: int = DEFAULTS.protocol.staleness_bound,
             cost: str | dict | CostConfig = DEFAULTS.cost.profile, seed: int = DEFAULTS.seed,
             target_error: float = DEFAULTS.target_error, divergence_factor: float = DEFAULTS.divergence_factor,
             loss_fn=nn.functional.cross_entropy, device: str = DEFAULTS.device,
             run_dir: str | Path | None = None, force: bool = DEFAULTS.force, progress: bool = False) -> Result:
    """Simulate ``num_clients`` asynchronous clients training ``module`` through one server.

    Every client repeatedly fetches the server's parameters, takes ``nsync`` local SGD steps on
    its own shuffled order of the training set and pushes its update; the delay simulator
    decides, from the cost model, in which order pushes reach the server, exactly as
    ``python -m repro.run`` does. Deterministic: the same arguments give the same tables (except
    with ``cost="local"``, whose step time is measured on this machine). Every default below is
    the command line's (``python -m repro.run`` with no overrides, read from ``conf/``), but
    ``progress``'s; every setting not listed is the command line's too.

    Parameters
    ----------
    module : torch.nn.Module
        The network of a classification problem. Its current weights are the initial weights;
        it is copied, never trained in place. It must have float32 parameters and no buffers
        (e.g. no BatchNorm: the server would not synchronise them).
    train : (inputs, labels)
        The training set: two numpy arrays, torch tensors or pandas objects of equal length
        N >= 1. Inputs are converted to float32, shape (N, ...) as the module expects; labels
        are integer class indices 0..C-1 of any integer dtype (converted to int64), shape
        (N,). Float labels are refused rather than silently truncated.
    test : (inputs, labels)
        The test set, in the same form as ``train``. The number of classes C is one more than
        the largest label in either set.
    num_clients : int, default 4
        Asynchronous clients, >= 1.
    nsync : int, default 4
        Local minibatch steps between exchanges with the server (the paper's nsync = nfetch = npush), >= 1.
    num_epochs : float, default 20.0
        Training budget in epochs of the training set, counted in samples consumed by all clients together; > 0.
    eval_every : float, default 1.0
        Evaluate the server's parameters every this many epochs (by samples applied); > 0. An
        evaluation also runs at the start and at the end.
    lr : float, default 0.05
        Client learning rate of SGD, > 0.
    momentum : float, default 0.5
        Client momentum in [0, 1); the momentum buffer stays on the client across exchanges.
    weight_decay : float, default 0.0
        L2 weight decay added to the client's gradient, >= 0; 0 when some parameters are
        frozen (the decay acts on the whole parameter vector).
    batch_size : int, default 32
        Minibatch size of one client step, between 1 and the training-set size.
    server_rule : {SERVER_RULES}, default "delta"
        How the server applies a push: add the client's parameter change (delta), ``w -=
        lr_server * accrued gradient`` (downpour), per-parameter Adagrad (adagrad), downpour's
        step divided by the push's staleness (staleness_scaled, Zhang et al. 2016), or
        delay-compensated gradients ``g + dc_lambda * g*g*(w - w_fetched)`` (dcasgd, Zheng et
        al. 2017); the others (the lab's) run at the command line's defaults of their own keys
        (``python -m repro.run --help``).
    lr_server : float or None, default None
        Server step size, > 0. None picks the rule's default: 1.0 for delta, 0.01 for adagrad, ``lr`` for the others.
    dc_lambda : float, default 0.04
        DC-ASGD's lambda, >= 0 (server_rule="dcasgd" only; 0.04 is the paper's DC-ASGD-c value).
    protocol : {PROTOCOLS}, default "async"
        When the server applies and clients fetch: every push as it arrives (async, Downpour);
        bulk-synchronous rounds applying the mean update of all clients once (sync); async but
        no client more than ``staleness_bound`` pushes ahead of the slowest (ssp, Ho et al.
        2013); the others (the lab's Rennala and Ringmaster) run at the command line's defaults
        of their own keys.
    backup_workers : int, default 0
        sync only: a round closes at the first ``num_clients - backup_workers`` pushes and the
        late clients start over from the new parameters (Chen et al. 2016); 0..num_clients-1.
    staleness_bound : int, default 3
        ssp only: how many pushes a client may be ahead of the slowest live client, >= 0.
    cost : str, dict or CostConfig, default "lan"
        The simulator's cost model, which sets virtual time and so the order of pushes. A profile
        name from ``conf/cost`` ("lan", "uniform", "straggler", "paper2013", or "local", which times
        real steps once); a dict of CostConfig fields (fields left out take those of the profile its
        "profile" names, else CostConfig's defaults, which are the "uniform" profile's); or a
        CostConfig. "replay" is refused: replay a recorded run with ``python -m repro.run cost=replay``.
    seed : int, default 0
        Base seed of each client's data order, seeded by (seed, client), and of the cost
        model's jitter. Model initialisation is ``module``'s own weights, not this seed.
    divergence_factor : float, default 10.0
        A push whose mean training loss exceeds this many times the reference loss (the larger
        of the initial training loss and ln(classes)) ends the run with status "diverged"; > 1.
    target_error : float, default 0.05
        Training error in [0, 1]; the virtual time of the first evaluation at or below it is
        ``summary["time_to_target"]`` (null if never reached).
    loss_fn : callable, default torch.nn.functional.cross_entropy
        ``loss_fn(outputs, labels)`` returning the mean minibatch loss. The error rate is
        always the fraction of samples whose argmax output is not the label.
    device : {"cpu", "cuda", "auto"}, default "cpu"
        Where the model and the data live; "auto" picks cuda when available.
    run_dir : str, Path or None, default None
        Folder the run's tables are written to (the same files as a command-line run; ``~``
        is your home), kept afterwards. None runs in a fresh temporary folder, removed before
        ``simulate`` returns (the result holds the tables; ``result.run_dir`` is None). A folder that
        already holds a finished run with the same settings, data, initial weights and
        ``loss_fn`` (by name) is returned as it is; one holding another run is refused
        (ConfigError) unless ``force``, one holding files not a run's always.
    force : bool, default False
        Start ``run_dir`` over whatever run it holds.
    progress : bool, default False
        Print a progress line to stderr every few seconds while simulating (the command line
        prints them by default; a notebook asks).

    Returns
    -------
    Result
        ``updates`` (one row per push applied) and ``evals`` (one row per evaluation) as pandas
        DataFrames with the columns of updates.csv and evals.csv; ``summary``, the dict in
        summary.json (``status``, final metrics, ``time_to_target`` keyed by the target as a
        float, ``[0.05]``, where the file has the text "0.05"); ``run_dir``, where they were written
        (None: a temporary folder, removed). Times are virtual seconds of the cost model. A run
        that diverges (non-finite loss or parameters) returns with ``summary["status"] == "diverged"``.

    Raises
    ------
    ConfigError
        Before any training, for a bad argument, naming it, its value and what would be valid: a
        value out of range, of the wrong type or not among the choices; arrays that are empty, of
        unequal lengths or sample shapes, not finite numbers, or labels that are not class indices
        the module has outputs for; a batch larger than the training set; "cuda" without CUDA; a
        module or ``loss_fn`` that raises on two training inputs or gives no single loss; every parameter frozen.
    ValueError
        When ``module`` has buffers or no parameters, or parameters that are not float32.
    KeyboardInterrupt
        Once Ctrl-C has stopped the run (``run_dir`` keeps its tables, status ``interrupted``).
    """
    settings = {name: value for name, value in locals().items() if name in API_KEYS}
    run_dir = check_objects(module, train, test, loss_fn, run_dir)
    check_trainable(module, weight_decay)
    cfg = _config(settings, cost_profile(cost))
    with seeded(seed):
        problem = custom_problem(module, train, test, loss_fn, batch_size, resolve_device(device))
        data, model = names(problem, module, loss_fn)
        cfg = cfg.replace(data=replace(cfg.data, name=data), model=replace(cfg.model, name=model))
        return _run(cfg, run_dir, problem)


def _config(settings: dict, cost: CostConfig) -> RunConfig:
    """The command line's defaults with simulate()'s ``settings``, checked as config.json's values are: a
    wrong one is a ConfigError naming the argument."""
    # num_threads 0: the notebook's own torch threads, not the command line's one per process
    tree = {**to_dict(DEFAULTS), "exp_name": "api", "num_threads": 0, "cost": to_dict(cost),
            "data": to_dict(DataConfig(name="custom")), "model": to_dict(ModelConfig(name="custom"))}
    for name, value in settings.items():
        group, _, leaf = API_KEYS[name].rpartition(".")
        (tree[group] if group else tree)[leaf] = plain(value)
    try:
        return from_dict(tree)
    except ConfigError as err:   # the argument's name, not the config key it sets
        arg = next((a for a, k in API_KEYS.items() if k == err.key), err.key)
        said = f" ({err.key} on the command line)" if arg != err.key else ""
        raise ConfigError(arg, err.value, err.expected + said) from None


# simulate()'s help lists the registries' names (what validate() checks): one registered later too
for _field, _registry in (("{SERVER_RULES}", RULES), ("{PROTOCOLS}", PROTOCOLS)):
    simulate.__doc__ = simulate.__doc__.replace(_field, "{" + ", ".join(f'"{n}"' for n in _registry.names()) + "}")


def _run(cfg: RunConfig, run_dir: Path | None, problem: Problem | None) -> Result:
    """Simulate ``cfg`` into ``run_dir`` (None: a temporary folder, gone once it is read)."""
    if run_dir is None:
        with tempfile.TemporaryDirectory(prefix="repro-") as tmp:   # nothing left behind
            return replace(_run(cfg, Path(tmp) / "run", problem), run_dir=None)
    try:
        summary = dict(sim_run(cfg, run_dir, problem=problem))
    except ConfigError as err:   # said in the command line's names (run folder, force=true, resume=true, exp_name)
        if err.key not in ("resume", "run folder"):
            raise
        said = err.expected if err.key != "resume" else \
            f"{err.expected.rpartition(': ')[0]}; simulate does not resume a run: force=true starts it over"
        for cli, ours in (("force=true", "force=True"), ("exp_name or hydra.run.dir", "run_dir"),
                          ("exp_name", "run_dir"), ("results_dir (or hydra.run.dir)", "run_dir")):
            said = said.replace(cli, ours)
        raise ConfigError("run_dir", str(run_dir), said) from None
    # Ctrl-C (whose signal reaches the main thread alone) stops the caller too, as the command line's exit 130
    if summary["status"] == "interrupted" and threading.current_thread() is threading.main_thread():
        raise KeyboardInterrupt(f"the run interrupted at version {summary['version']}")   # returned, a loop ran on
    ttt = summary.get("time_to_target")
    if isinstance(ttt, dict):   # JSON keys it by text; a caller looks a target up by number
        summary["time_to_target"] = {float(k): v for k, v in ttt.items()}
    return Result(*(pd.read_csv(run_dir / name) for name in (schema.UPDATES_FILE, schema.EVALS_FILE)), summary, run_dir)


# ------------- the classroom's API (and the names imported above for it) -------------


def configure(*overrides: str) -> RunConfig:
    """The checked configuration ``python -m repro.run OVERRIDES`` would run, without progress
    lines (e.g. ``configure("+problem=quadratic", "num_clients=4", "cost=uniform")``; a lab
    experiment's point: ``configure("+exp=uneven", "+mitigation=sync")``). Composed anew on
    every call (nothing is cached); change it with ``cfg.replace(...)``. Raises ConfigError for a
    bad value, an unknown key or option."""
    if not all(isinstance(o, str) for o in overrides):   # else an AttributeError from deep in the parser
        raise ConfigError("overrides", list(overrides), 'KEY=VALUE strings, e.g. configure("num_clients=4")')
    try:
        return composed((*overrides, "progress=false"))
    except HydraException as exc:   # Hydra's own exception, whose second line may point the wrong way
        raise ConfigError("overrides", list(overrides), "KEY=VALUE of known keys and options (python -m "
                          f"repro.run --help lists them): {composition_line(exc)}") from None


def run_config(cfg: RunConfig) -> Result:
    """Simulate ``cfg`` (e.g. from :func:`configure`) in a temporary folder, as ``python -m repro.run``
    would, and return its tables (``run_dir`` None: the folder is gone). Raises ConfigError for a bad
    value, a backend other than sim or ``resume=true``; KeyboardInterrupt once Ctrl-C stopped the run."""
    validate(cfg)
    if cfg.backend.name != "sim":   # else a real run's config came back simulated, without a word
        raise ConfigError("backend", cfg.backend.name, "sim: run_config simulates (python -m repro.run "
                          "backend=real runs it for real)")
    if cfg.resume is True:   # else the refusal named the temporary folder and a force=True it has not
        raise ConfigError("resume", True, "false: run_config (and run_point) simulate in a fresh temporary "
                          "folder, which holds no run to resume")
    with seeded(cfg.seed):
        return _run(cfg, None, None)


def run_point(*overrides: str) -> Result:
    """One point of a lab experiment: ``run_config(configure(*overrides))``."""
    return run_config(configure(*overrides))


def critical_lr(staleness, l_max: float = 1.0):
    """The largest stable learning rate of gradient descent whose every gradient is ``staleness``
    updates old, on curvatures up to ``l_max``: 2 sin(pi / (4 tau + 2)) / l_max (Levin & May
    1976; 2 / l_max at tau = 0, about 0.445 / l_max at tau = 3). Numbers or arrays."""
    from repro.analysis.lab.stability import critical_lr as bound   # the analysis: imported late
    numbers("staleness", staleness, "a number or array of numbers, each finite and >= 0", lambda t: t >= 0)
    numbers("l_max", l_max, "a finite number > 0 (the largest curvature)", lambda v: v > 0, scalar=True)
    return bound(staleness, l_max)


def harmonic(n: int) -> float:
    """H_n = 1 + 1/2 + ... + 1/n: a sync round of n clients with exponential step times lasts
    H_n mean steps, so sync applies 1/H_n as many samples per second as async (nsync 1)."""
    from repro.analysis.lab.sync import harmonic as h   # 10**12 looped for hours: n as num_clients, 1..1024
    return h(int(numbers("n", n, "an integer in 1..1024 (clients)", lambda n: n.clip(1, 1024) == n, True, True)))


def theorem_response(curvatures, lr: float, mu: float, steps: int) -> np.ndarray:
    """Asynchrony begets momentum (Mitliagkas et al. 2016): each mode's weight, relative to its
    start, under the expected dynamics of async SGD at ``lr`` whose update direction is the
    running average ``u <- mu u + (1 - mu) g``; shape (modes, steps + 1). N async clients with
    exponential step times: mu = 1 - 1/N; mu = 0 is plain gradient descent. Computed exactly, so
    refused (ConfigError naming lr) where an unstable mode's response leaves float64's range."""
    from repro.analysis.lab.momentum import theorem_response as response
    numbers("curvatures", curvatures, "a number or 1-D array of numbers, each finite and >= 0",
            lambda c: (c >= 0) & (c.ndim < 2))
    numbers("lr", lr, "a finite number > 0", lambda v: v > 0, scalar=True)
    numbers("mu", mu, "a number in [0, 1)", lambda v: (v >= 0) & (v < 1), scalar=True)
    steps = int(numbers("steps", steps, "an integer in 0..10**6", lambda v: v.clip(0, 10**6) == v, True, True))
    with np.errstate(over="raise", invalid="raise"), contextlib.suppress(FloatingPointError):   # else inf, then nan
        return response(curvatures, lr, mu, steps)
    raise ConfigError("lr", lr, f"a step size whose every mode stays within float64's range over {steps} steps "
                      f"(lr x the largest curvature is {float(lr) * float(np.max(curvatures)):.3g}): lower lr, "
                      "the curvatures or steps")


def collection_time(taus: list[float], size: int) -> float:
    """Rennala SGD's time per server step (Tyurin & Richtarik 2023): t(S) = min{t : sum_i
    floor(t / tau_i) >= S} for clients whose segments take ``taus`` and collections of ``size``."""
    from repro.analysis.lab.uneven import collection_time as t_of_s
    # else an IndexError from the heap, times that go back, a nan that ends its order; size as collection_size
    taus = numbers("taus", taus, "the clients' segment times, a number or 1-D: at least one, each finite and > 0",
                   lambda t: (t > 0) & (t.ndim < 2))
    size = numbers("size", size, "an integer in 1..10**6", lambda s: s.clip(1, 10**6) == s, True, True)
    return t_of_s(taus.ravel().tolist(), int(size))


def ceiling(cfg: RunConfig, param_bytes: int = 0):
    """The predicted throughput ceiling of ``cfg`` (e.g. from :func:`configure`): ``.pushes_per_s``
    is the smallest of what the clients would push on idle resources and what each shared resource
    (a host's link, the server's link, the server's apply) can carry; ``.binding`` names the limit
    that sets it, ``.bounds`` holds them all, ``.cycle_s`` is one client's cycle alone. A push
    carries ``param_bytes`` (the model's size) unless ``cfg.cost.comm_params`` sets it, as the
    simulator's clock counts them (the lab's ``+exp=ceiling`` sets it: 244 MB). ``cost=fit``: of
    the fitted costs, as a run would simulate them. Raises ConfigError for a key outside its valid
    values, a replay (a recorded order, no cost model) or ``cost.compute_s=calibrate`` (a step
    measured only when a run starts)."""
    from repro.sim.ceiling import ceiling as bound
    from repro.sim.driver import resolve
    check_leaves(cfg)   # each key alone, not validate(): the bound takes a part-full host (5 clients, 4 a host)
    numbers("param_bytes", param_bytes, "a finite number >= 0 (the model's bytes)", lambda b: b >= 0, scalar=True)
    if cfg.cost.schedule == "replay":
        raise ConfigError("cost", "replay", "a cost model: a replay applies a recorded run's order")
    cfg = resolve(cfg).cfg   # cost=fit: the recordings' costs, else the costs as they are
    if isinstance(cfg.cost.compute_s, str):
        raise ConfigError("cost.compute_s", cfg.cost.compute_s, "seconds per step: the ceiling is "
                          "predicted from the profile alone (a run records its calibrated step in config.json)")
    return bound(cfg.cost, cfg.num_clients, cfg.nsync, param_bytes=param_bytes)
