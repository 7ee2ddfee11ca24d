"""The schedule's interface: every verb the simulator's loop calls, so the loop never probes.

A schedule decides which client's push the server applies next and when (in virtual time):
:class:`repro.sim.cost.CostScheduler` (dedicated resources), :class:`repro.sim.resources.ContendedScheduler`
(shared ones) and :class:`repro.sim.replay.ReplayScheduler` (a recorded run's order) all derive
from :class:`Schedule`. What a schedule does not model has a default here that does nothing
(no recorded joins, no cost of an evaluation, no parts of a push's time), so the loop in
:mod:`repro.sim.driver` calls every verb of every schedule the same way.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

# timings.csv's parts of a push's round trip (repro.files.schema.TIMING_COLUMNS)
TIMING_PARTS = ("to_client_s", "compute_s", "to_server_s", "queue_s", "apply_s")


class Schedule(ABC):
    """What the simulator asks of a schedule: the next push to apply, then that it was served."""

    #: what the run's summary says when :meth:`next` runs out before the budget (a replay)
    end_message = ""
    #: timings.csv's parts of the push :meth:`next` returned; None: the schedule models none
    last_timing: dict | None = None

    @abstractmethod
    def next(self) -> tuple[int, int, float] | None:
        """(client, num_steps, apply-finished time) of the next push; None: nothing is left."""

    @abstractmethod
    def served(self, client: int, applied_at: float) -> None:
        """The client's reply left the server at ``applied_at``: it fetches, then computes."""

    @abstractmethod
    def cancel(self, client: int) -> None:
        """Drop the client's push in flight (preempted, or the client left)."""

    @abstractmethod
    def state_dict(self) -> dict: ...

    @abstractmethod
    def load_state_dict(self, state: dict) -> None: ...

    def peek(self) -> float:
        """When the next push arrives (inf: no client computes); churn's events interleave by it."""
        raise NotImplementedError(f"{type(self).__name__} does not say when its next push arrives: "
                                  "churn runs with cost.topology=dedicated")

    def check(self, client: int, read_version: int) -> None:
        """Refuse a push that the schedule did not foresee (a replay of another run)."""

    def membership_due(self, version: int) -> list[tuple[str, int, float]]:
        """Recorded joins and losses due at server version ``version``: (type, client, time_s)."""
        return []

    def evaluated(self, t: float) -> None:
        """The server evaluates its parameters from ``t`` on (a schedule where that takes time)."""

    def timing(self) -> dict[str, float]:
        """timings.csv's parts of the push :meth:`next` returned; nan where the schedule has no
        model of them (a replay), or has not chosen that push (one pending in a checkpoint)."""
        return self.last_timing or dict.fromkeys(TIMING_PARTS, float("nan"))
