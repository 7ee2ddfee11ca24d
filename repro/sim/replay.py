"""Replay (``cost=replay cost.path=RUN_DIR``): the simulator re-applies the push order a real run
recorded, to prove that the two drivers compute the same numbers.

:func:`replay_config` makes the replay train exactly what the recorded run trained (its
training-shaping settings, ours for where files go); :class:`ReplayScheduler` is the schedule: each
row of the recording's ``updates.csv``, in version order, with its recorded times.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from repro.config.settings import BackendConfig, RunConfig, from_dict, with_operational
from repro.errors import ConfigError
from repro.files import schema


def replay_config(cfg: RunConfig) -> RunConfig:
    """A replay trains exactly what the recorded run trained: every training-shaping setting
    comes from its config.json; the backend (sim), the cost (replay) and everything that does
    not shape training (where results go, progress, checkpoints) come from ``cfg``."""
    path = Path(cfg.cost.path) / schema.CONFIG_FILE
    try:
        recorded = from_dict(with_operational(json.loads(path.read_text()), cfg))
    except (OSError, ValueError) as e:
        raise ConfigError("cost.path", cfg.cost.path, f"a recorded run folder with a valid config.json ({e})")
    if recorded.protocol.name != "async":
        raise ConfigError("cost.path", cfg.cost.path, f"an async run (replay replays the order of "
                          f"asynchronous pushes; this one ran protocol={recorded.protocol.name})")
    # where the replay runs is ours to choose: the simulator, this device, this many threads
    return recorded.replace(cost=cfg.cost, backend=BackendConfig(name="sim"), device=cfg.device,
                            num_threads=cfg.num_threads)


class ReplayScheduler:
    """The order of a recorded run: each row of its updates.csv, in version order."""

    def __init__(self, run_dir: str | Path):
        path = Path(run_dir) / "updates.csv"
        try:
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
            self.rows = [(int(r["client"]), int(r["read_version"]), int(r["num_steps"]), float(r["time_s"]))
                         for r in rows]
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise ConfigError("cost.path", str(run_dir), f"a recorded run folder with a readable updates.csv ({e})")
        self.position, self.run_dir = 0, str(run_dir)

    def next(self) -> tuple[int, int, float] | None:
        if self.position >= len(self.rows):
            return None
        client, _, num_steps, time_s = self.rows[self.position]
        return client, num_steps, time_s

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
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])
