"""Configuration: frozen dataclasses, parsed once at the entry point and validated.

Nothing below :mod:`repro.run` sees a Hydra ``DictConfig``: :func:`from_dict` turns the resolved
YAML tree (a plain nested dict) into a :class:`RunConfig`, checking every value's type and range
and every component name, and raises :class:`~repro.errors.ConfigError` naming the key, the bad
value and the valid choices. :func:`to_dict` is the inverse and is what ``config.json`` holds.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from repro.errors import ConfigError

SERVER_RULES = ("delta", "downpour", "adagrad")
JITTERS = ("none", "lognormal", "exponential")
BACKENDS = ("sim", "real")
STARTS = ("cold", "warm")
DEVICES = ("cpu", "cuda", "auto")


@dataclass(frozen=True)
class DataConfig:
    name: str = "digits"
    """Data set: digits, mnist1d, cifar10 or synthetic."""
    root: Optional[str] = None
    """Folder holding the data set's files (cifar10 only)."""
    num_train: Optional[int] = None
    """Use only this many training samples (None: all)."""
    num_test: Optional[int] = None
    """Use only this many test samples (None: all)."""


@dataclass(frozen=True)
class ModelConfig:
    name: str = "digits_cnn"
    """Network: mlp, digits_cnn, mnist1d_cnn or cifar_18pct."""


@dataclass(frozen=True)
class AlgoConfig:
    lr: float = 0.05
    """Client (local) learning rate of SGD, as cuda-convnet's epsW."""
    momentum: float = 0.5
    """Client momentum; the buffer stays on the client across exchanges."""
    weight_decay: float = 0.0
    """L2 weight decay, added to the gradient as torch.optim.SGD does."""
    batch_size: int = 32
    """Minibatch size of one client step."""
    server_rule: str = "delta"
    """How the server applies a push: delta (add the client's parameter change), downpour
    (w -= lr_server * accrued gradient) or adagrad (DistBelief's per-parameter Adagrad)."""
    lr_server: Optional[float] = None
    """Server step size; None picks the rule's default (delta: 1.0, downpour: lr, adagrad: 0.01)."""
    adagrad_eps: float = 1e-8
    """Added to Adagrad's denominator to avoid dividing by zero."""

    def resolved_lr_server(self) -> float:
        if self.lr_server is not None:
            return self.lr_server
        return {"delta": 1.0, "downpour": self.lr, "adagrad": 0.01}[self.server_rule]


@dataclass(frozen=True)
class CostConfig:
    profile: str = "uniform"
    """Name of the cost profile (a label saved with the run; 'replay' replays a recorded run)."""
    compute_s: Union[float, str] = 0.01
    """Virtual seconds per client minibatch step, or 'calibrate' to time real steps once."""
    jitter: str = "none"
    """Per-step compute-time noise: none, lognormal or exponential (mean-preserving, seeded)."""
    jitter_sigma: float = 0.0
    """lognormal: sigma of log-time; exponential: weight of the exponential part (0..1)."""
    straggler_client: Optional[int] = None
    """This client (1..num_clients) computes straggler_factor times slower; None: no straggler."""
    straggler_factor: float = 1.0
    latency_s: float = 0.0
    """One-way link latency of every push and fetch."""
    bandwidth_Bps: Optional[float] = None
    """Link bandwidth in bytes/s applied to the parameter bytes of each push and fetch; None: free."""
    comm_params: Optional[float] = None
    """Count communication as if the parameter vector had this many float32 entries (None: the
    model's real size); lets a small model stand in for an AlexNet-sized one (paper2013)."""
    server_apply_s: float = 0.0
    """Virtual seconds the server takes to apply one push; it serves one push at a time."""
    path: Optional[str] = None
    """With profile 'replay': the recorded run folder whose update order is replayed."""


@dataclass(frozen=True)
class BackendConfig:
    name: str = "sim"
    """sim (deterministic delay simulator) or real (torch.distributed processes)."""
    master_addr: str = "127.0.0.1"
    """Address of rank 0; loopback by default so a single-node run listens on no network."""
    master_port: int = 0
    """Port of rank 0's rendezvous; 0 picks a free one (single node only)."""
    timeout_s: float = 60.0
    """Bound on start-up and on every blocking receive; a peer silent this long is an error."""
    client_timeout_s: float = 30.0
    """The server declares a client lost when it has heard nothing from it for this long."""
    server_device: str = "cpu"
    """Where the server keeps its parameters: cpu or cuda."""
    eval_in_thread: bool = True
    """Evaluate snapshots in a server thread so evaluations never stall the push loop."""


@dataclass(frozen=True)
class RunConfig:
    exp_name: str = "default"
    """Experiment name: the results/<exp_name>/ folder."""
    seed: int = 0
    """Base seed: model init, each client's data order (seed, client) and the cost model's jitter."""
    num_clients: int = 4
    """Number of clients (GPU clients in the paper)."""
    nsync: int = 4
    """Local minibatch steps between exchanges (the paper's nsync = nfetch = npush)."""
    num_epochs: float = 20.0
    """Training budget: epochs of the training set consumed by all clients together."""
    eval_every: float = 1.0
    """Evaluate the server's parameters every this many epochs (by samples applied)."""
    target_error: float = 0.05
    """Training error whose first crossing time defines speedup (summary.json time_to_target)."""
    start: str = "cold"
    """cold: random initial weights; warm: start from the single-client baseline's checkpoint."""
    warm_start_epochs: float = 2.0
    """Warm start: epochs of single-client training behind the cached checkpoint."""
    checkpoint_every: int = 0
    """Server checkpoint every this many versions (0: never)."""
    resume: bool = False
    """Continue the run folder's run from its checkpoint."""
    force: bool = False
    """Re-run even if the run folder already holds a finished run."""
    device: str = "cpu"
    """Simulator device (cpu, cuda, auto); real driver clients use cuda:k when GPUs exist."""
    num_threads: int = 1
    """torch CPU threads per process (0: torch's default). Small models run fastest on one thread,
    and one thread per process keeps N real-driver clients from oversubscribing the cores."""
    progress: bool = True
    """Print progress lines on long runs."""
    results_dir: str = "results"
    """Where run folders and the warm-start cache live."""
    figures_dir: str = "figures"
    """Where +exp=figN writes its figure (png, pdf) and the numbers behind it (csv)."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------
# dict <-> dataclasses
# ---------------------------------------------------------------------------------------------

def to_dict(cfg: Any) -> dict:
    """The nested plain dict of a config dataclass (what config.json holds)."""
    return dataclasses.asdict(cfg)


def from_dict(tree: dict, cls: type = RunConfig, prefix: str = "") -> Any:
    """Build ``cls`` from a nested dict, type-checking every field; then range-check it all."""
    obj = _build(tree, cls, prefix)
    if cls is RunConfig:
        validate(obj)
    return obj


def _build(tree: Any, cls: type, prefix: str) -> Any:
    if not isinstance(tree, dict):
        raise ConfigError(prefix.rstrip(".") or "<root>", tree, "a mapping of keys to values")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(tree) - names)
    if unknown:
        raise ConfigError(prefix + unknown[0], tree[unknown[0]], "a known key: " + ", ".join(sorted(names)))
    kwargs = {}
    for name in names & set(tree):
        hint, key, value = hints[name], prefix + name, tree[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(value, hint, key + ".")
        else:
            kwargs[name] = _coerce(key, value, hint)
    return cls(**kwargs)


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Accept ``value`` for a field typed ``hint`` (int, float, str, bool, Optional, Union)."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise ConfigError(key, value, _type_name(options))
    for option in options:
        if option is bool and isinstance(value, bool):
            return value
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if option is str and isinstance(value, str):
            return value
    raise ConfigError(key, value, _type_name(options))


def _type_name(options: tuple) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             type(None): "null"}
    return " or ".join(names.get(o, str(o)) for o in options)


# ---------------------------------------------------------------------------------------------
# range and name checks
# ---------------------------------------------------------------------------------------------

def _choice(key: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(key, value, choices)


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok or value != value:  # value != value: NaN
        raise ConfigError(key, value, "a number >= 0" if allow_zero else "a number > 0")


def validate(cfg: RunConfig) -> None:
    """Range and name checks that need no data; :func:`check_components` does the rest."""
    if cfg.num_clients < 1:
        raise ConfigError("num_clients", cfg.num_clients, "an integer >= 1")
    if cfg.nsync < 1:
        raise ConfigError("nsync", cfg.nsync, "an integer >= 1 (local steps between exchanges)")
    _positive("num_epochs", cfg.num_epochs)
    _positive("eval_every", cfg.eval_every)
    if not 0 <= cfg.target_error <= 1:
        raise ConfigError("target_error", cfg.target_error, "a fraction in [0, 1]")
    _choice("start", cfg.start, STARTS)
    _positive("warm_start_epochs", cfg.warm_start_epochs)
    if cfg.checkpoint_every < 0:
        raise ConfigError("checkpoint_every", cfg.checkpoint_every, "an integer >= 0 (0: never)")
    _choice("device", cfg.device, DEVICES)
    if cfg.num_threads < 0:
        raise ConfigError("num_threads", cfg.num_threads, "an integer >= 0 (0: torch's default)")
    _validate_algo(cfg.algo)
    _validate_cost(cfg.cost, cfg.num_clients)
    _validate_backend(cfg.backend)
    if cfg.data.num_train is not None and cfg.data.num_train < 1:
        raise ConfigError("data.num_train", cfg.data.num_train, "an integer >= 1 or null")
    if cfg.data.num_test is not None and cfg.data.num_test < 1:
        raise ConfigError("data.num_test", cfg.data.num_test, "an integer >= 1 or null")


def _validate_algo(algo: AlgoConfig) -> None:
    _positive("algo.lr", algo.lr)
    if not 0 <= algo.momentum < 1:
        raise ConfigError("algo.momentum", algo.momentum, "a number in [0, 1)")
    _positive("algo.weight_decay", algo.weight_decay, allow_zero=True)
    if algo.batch_size < 1:
        raise ConfigError("algo.batch_size", algo.batch_size, "an integer >= 1")
    _choice("algo.server_rule", algo.server_rule, SERVER_RULES)
    if algo.lr_server is not None:
        _positive("algo.lr_server", algo.lr_server)
    _positive("algo.adagrad_eps", algo.adagrad_eps)


def _validate_cost(cost: CostConfig, num_clients: int) -> None:
    if isinstance(cost.compute_s, str):
        if cost.compute_s != "calibrate":
            raise ConfigError("cost.compute_s", cost.compute_s, "a number > 0 or 'calibrate'")
    else:
        _positive("cost.compute_s", cost.compute_s)
    _choice("cost.jitter", cost.jitter, JITTERS)
    _positive("cost.jitter_sigma", cost.jitter_sigma, allow_zero=True)
    if cost.jitter == "exponential" and cost.jitter_sigma > 1:
        raise ConfigError("cost.jitter_sigma", cost.jitter_sigma, "a weight in [0, 1] for exponential jitter")
    if cost.straggler_client is not None and not 1 <= cost.straggler_client <= num_clients:
        raise ConfigError("cost.straggler_client", cost.straggler_client,
                          f"null or a client id in 1..{num_clients}")
    _positive("cost.straggler_factor", cost.straggler_factor)
    _positive("cost.latency_s", cost.latency_s, allow_zero=True)
    if cost.bandwidth_Bps is not None:
        _positive("cost.bandwidth_Bps", cost.bandwidth_Bps)
    if cost.comm_params is not None:
        _positive("cost.comm_params", cost.comm_params)
    _positive("cost.server_apply_s", cost.server_apply_s, allow_zero=True)
    if cost.profile == "replay" and not cost.path:
        raise ConfigError("cost.path", cost.path, "the folder of a recorded run to replay (cost=replay cost.path=RUN_DIR)")


def _validate_backend(backend: BackendConfig) -> None:
    _choice("backend.name", backend.name, BACKENDS)
    if not 0 <= backend.master_port <= 65535:
        raise ConfigError("backend.master_port", backend.master_port, "a port in 0..65535 (0: pick a free one)")
    _positive("backend.timeout_s", backend.timeout_s)
    _positive("backend.client_timeout_s", backend.client_timeout_s)
    _choice("backend.server_device", backend.server_device, ("cpu", "cuda"))


def check_components(cfg: RunConfig, input_shape: tuple, num_classes: int) -> None:
    """Checks that need the data set: the model must accept its shape."""
    from repro.models import check_fits  # local import: models pulls in torch.nn

    check_fits(cfg.model.name, input_shape, num_classes, cfg.data.name)
