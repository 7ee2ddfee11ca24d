"""Replay (``cost=replay cost.path=RUN_DIR``): the simulator re-applies a real run's recorded push
order (docs/simulator.md, "Replaying a real run in the simulator"); the recording is checked
before anything starts.
"""
from __future__ import annotations

import csv
import io
import itertools
import math
from pathlib import Path

from repro.config.checks import from_dict
from repro.config.renames import read_recorded
from repro.config.settings import BackendConfig, RunConfig, all_keys, get, to_dict, with_operational
from repro.errors import ConfigError
from repro.files import schema
from repro.files.storage import read_regular
from repro.logs import get_logger
from repro.runs.runlog import read_summary
from repro.sim.cost import Schedule

log = get_logger("repro.sim.replay")
MAX_STEPS = 10**6   # a recorded segment is at most nsync's largest value
SLOW_CLIENT = ("straggler_client", "speeds", "speed_law")   # cost.*: who is slow (repro.config.settings.slow_client)


def replay_config(cfg: RunConfig, run_dir: str | Path | None = None) -> RunConfig:
    """``cfg`` training exactly what the recording trained (its config.json's training settings,
    the slow client's cost keys too); the recording is checked here, before any folder is touched."""
    source = Path(cfg.cost.path)
    try:
        recorded = from_dict(with_operational(read_recorded(source), cfg))
    except (OSError, ValueError) as e:
        raise ConfigError("cost.path", cfg.cost.path, f"a recorded run folder with a valid config.json ({e})")
    if any(name.partition(":")[0] == "custom" for name in (recorded.data.name, recorded.model.name)):
        raise ConfigError("cost.path", cfg.cost.path, f"a recording of a named data set and model: this run "
                          f"(data.name {recorded.data.name}) was simulated by repro.api.simulate on its caller's "
                          "own data and module, which no replay can load; simulate() with the same problem and "
                          "arguments gives its tables again")
    if recorded.protocol.name != "async":
        raise ConfigError("cost.path", cfg.cost.path, f"an async run (replay replays the order of "
                          f"asynchronous pushes; this one ran protocol={recorded.protocol.name})")
    if run_dir is not None:   # a replay never writes into its own recording (force=true would delete it first)
        src, out = source.resolve(), Path(run_dir).resolve()
        if out == src or src in out.parents:
            raise ConfigError("cost.path", str(source), f"a recording outside the replay's own run folder "
                              f"({Path(run_dir)} is {'the recording itself' if out == src else 'inside it'}): "
                              "choose another exp_name (or hydra.run.dir) for the replay")
    unfinished = read_recording(source, recorded.num_clients)[1]
    if unfinished:
        log.warning(f"replay: {unfinished}")
    # where the replay runs is ours to choose: the simulator, this device, this many threads; its
    # cost is its own but for the slow client, to whom data.slow_client_classes gave the classes
    slow = {key: getattr(recorded.cost, key) for key in SLOW_CLIENT}
    return recorded.replace(cost=cfg.cost.updated(**slow), backend=BackendConfig(name="sim"), device=cfg.device,
                            num_threads=cfg.num_threads)


def refuse_typed(typed: list[str], cfg: RunConfig, replayed: RunConfig) -> None:
    """ConfigError for a typed override (or a key a typed ``+group`` sets) whose value differs from
    the recording's (``replayed``: :func:`replay_config` of ``cfg``), or a cost model's ``cost.*`` key."""
    if cfg.cost.schedule != "replay":
        return
    from repro.config.loader import OPTIONAL_GROUPS
    mine, theirs = to_dict(cfg), to_dict(replayed)
    for override in typed:
        key, _, text = override.partition("=")
        key = key.lstrip("+~").split("@")[0]
        if key in ("cost", "cost.schedule", "cost.path"):   # the replay's own (its slow client: the recording's)
            continue
        if key.startswith("cost.") and key.split(".")[1] not in SLOW_CLIENT:
            raise ConfigError(key, get(mine, key, text), "left out: a replay has no cost model (the order and times "
                              "of its pushes are its recording's, cost.path), so the key would change nothing "
                              "but the folder's name")
        named = option_keys(key, text) if key in OPTIONAL_GROUPS else [key]
        differ = [k for k in all_keys() if any(k == n or k.startswith(n + ".") for n in named)
                  and get(mine, k) != get(theirs, k)]
        if differ:
            recorded, key = ", ".join(f"{k} {get(theirs, k)!r}" for k in differ), ("+" if named != [key] else "") + key
            raise ConfigError(key, get(mine, key) if differ == [key] else text, f"the recording's {recorded} "
                              f"(a replay trains what its recording, cost.path, trained: leave {key} out)")


def option_keys(group: str, option: str) -> list[str]:
    """The keys ``+group=option`` sets: its YAML's, each group it overrides, and its bases' keys."""
    from omegaconf import OmegaConf
    from repro.config.loader import CONF_DIR, OPTIONAL_GROUPS
    tree, keys, absent = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml")), [], object()
    for entry in tree.pop("defaults", []):
        for name, chosen in entry.items() if isinstance(entry, dict) else [(group, entry)]:
            name = name.rpartition("/")[2]
            keys += [] if chosen == "_self_" else option_keys(name, chosen) if name in OPTIONAL_GROUPS else [name]
    return keys + [k for k in all_keys() if get(tree, k, absent) is not absent]


MEMBERSHIP = ("client_joined", "client_rejoined", "client_lost")


def read_recording(run_dir: str | Path, num_clients: int) -> tuple[list[tuple[int, int, int, float]], str, list]:
    """A recorded run's pushes (client, read_version, num_steps, time_s) in version order, each row
    checked before the first push (:func:`_bad_row`); why it ends before its budget ("": it finished,
    and holds every push its summary counts); its joins and losses (version, type, client, time_s)."""
    run_dir = Path(run_dir)
    rows = _rows(run_dir)
    if not rows:
        raise ConfigError("cost.path", str(run_dir), "a recording with at least one push (its "
                          f"{schema.UPDATES_FILE} has no rows)")
    summary = read_summary(run_dir) or {}   # none (or not an object): unfinished
    membership = [(int(e["version"]), e["type"], int(e["client"]),
                   float(e.get("lost_time_s", e.get("joined_time_s", e.get("time_s", 0.0)))))
                  for e in summary.get("events", []) if isinstance(e, dict) and e.get("type") in MEMBERSHIP]
    expected_read: dict[int, int] = {}
    members, events = set(range(1, num_clients + 1)), iter(membership)
    event = next(events, None)
    last_time = 0.0
    for version, (lineno, (client, read_version, num_steps, time_s)) in enumerate(rows, start=1):
        while event is not None and event[0] < version:   # it happened before this push
            if event[1] != "client_lost":
                members.add(event[2])
                expected_read[event[2]] = event[0]   # it fetched the version current at its join
            event = next(events, None)
        why = _bad_row(version, client, read_version, num_steps, time_s, members,
                       expected_read.get(client, 0), last_time)
        if why:
            raise ConfigError("cost.path", str(run_dir), f"a recording whose rows a replay can apply: "
                              f"{schema.UPDATES_FILE} line {lineno} {why}")
        expected_read[client], last_time = version, time_s
    return [row for _, row in rows], _unfinished(run_dir, summary, len(rows)), membership


def _rows(run_dir: Path) -> list[tuple[int, tuple[int, int, int, float]]]:
    """(line number, (client, read_version, num_steps, time_s)) of each row, versions checked."""
    path = run_dir / schema.UPDATES_FILE
    out = []
    try:
        # read_regular: a FIFO there would wait for a writer for good
        for lineno, r in enumerate(csv.DictReader(io.StringIO(read_regular(path, ""), newline="")), start=2):
            if int(r["version"]) != len(out) + 1:
                raise ValueError(f"line {lineno} has version {r['version']} where {len(out) + 1} belongs")
            out.append((lineno, (int(r["client"]), int(r["read_version"]), int(r["num_steps"]),
                                 float(r["time_s"]))))
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise ConfigError("cost.path", str(run_dir), f"a recorded run folder with a readable "
                          f"{schema.UPDATES_FILE} ({e})") from None
    return out


def _bad_row(version: int, client: int, read_version: int, num_steps: int, time_s: float,
             members: set[int], expected_read: int, last_time: float) -> str:
    """Why a recorded row cannot be replayed, or ""."""
    if client not in members:
        return (f"names client {client}; the recorded run had clients {_ranges(sorted(members))} "
                "at that version (1..num_clients and the client_joined events before it)")
    if read_version != expected_read:
        return (f"says client {client} read version {read_version}; in an async run it read "
                f"{expected_read} (0 first, then the version its previous push made)")
    if not 1 <= num_steps <= MAX_STEPS:
        return f"has num_steps {num_steps}; expected 1..{MAX_STEPS}"
    if not math.isfinite(time_s) or time_s < 0:
        return f"has time_s {time_s}; expected a finite time >= 0"
    if time_s < last_time:
        return f"has time_s {time_s}, earlier than the row before ({last_time})"
    return ""


def _ranges(ids: list[int]) -> str:
    """1..3, 7 for [1, 2, 3, 7]: the run's clients, short (a run of ids: one id less its place)."""
    runs = [[k for _, k in run] for _, run in itertools.groupby(enumerate(ids), lambda pair: pair[1] - pair[0])]
    return ", ".join(f"{run[0]}..{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def _unfinished(run_dir: Path, summary: dict, num_rows: int) -> str:
    """Why the recording ends before its run's budget ("" for a finished run)."""
    status = summary.get("status")
    if status in schema.FINISHED_STATUSES:
        version = summary.get("version")
        if version != num_rows:
            raise ConfigError("cost.path", str(run_dir), f"a complete recording: its summary says the "
                              f"run ended {status} at version {version}, its {schema.UPDATES_FILE} "
                              f"holds {num_rows} rows")
        return ""
    said = f"its summary says {status}" if status else "it has no summary.json"
    epoch = summary.get("epoch")
    where = f" at epoch {epoch:.2f}" if isinstance(epoch, (int, float)) else ""
    return (f"{run_dir} is an unfinished recording ({said}{where}): the replay ends after its "
            f"{num_rows} recorded pushes, before the budget")


class ReplayScheduler(Schedule):
    """The order of a recorded run: each row of its updates.csv, in version order."""

    def __init__(self, run_dir: str | Path, num_clients: int):
        self.rows, unfinished, self.membership = read_recording(run_dir, num_clients)
        self.members_done = 0   # membership events carried out
        # it runs out before the budget only when the recording is unfinished, or diverged and the replay did not
        self.end_message = unfinished or (f"all {len(self.rows)} recorded pushes were "
                                          "replayed; the recorded run ended there, before the budget")
        self.position, self.run_dir = 0, str(run_dir)

    def next(self) -> tuple[int, int, float] | None:
        if self.position >= len(self.rows):
            return None
        client, _, num_steps, time_s = self.rows[self.position]
        return client, num_steps, time_s

    def handled(self, t: float, discarded: bool) -> float:
        return t   # a recorded order keeps its recorded times

    def membership_due(self, version: int) -> list[tuple[str, int, float]]:
        """The recorded joins and losses due by ``version``, not carried out yet: (type, client, time_s)."""
        done = self.members_done
        while self.members_done < len(self.membership) and self.membership[self.members_done][0] <= version:
            self.members_done += 1
        return [event[1:] for event in self.membership[done:self.members_done]]

    def check(self, client: int, read_version: int) -> None:
        """The push about to be computed must start from the version the recording says."""
        expected = self.rows[self.position][1]
        if read_version != expected:
            raise ConfigError("cost.path", self.run_dir, f"a consistent recorded run: at version "
                              f"{self.position + 1} client {client} read version {expected}, the "
                              f"replay has {read_version}")

    def cancel(self, client: int) -> None:
        raise AssertionError("a replay runs protocol=async only: no push is ever cancelled")

    def served(self, client: int, applied_at: float) -> None:
        self.position += 1

    def state_dict(self) -> dict:
        return {"position": self.position, "members_done": self.members_done}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])
        self.members_done = int(state.get("members_done", 0))   # absent: a checkpoint from before joins
