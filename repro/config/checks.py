"""From a plain dict to a valid :class:`RunConfig`: :func:`from_dict` builds and type-checks it,
:func:`validate` checks each key's values and the relations between keys, :func:`check_places` where
a run writes. Each raises :class:`~repro.errors.ConfigError` naming the key, before any work.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Union

from repro.config.fields import check_known
from repro.config.renames import modern_tree
from repro.config.settings import (CIFAR10_EXPECTED, RECORDED_ONLY, DataConfig, RunConfig, _leaves, all_keys, get,
                                   slow_client, to_dict)
from repro.errors import ConfigError
from repro.files.storage import nearest_existing


def from_dict(tree: dict, cls: type = RunConfig, prefix: str = "") -> Any:
    """Build ``cls`` from a nested dict, type-checking every field; then range-check it all
    (:data:`RECORDED_ONLY` keys ignored at the top level)."""
    if isinstance(tree, dict):   # old flat spellings read, with a line each (a group's too: "cost.")
        ignored = RECORDED_ONLY if cls is RunConfig else ()
        tree = modern_tree({k: v for k, v in tree.items() if k not in ignored}, prefix=prefix)
    obj = _build(tree, cls, prefix)
    if cls is RunConfig:
        validate(obj)
        check_places(obj)
    else:
        check_leaves(obj, cls, prefix)
    return obj


NAME_BYTES = 255   # the longest file name Linux, macOS and Windows file systems take
CACHE_PREFIX = "_"   # results_dir/_warmstart and results_dir/_data are the package's caches


def check_places(cfg: RunConfig) -> None:
    """Where a run writes: ``exp_name`` one folder inside ``results_dir`` (no path out of it, not a cache's
    name); ``results_dir`` and ``figures_dir`` folders, or places one can be made."""
    name = cfg.exp_name
    if name in ("", ".", "..") or "/" in name or "\\" in name or name.startswith(CACHE_PREFIX):
        raise ConfigError("exp_name", name, "a plain folder name inside results_dir: not empty, '.' or "
                          f"'..', no '/', not starting with '{CACHE_PREFIX}' (results_dir keeps its caches "
                          "_warmstart and _data there); e.g. exp_name=my_experiment")
    if len(name.encode()) > NAME_BYTES:   # Hydra's mkdir would end in a raw 'File name too long'
        raise ConfigError("exp_name", name, f"a folder name of at most {NAME_BYTES} bytes (it has "
                          f"{len(name.encode())}; it names the experiment's folder in hydra.run.dir)")
    for key in ("results_dir", "figures_dir"):
        value = getattr(cfg, key)
        # Hydra's folder names expand neither: '' put a run at /default/..., a quoted ~ made a folder '~'
        if not value.strip() or value.startswith("~"):
            raise ConfigError(key, value, "a folder, not empty ('.' is the working folder) and not starting "
                              "with '~' (write $HOME/...)")
        existing = nearest_existing(Path(value))
        if existing is not None and not existing.is_dir():
            raise ConfigError(key, value, f"a folder ({existing} is a file): choose another {key}")


def _build(tree: Any, cls: type, prefix: str) -> Any:
    if not isinstance(tree, dict):
        raise ConfigError(prefix.rstrip(".") or "<root>", tree, "a mapping of keys to values")
    hints = typing.get_type_hints(cls)
    names = check_known(tree, cls, all_keys(), prefix)
    return cls(**{name: _build(tree[name], hints[name], f"{prefix}{name}.") if dataclasses.is_dataclass(hints[name])
                  else _coerce(prefix + name, tree[name], hints[name]) for name in names & set(tree)})


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Accept ``value`` for a field typed ``hint`` (int, float, str, bool, None, a tuple of one
    of them, or a Union of these): a bool is no number, an int is a float where one is wanted."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    for option in options:
        if typing.get_origin(option) is tuple:
            if isinstance(value, (list, tuple)):   # tuple[float, ...]: a list setting
                return tuple(_coerce(key, v, typing.get_args(option)[0]) for v in value)
        elif option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        elif isinstance(value, option) and (option is bool or not isinstance(value, bool)):
            return value
    raise ConfigError(key, value, _type_name(options))


def _type_name(options: tuple) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    return " or ".join(f"a list of {_type_name(typing.get_args(o)[:1])[2:]}s" if typing.get_origin(o) is tuple
                       else names.get(o, str(o)) for o in options)


def check_leaves(obj: Any, cls: type = RunConfig, prefix: str = "") -> None:
    """``obj`` a ``cls``, each key alone against its declared values, not the relations between keys."""
    if not isinstance(obj, cls):   # the API's run_config(None), ceiling(None): "asdict() should be called on ..."
        raise ConfigError("cfg", obj, "a RunConfig, e.g. repro.api.configure(...)")
    tree = to_dict(obj)
    for key, f, _ in _leaves(cls, prefix):
        group = key[len(prefix):].rpartition(".")[0]
        if group and not isinstance(get(tree, group, None), dict):   # cfg.replace(protocol="sync")
            raise ConfigError(prefix + group, get(tree, group, None),
                              f"its settings: dataclasses.replace(cfg.{prefix}{group}, ...)")
        f.metadata["valid"].check(key, get(tree, key[len(prefix):]))


# the run core fails a run that applies nothing for this many pushes per live client
# (repro.runs.core.STALL_PUSHES is this bound): a rennala collection must fit in it
MAX_PUSHES_PER_CLIENT = 100


def validate(cfg: RunConfig) -> None:
    """Every key against its declared valid values, then the checks that relate keys (no data needed: the
    model and batch against the data are :func:`repro.workload.build.check_components`')."""
    check_leaves(cfg)
    if cfg.num_epochs / cfg.eval_every > 1e5:
        raise ConfigError("eval_every", cfg.eval_every, f"at least num_epochs / 1e5 = "
                          f"{cfg.num_epochs / 1e5:g} (at most 100000 evaluations per run)")
    if cfg.force and cfg.resume:   # force won silently: the run to continue was thrown away
        raise ConfigError("resume", cfg.resume, "false with force=true (force=true starts the folder over, "
                          f"resume={str(cfg.resume).lower()} continues its run: keep one)")
    if cfg.data.num_train is not None:   # the training-set size is known before any data
        check_segment(cfg, cfg.data.num_train)
    if cfg.data.name == "cifar10" and not cfg.data.root:
        raise ConfigError("data.root", cfg.data.root, CIFAR10_EXPECTED)
    if protocol_reads(cfg.protocol, "backup_workers") and cfg.protocol.backup_workers >= cfg.num_clients:
        raise ConfigError("protocol.backup_workers", cfg.protocol.backup_workers,
                          f"an integer in 0..{cfg.num_clients - 1} (fewer than num_clients)")
    algo, protocol = cfg.algo, cfg.protocol
    if algo.server_rule in ("easgd", "outer_nesterov") and algo.lr_server is not None:
        own = "algo.elastic_alpha" if algo.server_rule == "easgd" else "algo.outer_lr"
        raise ConfigError("algo.lr_server", algo.lr_server,
                          f"null with algo.server_rule={algo.server_rule} (its step is {own})")
    if algo.server_rule == "easgd" and protocol.name != "async":
        # the client moves by the elastic difference its own push made, which it reads from the
        # centre in its reply: the reply must follow that apply at once
        raise ConfigError("protocol.name", protocol.name, "async with algo.server_rule=easgd "
                          "(asynchronous EASGD: each exchange is answered at once)")
    if cfg.backend.name == "real" and protocol.name == "ringmaster" and protocol.cancel_stale \
            and not protocol.stop_once:
        # a real client holds one unread preemption: a second, sent while it pushes, deadlocks
        # the server (repro.asgd.optimal, "one preemption at a time")
        raise ConfigError("protocol.stop_once", protocol.stop_once, "true with backend=real and "
                          "protocol.cancel_stale=true (the real driver stops a client once per push; "
                          "the paper's stops at every apply are the simulator's)")
    most = MAX_PUSHES_PER_CLIENT * cfg.num_clients
    if protocol.name == "rennala" and protocol.resolved_collection_size(cfg.num_clients) > most:
        raise ConfigError("protocol.collection_size", protocol.collection_size,
                          f"null or an integer in 1..{most} (at most {MAX_PUSHES_PER_CLIENT} pushes "
                          f"per client in one collection, with num_clients={cfg.num_clients})")
    _check_elastic(cfg)
    cost = cfg.cost
    if cost.jitter == "exponential" and cost.jitter_sigma > 1:
        raise ConfigError("cost.jitter_sigma", cost.jitter_sigma, "a weight in [0, 1] for exponential jitter")
    if cost.straggler_client is not None and not 1 <= cost.straggler_client <= cfg.num_clients:
        raise ConfigError("cost.straggler_client", cost.straggler_client,
                          f"null or a client id in 1..{cfg.num_clients}")
    if cost.schedule == "replay" and not cost.path:
        raise ConfigError("cost.path", cost.path,
                          "the folder of a recorded run to replay (cost=replay cost.path=RUN_DIR)")
    if cost.schedule == "replay" and cfg.backend.name == "real":   # the real driver has no schedule: it trained anew
        raise ConfigError("backend", "real",
                          "sim with cost=replay (a replay re-applies a recorded run in the simulator)")
    if cfg.backend.name == "real" and cfg.device != RunConfig.device:   # else a folder named device=cuda ran on CPU
        raise ConfigError("device", cfg.device, f"{RunConfig.device} with backend=real (the key is the simulator's; "
                          "the real driver's: backend.server_device, backend.client_device)")
    if cost.profile == "fit" and cost.schedule == "events" and not str(cost.path or "").replace(":", "").strip():
        # without a recording nothing is fitted: the run would go on the uniform profile's costs
        raise ConfigError("cost.path", cost.path, "the folders of recorded runs to fit, separated by ':' "
                          "(cost=fit cost.path=RUN_DIR[:RUN_DIR...])")
    _check_topology(cfg)
    if cost.speeds is not None and len(cost.speeds) != cfg.num_clients:
        raise ConfigError("cost.speeds", list(cost.speeds), f"a list of num_clients={cfg.num_clients} relative step "
                          f"times, one per client (it has {len(cost.speeds)}), e.g. cost.speeds=[" +
                          ",".join(["1"] * cfg.num_clients) + "]")
    if cost.speeds is not None and cost.speed_law != "none":
        raise ConfigError("cost.speed_law", cost.speed_law, "none when cost.speeds is set (one or the other)")
    # data.*, as far as it goes without the data (repro/workload/partition.py checks the rest)
    data = cfg.data
    if data.partition != "dirichlet" and data.alpha != DataConfig.alpha:
        raise ConfigError("data.alpha", data.alpha, f"{DataConfig.alpha:g} with data.partition={data.partition} "
                          "(the key acts only with data.partition=dirichlet)")
    if data.slow_client_classes is not None and cfg.num_clients < 2:
        raise ConfigError("data.slow_client_classes", list(data.slow_client_classes), "null with num_clients=1 "
                          "(the slow client's classes are held by it alone: the other classes need another client)")
    if data.slow_client_classes is not None and slow_client(cfg) is None:
        raise ConfigError("data.slow_client_classes", list(data.slow_client_classes), "null, or a slow client to "
                          "hold them: set cost.straggler_client, or cost.speeds / cost.speed_law with one "
                          "slowest client")
    if data.slow_client_classes is not None and len(set(data.slow_client_classes)) != len(data.slow_client_classes):
        raise ConfigError("data.slow_client_classes", list(data.slow_client_classes), "distinct class labels")
    object.__setattr__(cfg, _VALIDATED, True)   # this object, not its value: a replace() is new


_VALIDATED = "_validated"   # an attribute outside the dataclass's fields (not compared, not hashed)


def validated(cfg: RunConfig) -> RunConfig:
    """``cfg``, validated unless :func:`validate` passed this object (``cfg.replace(...)`` makes a new one):
    the drivers' one check, at their entry."""
    if not getattr(cfg, _VALIDATED, False):
        validate(cfg)
    return cfg


def check_segment(cfg: RunConfig, num_train: int) -> None:
    """One push, or one apply's merged pushes, within the whole budget in minibatches (docs/configuration.md):
    checked by :func:`validate` when ``data.num_train`` is set, and by the run core on the loaded data."""
    budget = cfg.num_epochs * num_train
    most = max(1, math.ceil(budget / cfg.algo.batch_size))   # the budget in minibatches
    why = (f"the budget in minibatches (num_epochs x {num_train} training samples / algo.batch_size "
           f"{cfg.algo.batch_size}) is {most}")
    if cfg.nsync > most:
        raise ConfigError("nsync", cfg.nsync, f"at most {most}, {why}: one push may not exceed the "
                          "whole run; lower nsync or raise num_epochs")
    merged, p = pushes_per_apply(cfg), cfg.protocol
    if merged * cfg.nsync > most:
        key = "protocol.collection_size" if p.name == "rennala" and p.collection_size is not None else "num_clients"
        spare = p.backup_workers if p.name == "sync" else 0
        raise ConfigError(key, p.collection_size if key != "num_clients" else cfg.num_clients,
                          f"at most {most // cfg.nsync + spare} with protocol={p.name} and nsync={cfg.nsync}: "
                          f"{why}, and one apply merges {merged} pushes of nsync minibatches, which may not "
                          "exceed the whole run; lower it or nsync, or raise num_epochs")


def pushes_per_apply(cfg: RunConfig) -> int:
    """The pushes one apply merges: a sync round's N - b, a rennala collection's S, else one."""
    p = cfg.protocol
    return {"sync": cfg.num_clients - p.backup_workers,
            "rennala": p.resolved_collection_size(cfg.num_clients)}.get(p.name, 1)


# the protocol.* keys each built-in protocol reads (a protocol registered by a user may read any)
PROTOCOL_KEYS = {"async": (), "sync": ("backup_workers",), "ssp": ("staleness_bound",),
                 "ringmaster": ("staleness_threshold", "cancel_stale", "stop_once"), "rennala": ("collection_size",)}


def protocol_reads(protocol, key: str) -> bool:
    """Whether the run's protocol may read ``protocol.KEY``: only it checks the key against others."""
    return key in PROTOCOL_KEYS.get(protocol.name, (key,))


def ignored_protocol_keys(cfg: RunConfig) -> list[str]:
    """``protocol.KEY=VALUE`` of each key set away from its default that the run's built-in protocol does
    not read: warned of, not refused (a grid sweeps protocols under one setting)."""
    p = cfg.protocol
    return [f"protocol.{f.name}={getattr(p, f.name)}" for f in dataclasses.fields(p)
            if f.name != "name" and not protocol_reads(p, f.name) and getattr(p, f.name) != f.default]


def _check_topology(cfg: RunConfig) -> None:
    """cost.shared.* and cost.machine.* only under cost.topology=shared; hosts equal (clients fill them in order)."""
    cost = cfg.cost
    shared, machine = cost.shared, cost.machine
    if cost.topology != "shared":
        for group in ("shared", "machine"):
            for f in dataclasses.fields(getattr(cost, group)):
                value, default = getattr(getattr(cost, group), f.name), f.default
                if value != default:
                    raise ConfigError(f"cost.{group}.{f.name}", value,
                                      f"{default if default is not None else 'null'} with cost.topology="
                                      f"{cost.topology} (the key acts only with cost.topology=shared)")
        return
    per_host = shared.clients_per_host
    if cfg.num_clients > per_host and cfg.num_clients % per_host:
        raise ConfigError("cost.shared.clients_per_host", per_host, f"a divisor of num_clients={cfg.num_clients} or "
                          f"at least {cfg.num_clients} (clients fill hosts of cost.shared.clients_per_host in order, "
                          "every host full, or all of them on one host)")
    if machine.single and (shared.devices_per_host is None or per_host < cfg.num_clients):
        key, value = ("cost.shared.devices_per_host", None) if shared.devices_per_host is None else \
            ("cost.shared.clients_per_host", per_host)
        wanted = "a number of cores" if value is None else f"at least num_clients={cfg.num_clients}"
        raise ConfigError(key, value, f"{wanted} with cost.machine.single=true (the server and every client "
                          "share one host's cores)")
    server_limited = shared.server_bandwidth_Bps or cost.bandwidth_Bps
    if shared.server_burst_bytes and not server_limited:
        raise ConfigError("cost.shared.server_burst_bytes", shared.server_burst_bytes, "0 unless the server's link is "
                          "limited (cost.shared.server_bandwidth_Bps or cost.bandwidth_Bps): a burst is what a "
                          "limited link sends at once")
    if machine.link_cpu_s_per_byte and not (machine.single and server_limited):
        raise ConfigError("cost.machine.link_cpu_s_per_byte", machine.link_cpu_s_per_byte, "0 unless "
                          "cost.machine.single=true and the server's link is limited (cost.shared.server_bandwidth_Bps "
                          "or cost.bandwidth_Bps): it is the CPU a transfer across that link costs the machine's cores")
    if machine.eval_s and not machine.single:
        raise ConfigError("cost.machine.eval_s", machine.eval_s, "0 unless cost.machine.single=true (an evaluation "
                          "takes time only from the cores the server shares with its clients)")


def _check_elastic(cfg: RunConfig) -> None:
    """Joins (the real driver's) and simulated churn (whole triples; not with shared resources or a replay)."""
    c, leave = cfg.cost, cfg.cost.churn.leave
    if leave is not None:
        if len(leave) % 3:
            raise ConfigError("cost.churn.leave", list(leave), "triples [client, t_leave, t_return, ...]")
        for i in range(0, len(leave), 3):
            k, t1, t2 = leave[i:i + 3]
            if k != int(k) or not 1 <= k <= cfg.num_clients:
                raise ConfigError("cost.churn.leave", list(leave), f"client ids in 1..{cfg.num_clients} "
                                  "at positions 0, 3, 6, ...")
            if t2 and t2 <= t1:
                raise ConfigError("cost.churn.leave", list(leave), "t_return after t_leave (0: never)")
    if c.churn.churns and c.topology == "shared":
        raise ConfigError("cost.topology", c.topology, "dedicated with churn (cost.churn.preempt_rate, "
                          "cost.churn.leave, cost.churn.join): churn on shared resources is not modelled")
    if c.churn.churns and c.schedule == "replay":
        raise ConfigError("cost.schedule", c.schedule, "events with churn (a replay has its own order)")
    b = cfg.backend
    if b.max_clients is not None and b.max_clients < cfg.num_clients:
        raise ConfigError("backend.max_clients", b.max_clients, f"null or at least num_clients={cfg.num_clients}")
    if b.join is not None:
        host, _, port = b.join.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError("backend.join", b.join, "HOST:PORT of a running run's server "
                              "(its log says 'accepting joins at HOST:PORT')")
        if b.name != "real":
            raise ConfigError("backend.name", b.name, "real with backend.join (a join is the real driver's)")
    if b.join_client is not None and b.join is None:
        raise ConfigError("backend.join_client", b.join_client, "null without backend.join")
