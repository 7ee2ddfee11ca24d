"""A cost model fitted to recorded runs' ``timings.csv`` (``cost=fit cost.path=RUN_DIR[:RUN_DIR...]``):
what is fitted and refused, and how the recorded machine is placed: docs/simulator.md, "Fitting
the simulator's cost model to recorded runs".
"""
from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from repro.config import settings
from repro.config.renames import read_recorded
from repro.config.settings import RunConfig
from repro.errors import ConfigError
from repro.files import schema
from repro.files.storage import read_regular
from repro.runs.runlog import read_summary

if TYPE_CHECKING:   # pandas is imported where a recording is read: every simulation imports this module
    import pandas as pd
from repro.logs import get_logger

log = get_logger("repro.sim.fit")

MIN_PUSHES = 20   # fewer pushes say too little about a mean and a spread


# what a fit reads of a recording's config.json, and what each must be
NEEDED = {"nsync": "a positive integer", "model.name": "a model name", "data.name": "a data set name",
          "algo.batch_size": "a positive integer", "network.param_bytes": "a positive number of bytes"}


def _refuse(run_dir: Path, what: str) -> ConfigError:
    return ConfigError("cost.path", str(run_dir), what)


def _read_config(run_dir: Path) -> dict:
    path = run_dir / schema.CONFIG_FILE
    try:
        config = read_recorded(run_dir)
    except (OSError, ValueError) as exc:
        raise _refuse(run_dir, f"a recorded run folder with a readable {path} ({exc})") from None
    for key, what in NEEDED.items():
        if key == "network.param_bytes" and _get(config, "cost.comm_params") is not None:
            key, what = "cost.comm_params", "a positive number"   # its messages' size (message_bytes)
        value = _get(config, key)
        ok = isinstance(value, str) and value if what.endswith("name") else _positive(value)
        if not ok:
            raise _refuse(run_dir, f"a recording whose {path} has {key}, {what} (it has "
                          f"{'none' if value is None else repr(value)})")
    host = config.get("host")
    if host is not None and not (isinstance(host, dict) and _positive(host.get("cpu_cores"))
                                 and _positive(host.get("torch_threads", 1))
                                 and isinstance(host.get("clients_on_host"), int)):
        raise _refuse(run_dir, f"a recording whose {path} has host, null or the real driver's record "
                      f"(cpu_cores, torch_threads, clients_on_host) (it has {host!r})")
    if _get(config, "cost.schedule") == "replay":
        raise _refuse(run_dir, f"a recording with timings (it is a replay of {_get(config, 'cost.path')}, "
                      f"and a replay records no timings: its {schema.TIMINGS_FILE} parts are nan; "
                      "fit to the run it replayed)")
    return config


def _get(config: dict, key: str):
    """The recording's value at a dotted key; None where its config.json has none (an old run)."""
    return settings.get(config, key, None)


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _read_timings(run_dir: Path) -> pd.DataFrame:
    """timings.csv with every cell a number >= 0 (a part a run did not measure: nan)."""
    import pandas as pd
    path = run_dir / schema.TIMINGS_FILE
    try:
        # read_regular: a FIFO there would wait for a writer for good
        table = pd.read_csv(io.StringIO(read_regular(path, ""), newline=""), dtype=str, keep_default_na=False)
    except (OSError, ValueError) as exc:
        raise _refuse(run_dir, f"a recorded run folder with a readable {path} ({exc})") from None
    if tuple(table.columns) != schema.TIMING_COLUMNS:
        raise _refuse(run_dir, f"a {path} with the columns {list(schema.TIMING_COLUMNS)}")
    for column in ("version", "time_s", "client", "read_version", *schema.TIMING_PARTS):
        cells = table[column].fillna("")
        values = pd.to_numeric(cells, errors="coerce")
        may_be_nan = column in schema.TIMING_PARTS and cells.str.strip().str.lower().isin(("", "nan"))
        bad = ~((np.isfinite(values) & (values >= 0)) | may_be_nan)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise _refuse(run_dir, f"a {schema.TIMINGS_FILE} of numbers ({path} line {row + 2} has "
                          f"{column} {cells.iloc[row]!r}, not a finite number >= 0"
                          + (" or nan)" if column in schema.TIMING_PARTS else ")"))
        table[column] = values   # read as text, kept as numbers
    return table


def message_bytes(config: dict) -> float:
    """Bytes of one push or fetch of the recorded run (its comm_params when it set one)."""
    comm = _get(config, "cost.comm_params")
    return float(comm) * 4 if comm is not None else float(config["network"]["param_bytes"])


def _own(recordings: list[tuple[str, dict, pd.DataFrame]], run: dict) -> list[bool]:
    """Which recordings ran the run's model, data and batch size (others: transit only); exit 2 if none."""
    differs = [next(((k, _get(c, k), v) for k, v in run.items() if _get(c, k) != v), None)
               for _, c, _ in recordings]
    if all(differs):
        key, theirs, ours = differs[0]
        where = Path(recordings[0][0]) / schema.CONFIG_FILE
        raise _refuse(Path(recordings[0][0]), f"a recording of this run's model, data and batch size "
                      f"(the step time depends on them; {where} has {key}={theirs}, this run {key}={ours})")
    for (path, _, _), diff in zip(recordings, differs):
        if diff:
            log.warning(f"cost=fit: {path} ran {diff[0]}={diff[1]} (this run: {diff[2]}): only its "
                        "transit is fitted (a second message size), not its step, apply or evaluation times")
    return [d is None for d in differs]


def _measure(path: str, t: pd.DataFrame, config: dict) -> dict:
    """One recording's pushes (those with every part measured), steps and transit point."""
    t = t[np.isfinite(t[list(schema.TIMING_PARTS)]).all(axis=1)]
    if len(t) < MIN_PUSHES:
        raise ConfigError("cost.path", path, f"a recorded run with at least {MIN_PUSHES} pushes "
                          f"in {schema.TIMINGS_FILE} to fit a cost model to (it has {len(t)})")
    nsync = int(config["nsync"])
    step = t.compute_s.to_numpy() / nsync
    later = t[t.duplicated("client")]   # a client's first fetch is the start-up's, not a reply's
    transit = np.concatenate([t.to_server_s.to_numpy(), later.to_client_s.to_numpy()])
    # a discarded push cost the server no apply (it only replied): its apply_s of about 0 is no apply's time
    summary = read_summary(Path(path)) or {}
    dropped = {tuple(p) for p in summary.get("discarded_pushes") or []}
    applied = [(v, k) not in dropped for v, k in zip(t.read_version, t.client)]
    evaluation = summary.get("eval_cpu_s")   # mean CPU seconds of one evaluation (None: none recorded)
    return {"step": step, "apply": t.apply_s.to_numpy()[applied], "pushes": len(t),
            "cv": step.std() / step.mean() * math.sqrt(nsync) if step.mean() > 0 else None,
            "point": (message_bytes(config), float(np.mean(transit)) + round_trip_rest(t, config) / 2),
            "host": config.get("host"), "real": _get(config, "backend.name") == "real",
            "eval": float(evaluation) if evaluation == 0 or _positive(evaluation) else None}


def fit_cost(paths: list[str], link_Bps: float | None, burst_bytes: float, run: dict) -> dict:
    """The fitted values and where they came from (the ``fit`` record); ``link_Bps``, ``burst_bytes``:
    the link's known bandwidth and burst; ``run``: the settings a step's and an apply's time depend on."""
    recordings = [(path, _read_config(Path(path)), _read_timings(Path(path))) for path in paths]
    for path, config, _ in recordings:   # accepted: a known cost to recover is how the fit is tested
        if _get(config, "backend.name") == "sim":
            log.warning(f"cost=fit: cost.path {path} is a simulator's recording: the fit gives back the "
                        "costs it was simulated with, not a machine's (fit a real run's recording for that)")
    own = _own(recordings, run)
    measured = [_measure(path, t, config) for path, config, t in recordings]
    mine = [m for m, o in zip(measured, own) if o]
    step = np.concatenate([m["step"] for m in mine])
    cvs = [m["cv"] for m in mine if m["cv"] is not None]
    evals = [m["eval"] for m in mine]
    points, hosts = [m["point"] for m in measured], [m["host"] for m in measured]
    cv = float(np.mean(cvs)) if cvs else 0.0
    sigma = math.sqrt(math.log1p(cv * cv))
    sizes, times = (np.array(column) for column in zip(*points))
    latency, bandwidth, note = float(np.mean(times)), None, ""
    if link_Bps is not None:   # a known link: its bytes' time is not latency
        latency = max(0.0, float(np.mean(times - np.maximum(sizes - burst_bytes, 0.0) / link_Bps)))
        burst = f", burst {burst_bytes:g} B" if burst_bytes else ""
        note = (f"the link's bandwidth is given ({link_Bps:g} B/s{burst}): "
                "latency is the transit less the bytes' time on it")
    elif len(set(sizes.tolist())) < 2:
        note = ("one message size: latency and bandwidth are not separable, the whole transit is "
                "latency and the link is free (fit runs of two model sizes to separate them)")
    else:
        slope, intercept = np.polyfit(sizes, times, 1)
        if slope > 0:
            latency, bandwidth = max(float(intercept), 0.0), float(1.0 / slope)
        else:
            note = "transit does not grow with message bytes: all of it is latency, the link is free"
    host = hosts[0] if hosts and all(h == hosts[0] for h in hosts) else None
    return {"paths": [str(p) for p in paths], "pushes": sum(m["pushes"] for m in measured),
            "compute_s": float(step.mean()), "jitter_sigma": sigma, "latency_s": latency, "bandwidth_Bps": bandwidth,
            "server_apply_s": float(np.concatenate([m["apply"] for m in mine]).mean()),
            "transit": [[b, s] for b, s in points], "note": note, "host": host,
            "eval_cpu_s": float(np.mean(evals)) if evals and None not in evals else None,
            "reply_holds_server": all(m["real"] for m in measured),
            "transit_only": [str(p) for p, o in zip(paths, own) if not o]}


def round_trip_rest(t: pd.DataFrame, config: dict) -> float:
    """Mean seconds of a client's round trip that the five parts miss (0 when no client pushed
    twice, or not async: a barrier's wait is not transit)."""
    if _get(config, "protocol.name") not in (None, "async"):
        return 0.0
    parts = t[list(schema.TIMING_PARTS)].sum(axis=1)
    cycle = t.groupby("client").time_s.diff()
    later = cycle.notna()
    return max(0.0, float((cycle[later] - parts[later]).mean())) if later.any() else 0.0


def machine_cost(cost, fit: dict, num_clients: int):
    """The fitted cost placed on the recorded machine (unchanged without one agreed ``host`` record)."""
    host = fit["host"]
    if not host:
        return cost, ""
    cores = max(1, int(host["cpu_cores"]) // max(1, int(host.get("torch_threads", 1))))
    # cost.machine.single on the command: the recording's hosts share one machine's cores (network
    # namespaces of one machine: repro_bench.instruments.two_hosts), a fact its host record cannot show
    across = int(host["clients_on_host"]) == 0
    one_machine = not across or cost.machine.single
    eval_s = (fit["eval_cpu_s"] or 0.0) if one_machine else 0.0
    cost = cost.updated(topology="shared", clients_per_host=num_clients, devices_per_host=cores,
                        one_machine=one_machine, eval_s=eval_s)   # old flat names: cost.shared.*, cost.machine.*
    where = (f"the clients on one host of {cores} cores (the server's host's count)" if not one_machine else
             f"one machine of {cores} cores shared by the server, {num_clients} clients and their "
             + ("evaluations; the transfers cross the limited link" if across else "transfers"))
    return cost, where


def fit_config(cfg: RunConfig) -> tuple[RunConfig, dict]:
    """``cfg`` with the cost model fitted to the recordings ``cost.path`` names (``:``-separated:
    folder names hold commas), and the ``fit`` record; ConfigError on a bad recording."""
    paths = [p for p in str(cfg.cost.path).split(os.pathsep) if p.strip()]
    if not paths:
        raise ConfigError("cost.path", cfg.cost.path, "one or more recorded run folders, separated by ':' "
                          "(cost=fit cost.path=RUN_DIR[:RUN_DIR...])")
    run = {"model.name": cfg.model.name, "data.name": cfg.data.name, "algo.batch_size": cfg.algo.batch_size}
    fit = fit_cost(paths, cfg.cost.shared.server_bandwidth_Bps, cfg.cost.shared.server_burst_bytes, run)
    cost = cfg.cost.updated(
        compute_s=fit["compute_s"], jitter="lognormal" if fit["jitter_sigma"] > 0 else "none",
        jitter_sigma=fit["jitter_sigma"], latency_s=fit["latency_s"], bandwidth_Bps=fit["bandwidth_Bps"],
        server_apply_s=fit["server_apply_s"], reply_holds_server=fit["reply_holds_server"])
    cost, fit["machine"] = machine_cost(cost, fit, cfg.num_clients)
    return cfg.replace(cost=cost), fit
