"""Configuration: the frozen dataclasses of every key (each declared with :func:`knob`), and what derives
from their declaration: the keys, those that shape training (:func:`shaping_keys`), and :func:`to_dict`
(what config.json holds; :func:`repro.config.checks.from_dict` is the way back). See docs/configuration.md.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import typing
from dataclasses import dataclass
from typing import Any, Optional, Union

from repro.config.cost import CostConfig
from repro.config.fields import COUNT, FLAG, WAIT_S, Choice, Numbers, Range, Text, check_known, knob
from repro.registry import names_of

DEVICES = ("cpu", "cuda", "auto")
# what data.root must hold for data=cifar10 (checked when the config is, said again by the loader)
CIFAR10_EXPECTED = ("a folder with the CIFAR-10 python batches data_batch_1..5 and test_batch "
                    "(cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, extracted)")


@dataclass(frozen=True)
class DataConfig:
    name: str = knob("digits", Choice(names_of("data.name"), custom=True))
    """Data set (all offline)."""
    root: Optional[str] = knob(None, Text("a folder", nullable=True), shapes=False)
    """Folder holding the data set's files (cifar10 only)."""
    num_train: Optional[int] = knob(None, COUNT)
    """Use only this many training samples (null: all; mnist1d and synthetic generate this many)."""
    num_test: Optional[int] = knob(None, COUNT)
    """Use only this many test samples (null: all)."""
    partition: str = knob("iid", Choice(("iid", "shards", "by_class", "dirichlet")))
    """Which training samples each client holds (repro/workload/partition.py, seeded by seed):
    iid (every client its own order over the whole set), shards (disjoint random equal parts),
    by_class (classes dealt to clients in turn), dirichlet (each class split over the clients
    by Dirichlet(data.alpha) proportions, Hsu et al. 2019)."""
    alpha: float = knob(0.5, Range(0.0, 1e6, lo_open=True))
    """dirichlet: the concentration; small (0.1) gives each client a few classes, large (100)
    nearly the iid mix."""
    slow_client_classes: Optional[tuple[int, ...]] = knob(None, Numbers(0, 10**6, integer=True, nullable=True))
    """These classes are held by the slow client alone (cost.straggler_client, else the client
    with the largest step time of cost.speeds or cost.speed_law); data.partition splits the
    other classes over the other clients. null: no such tie."""


@dataclass(frozen=True)
class ModelConfig:
    name: str = knob("digits_cnn", Choice(names_of("model.name"), custom=True))
    """Network; it must be made for the data's input shape."""


@dataclass(frozen=True)
class AlgoConfig:
    lr: float = knob(0.05, Range(0.0, 1e9, lo_open=True))
    """Client (local) learning rate of SGD, as cuda-convnet's epsW."""
    momentum: float = knob(0.5, Range(0.0, 0.999999))
    """Client momentum; the buffer stays on the client across exchanges."""
    weight_decay: float = knob(0.0, Range(0.0, 1e3))
    """L2 weight decay, added to the gradient as torch.optim.SGD does."""
    batch_size: int = knob(32, Range(1, 10**6, integer=True))
    """Minibatch size of one client step (at most the training-set size)."""
    server_rule: str = knob("delta", Choice(names_of("algo.server_rule")))
    """How the server applies a push: delta (add the client's parameter change), downpour
    (w -= lr_server * accrued gradient), adagrad (DistBelief's per-parameter Adagrad),
    staleness_scaled, dcasgd, easgd (asynchronous elastic averaging, Zhang, Choromanska, LeCun
    2015; protocol=async), outer_nesterov (an outer Nesterov step on each parameter change:
    DiLoCo, Douillard et al. 2023, with protocol=sync; asynchronous local SGD, Liu et al. 2024)."""
    lr_server: Optional[float] = knob(None, Range(0.0, 1e9, lo_open=True, nullable=True))
    """Server step size; null picks the rule's default (delta: 1.0, downpour: lr, adagrad: 0.01);
    must stay null for easgd (algo.elastic_alpha) and outer_nesterov (algo.outer_lr)."""
    adagrad_eps: float = knob(1e-8, Range(0.0, 1.0, lo_open=True))
    """Added to Adagrad's denominator to avoid dividing by zero."""
    dc_lambda: float = knob(0.04, Range(0.0, 1e6))
    """DC-ASGD's variance-control lambda (Zheng et al. 2017; 0.04 is their DC-ASGD-c value)."""
    elastic_alpha: Optional[float] = knob(None, Range(0.0, 1.0, lo_open=True, hi_open=True, nullable=True))
    """easgd: the moving rate alpha; each exchange moves the client toward the centre by alpha and
    the centre toward the client by alpha. null: 0.9 / num_clients, the paper's beta = p alpha =
    0.9 (Zhang, Choromanska, LeCun 2015)."""
    outer_lr: float = knob(0.7, Range(0.0, 1e9, lo_open=True))
    """outer_nesterov: the outer learning rate (0.7: DiLoCo, Douillard et al. 2023)."""
    outer_momentum: float = knob(0.9, Range(0.0, 0.999999))
    """outer_nesterov: the outer Nesterov momentum (0.9: DiLoCo)."""
    outer_delay: int = knob(1, Range(1, 10**6, integer=True))
    """outer_nesterov: update the momentum once every this many applies, each apply stepping by
    1/outer_delay of its change in between (delayed Nesterov, Liu et al. 2024, who set it to the
    number of clients with protocol=async); 1: Nesterov at every apply."""

    def resolved_lr_server(self) -> float:
        if self.lr_server is not None:
            return self.lr_server
        return {"delta": 1.0, "adagrad": 0.01}.get(self.server_rule, self.lr)

    def resolved_elastic_alpha(self, num_clients: int) -> float:
        """easgd's alpha: as set, else beta / p with the paper's beta = 0.9 (its Sec. 5)."""
        return self.elastic_alpha if self.elastic_alpha is not None else 0.9 / num_clients


@dataclass(frozen=True)
class BackendConfig:
    name: str = knob("sim", Choice(("sim", "real")))
    """sim (deterministic delay simulator) or real (torch.distributed processes). The other keys
    are the real driver's (conf/backend/real.yaml)."""
    master_addr: str = knob("127.0.0.1", Text("a host name or address"), shapes=False)
    """Address of rank 0; loopback by default so a single-node run listens on no network."""
    master_port: int = knob(0, Range(0, 65535, integer=True), shapes=False)
    """Port of rank 0's rendezvous; 0 picks a free one (single node only)."""
    # at least 0.1 s: the server's own connect to its rendezvous store is bounded by it, and one
    # of 1 ms or less failed with c10d's traceback (a loopback run needs some 50 ms)
    timeout_s: float = knob(60.0, Range(0.1, WAIT_S.hi), shapes=False)
    """Bound on every blocking receive (at least 0.1 s), per process on start-up (the start-up deadline grows
    with the number of clients), and between two batches of an evaluation the run waits for (version 0's,
    the final one, one still running as it ends)."""
    client_timeout_s: float = knob(30.0, WAIT_S, shapes=False)
    """The server declares a client lost when it has heard nothing from it for this long."""
    server_device: str = knob("cpu", Choice(("cpu", "cuda")))
    """Where the server keeps its parameters."""
    client_device: str = knob("auto", Choice(DEVICES))
    """Where clients train: auto (a GPU each when CUDA is visible, else the CPU), cpu or cuda."""
    eval_in_thread: bool = knob(True, FLAG, shapes=False)
    """Evaluate snapshots in a server thread so evaluations never stall the push loop; false: the
    loop waits for each, at most backend.timeout_s (one that takes longer goes on in its thread)."""
    max_clients: Optional[int] = knob(None, Range(1, 4096, integer=True, nullable=True), shapes=False)
    """Most clients training at once, joiners included (a lost client's place may be taken by a
    joiner for the whole run); null: num_clients (replacements only)."""
    join: Optional[str] = knob(None, Text("HOST:PORT of a running run", nullable=True), shapes=False)
    """Do not start a run: join the running run whose server listens at HOST:PORT (its log says
    'accepting joins at ...') as one more client, with the same overrides."""
    join_client: Optional[int] = knob(None, Range(1, 10**6, integer=True, nullable=True), shapes=False)
    """With backend.join: rejoin as this lost client id (a restarted client); null: a new id."""


@dataclass(frozen=True)
class ProtocolConfig:
    name: str = knob("async", Choice(names_of("protocol.name")))
    """When the server applies and clients fetch: async (Downpour, the paper), sync
    (bulk-synchronous rounds, mean update), ssp (stale synchronous parallel), ringmaster
    (async, pushes of staleness >= R discarded; Maranjyan, Tyurin, Richtarik 2025), rennala
    (the mean of S pushes from the current parameters; Tyurin & Richtarik 2023)."""
    backup_workers: int = knob(0, Range(0, 1023, integer=True))
    """sync: a round closes at the first num_clients - b pushes; the b late ones are discarded
    (Chen et al. 2016)."""
    staleness_bound: int = knob(3, Range(0, 10**6, integer=True))
    """ssp: a client more than this many pushes ahead of the slowest live client waits
    (Ho et al. 2013); 0 behaves like sync rounds, a large value like async."""
    staleness_threshold: Optional[int] = knob(None, Range(1, 10**6, integer=True, nullable=True))
    """ringmaster: a push whose staleness reaches this threshold R is discarded, its client
    fetches and goes on (Maranjyan, Tyurin, Richtarik 2025). null: the clients live (num_clients
    without churn or joins; see resolved_staleness_threshold)."""
    cancel_stale: bool = knob(False, FLAG)
    """ringmaster: stop a client as soon as its segment's staleness reaches R (it could only be
    discarded) and send it the current parameters (the paper's variant with calculation stops,
    its Algorithm 5: a client is stopped every time its segment reaches R)."""
    stop_once: bool = knob(False, FLAG)
    """ringmaster with cancel_stale: a client stopped is not stopped again before a push of its
    from the new parameters has arrived (that push is discarded on arrival if stale): a departure
    from the paper, which backend=real needs (a client can hold only one unread preemption);
    false: the paper's Algorithm 5 (the simulator only)."""
    collection_size: Optional[int] = knob(None, Range(1, 10**6, integer=True, nullable=True))
    """rennala: the server applies the mean of S pushes computed from its current parameters, a
    fast client contributing several (Tyurin, Richtarik 2023); at most 100 x num_clients, and S x
    nsync at most the budget in minibatches. null: the clients live at each push (num_clients
    without churn or joins)."""

    def resolved_staleness_threshold(self, num_clients: int) -> int:
        """ringmaster's R: as set, else N, the clients live (joins and losses change it mid-run)."""
        return self.staleness_threshold if self.staleness_threshold is not None else num_clients

    def resolved_collection_size(self, num_clients: int) -> int:
        """rennala's S: as set, else N, the clients live at the push, as a sync round counts them."""
        return self.collection_size if self.collection_size is not None else num_clients


@dataclass(frozen=True)
class RunConfig:
    exp_name: str = knob("default", Text("a folder name"), shapes=False)
    """Experiment name: the results/<exp_name>/ folder."""
    seed: int = knob(0, Range(0, 2**31 - 1, integer=True))
    """Base seed: model init, each client's data order (seed, client) and the cost model's jitter."""
    num_clients: int = knob(4, Range(1, 1024, integer=True))
    """Number of clients (GPU clients in the paper)."""
    nsync: int = knob(4, Range(1, 10**6, integer=True))
    """Local minibatch steps between exchanges (the paper's nsync = nfetch = npush)."""
    num_epochs: float = knob(20.0, Range(0.0, 1e5, lo_open=True))
    """Training budget: epochs of the training set consumed by all clients together."""
    eval_every: float = knob(1.0, Range(1e-3, 1e5))
    """Evaluate the server's parameters every this many epochs (by samples applied)."""
    divergence_factor: float = knob(10.0, Range(1.0, 1e6, lo_open=True))
    """A push whose mean training loss exceeds this many times the reference loss (the larger of
    the version-0 training loss and ln(classes), a uniform guess) ends the run 'diverged'. At 10,
    on 10 classes: ~23 nats, the right class at probability ~1e-10 on average."""
    target_error: float = knob(0.05, Range(0.0, 1.0))
    """Training error whose first crossing time defines speedup (summary.json time_to_target)."""
    start: str = knob("cold", Choice(("cold", "warm")))
    """cold: random initial weights; warm: start from the single-client baseline's checkpoint."""
    warm_start_epochs: float = knob(2.0, Range(0.0, 1e5, lo_open=True))
    """Warm start: epochs of single-client training behind the cached checkpoint."""
    checkpoint_every: int = knob(0, Range(0, 10**9, integer=True), shapes=False)
    """Server checkpoint every this many versions (0: only the final one)."""
    resume: Union[bool, str] = knob(False, Choice((False, True, "auto")), shapes=False)
    """true: continue the folder's interrupted run from its checkpoint; auto: continue it if
    there is one, else start (for launchers that restart jobs, e.g. torchrun --max-restarts)."""
    force: bool = knob(False, FLAG, shapes=False)
    """Start the run folder over even if it holds a finished or interrupted run."""
    device: str = knob("cpu", Choice(DEVICES))
    """Simulator device (cpu, cuda, auto); the real driver's clients: backend.client_device."""
    num_threads: int = knob(1, Range(0, 1024, integer=True))
    """torch CPU threads per process (0: torch's default). Results are bit-for-bit identical only
    at the same thread count. One thread keeps N real-driver clients off each other's cores."""
    progress: bool = knob(True, FLAG, shapes=False)
    """Print progress lines on long runs."""
    results_dir: str = knob("results", Text("a folder"), shapes=False)
    """Where run folders and the warm-start cache live."""
    figures_dir: str = knob("figures", Text("a folder"), shapes=False)
    """Where +exp=NAME writes its figure (png, pdf) and the numbers behind it (csv)."""
    data: DataConfig = knob(DataConfig, None)
    model: ModelConfig = knob(ModelConfig, None)
    algo: AlgoConfig = knob(AlgoConfig, None)
    cost: CostConfig = knob(CostConfig, None)
    backend: BackendConfig = knob(BackendConfig, None)
    protocol: ProtocolConfig = knob(ProtocolConfig, None)

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with ``changes``, numpy scalars (a group's fields' too) as Python values (:func:`plain`)."""
        check_known(changes, RunConfig, all_keys())   # dataclasses' TypeError named no group: lr is algo.lr
        return dataclasses.replace(self, **{k: plain(v) for k, v in changes.items()})


def plain(value: Any) -> Any:
    """``value``, its numpy scalars (a group's fields' too) as Python values: config.json holds no numpy type
    (an array stays one, for the check to refuse naming its key)."""
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)})
    return value


@functools.cache
def _leaves(cls: type = RunConfig, prefix: str = "") -> tuple:
    """(dotted key, dataclass field, the dataclass declaring it) of every leaf setting, in declaration order."""
    hints = typing.get_type_hints(cls)
    return tuple(leaf for f in dataclasses.fields(cls) for leaf in (_leaves(hints[f.name], prefix + f.name + ".")
                 if dataclasses.is_dataclass(hints[f.name]) else [(prefix + f.name, f, cls)]))


def all_keys() -> tuple[str, ...]:
    """Every settable key, dotted (``seed``, ``algo.lr``, ...)."""
    return tuple(key for key, _, _ in _leaves())


def shaping_keys() -> tuple[str, ...]:
    """The keys that shape training: run-folder names, warm-start cache keys, replays and resumes read them."""
    return tuple(key for key, f, _ in _leaves() if f.metadata["shapes"])


def valid_values(key: str) -> str:
    return {k: f for k, f, _ in _leaves()}[key].metadata["valid"].describe()   # KeyError: a key the schema lacks


_ABSENT = object()


def get(tree: dict, key: str, default: Any = _ABSENT) -> Any:
    """The value at a dotted ``key`` of a nested dict; ``default`` where there is none (without
    one: KeyError, or TypeError where a value stands on the key's path)."""
    try:
        return functools.reduce(operator.getitem, key.split("."), tree)
    except (KeyError, TypeError):
        if default is _ABSENT:
            raise
        return default


def shaping_values(cfg: "RunConfig | dict") -> dict[str, Any]:
    """{key: value} of every training-shaping key (missing keys of an old config.json: absent)."""
    tree = to_dict(cfg) if not isinstance(cfg, dict) else cfg
    absent = object()   # a key may hold None
    return {key: value for key in shaping_keys() if (value := get(tree, key, absent)) is not absent}


def with_operational(recorded: dict, cfg: "RunConfig") -> dict:
    """``recorded``'s (a config.json read by :func:`repro.config.renames.read_recorded`) training-shaping
    settings with ``cfg``'s other settings: what a replay trains, run the way ``cfg`` says."""
    tree = {k: v for k, v in recorded.items() if k not in RECORDED_ONLY}
    mine = to_dict(cfg)
    for key in (key for key, f, _ in _leaves() if not f.metadata["shapes"]):
        *path, leaf = key.split(".")
        functools.reduce(lambda parent, part: parent.setdefault(part, {}), path, tree)[leaf] = get(mine, key)
    return tree


def unknown_keys(recorded: dict, prefix: str = "") -> list[str]:
    """The dotted keys of a config.json (:func:`repro.config.renames.read_recorded`) that are neither a
    setting of this version nor :data:`RECORDED_ONLY`."""
    known, out = set(all_keys()) | set(RECORDED_ONLY), []
    for name, value in ((prefix + key, value) for key, value in recorded.items()):
        if name not in known:   # a group (algo, or one this version lacks) is read key by key
            out += unknown_keys(value, name + ".") if isinstance(value, dict) else [name]
    return out


def differences(recorded: dict, cfg: "RunConfig") -> list[str]:
    """'key: recorded -> now' for every training-shaping key that differs (``recorded``: a config.json)."""
    old, new = shaping_values(recorded), shaping_values(cfg)
    # a calibrated compute time is recorded as the measured number: 'calibrate' matches it
    same = lambda k: old[k] == new[k] or (new[k] == "calibrate" and isinstance(old[k], float))  # noqa: E731
    return [f"{k}: {old[k]!r} -> {new[k]!r}" for k in new if k in old and not same(k)]


def to_dict(cfg: Any) -> dict:
    """The nested plain dict of a config dataclass (what config.json holds; tuples as lists, as JSON gives them)."""
    return dataclasses.asdict(cfg, dict_factory=lambda items: {k: list(v) if isinstance(v, tuple) else v
                                                                for k, v in items})


@dataclass(frozen=True)
class Resolved:
    """What :func:`repro.run.resolve` hands the simulator: the config it runs as it is, and the cost fit it
    was made with (None: no fit; recorded under "fit")."""
    cfg: RunConfig
    fit: dict | None = None


# what config.json holds beside the settings (docs/getting-started.md, "What a run leaves behind")
RECORDED_ONLY = ("environment", "network", "dataset", "host", "fit", "overrides")


def client_slot(num_clients: int, client: int) -> int:
    """What is per client (speeds, data shards) for ``client``: a joiner's id may exceed
    num_clients, and joiner k takes slot ((k - 1) mod N) + 1."""
    return (client - 1) % num_clients + 1


def slow_client(cfg: RunConfig) -> int | None:
    """The client that ``data.slow_client_classes`` ties to: ``cost.straggler_client``, else the
    one client with the largest relative step time (None: no single slowest client)."""
    if cfg.cost.straggler_client is not None:
        return cfg.cost.straggler_client
    times = [cfg.cost.speed(k) for k in range(1, cfg.num_clients + 1)]
    slowest = max(times)
    return times.index(slowest) + 1 if times.count(slowest) == 1 else None
