"""The simulator's cost model settings (``cost.*``): :class:`CostConfig` and its nested groups
``cost.shared.*``, ``cost.machine.*`` and ``cost.churn.*``, declared as in :mod:`repro.config.settings`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Union

from repro.config.renames import RENAMED
from repro.config.fields import FLAG, SECONDS, Choice, Numbers, Range, Text, knob


@dataclass(frozen=True)
class ChurnConfig:
    """Simulated churn (``cost.churn.*``)."""
    preempt_rate: float = knob(0.0, Range(0.0, 1e6))
    """Each live client is lost at this rate per virtual second (a seeded Poisson process);
    0: never."""
    preempt_down_s: float = knob(1.0, Range(0.0, 1e9, lo_open=True))
    """Mean virtual seconds a preempted client stays away (seeded, exponential) before it
    rejoins under its id, a fresh client (no momentum, its data order from the start)."""
    leave: Optional[tuple[float, ...]] = knob(None, Numbers(0.0, 1e12, nullable=True))
    """A schedule: triples [client, t_leave, t_return, ...] in virtual seconds (t_return 0:
    never returns); null: none."""
    join: Optional[tuple[float, ...]] = knob(None, Numbers(0.0, 1e12, nullable=True))
    """Virtual times at which one more client joins (ids num_clients+1, ..., slot
    ((k-1) mod N)+1 for per-client settings); null: none."""

    @property
    def churns(self) -> bool:
        return self.preempt_rate > 0 or self.leave is not None or self.join is not None


@dataclass(frozen=True)
class SharedConfig:
    """The shared topology's hosts and links (``cost.shared.*``; only with cost.topology=shared)."""
    clients_per_host: int = knob(1, Range(1, 1024, integer=True))
    """Clients fill hosts of this many in order (client k on host ceil(k / this));
    num_clients must be a multiple of it, or at most it (one host)."""
    devices_per_host: Optional[int] = knob(None, Range(1, 1024, integer=True, nullable=True))
    """Devices (GPUs, cores) of a host; its clients computing at once share them
    equally (processor sharing); null: one device per client."""
    host_bandwidth_Bps: Optional[float] = knob(None, Range(0.0, 1e15, lo_open=True, nullable=True))
    """Bytes/s of a host's link, each way, shared by its clients' transfers; null:
    cost.bandwidth_Bps."""
    server_bandwidth_Bps: Optional[float] = knob(None, Range(0.0, 1e15, lo_open=True, nullable=True))
    """Bytes/s of the server's link, each way (full duplex: pushes in, fetches out),
    shared by every transfer; null: cost.bandwidth_Bps."""
    server_burst_bytes: float = knob(0.0, Range(0.0, 1e15))
    """Bytes the server's link sends at once after a pause, each way (a token bucket's
    burst, as tc's tbf: refilled at the link's rate while no transfer crosses it, up to this
    many; a transfer that finds the link idle takes what the bucket holds); 0: none."""


@dataclass(frozen=True)
class MachineConfig:
    """One machine under the shared topology (``cost.machine.*``)."""
    single: bool = knob(False, FLAG)
    """The server and all clients run on one machine (one host holding every client) whose
    cost.shared.devices_per_host cores they share: a push or fetch is a loopback copy, CPU work of both
    its ends, so it takes two shares of the cores beside the computing clients (repro/sim/resources.py)."""
    link_cpu_s_per_byte: float = knob(0.0, Range(0.0, 1.0))
    """CPU seconds the machine's kernels spend per byte a transfer moves across a
    limited link (both ends together: python -m repro.bench simreal --cores measures it as kernel
    ms per MB); such a transfer then takes that much of the cores at its rate; 0: none (the link's
    time alone)."""
    eval_s: float = knob(0.0, SECONDS)
    """CPU seconds of one evaluation of the server's parameters, which then takes one
    share of the cores from each evaluation on (the real server evaluates in a thread beside its
    clients); 0: evaluations cost no time, as elsewhere in the simulator."""


@dataclass(frozen=True)
class CostConfig:
    profile: str = knob("uniform", Text("a label"))
    """Name of the cost profile (a label saved with the run)."""
    schedule: str = knob("events", Choice(("events", "replay")))
    """Who decides the order of pushes: events (the cost model's clock) or replay (the order a
    recorded run's updates.csv holds, cost.path; conf/cost/replay.yaml sets it)."""
    compute_s: Union[float, str] = knob(0.01, Range(0.0, 1e6, lo_open=True, words=("calibrate",)))
    """Virtual seconds per client minibatch step, or 'calibrate' to time real steps once."""
    jitter: str = knob("none", Choice(("none", "lognormal", "exponential")))
    """Per-step compute-time noise (mean-preserving, seeded by seed, client, push)."""
    jitter_sigma: float = knob(0.0, Range(0.0, 10.0))
    """lognormal: sigma of log-time; exponential: weight of the exponential part (0..1)."""
    straggler_client: Optional[int] = knob(None, Range(1, 10**6, integer=True, nullable=True))
    """This client (1..num_clients) computes straggler_factor times slower; null: no straggler."""
    straggler_factor: float = knob(1.0, Range(0.0, 1e6, lo_open=True))
    """How many times slower the straggler computes."""
    speeds: Optional[tuple[float, ...]] = knob(None, Numbers(0.0, 1e6, lo_open=True, nullable=True))
    """Relative step time of each client: num_clients positive numbers, client k's minibatch
    step takes compute_s x speeds[k-1] (a larger number is a slower client); null: all 1.
    Multiplies with the straggler's factor and the jitter. backend=real: a slowed client sleeps
    after each step so that it takes its time over the fastest client's times as long."""
    speed_law: str = knob("none", Choice(("none", "sqrt")))
    """A named law of relative step times, instead of a list: sqrt gives client k the step time
    1 + sqrt(k - 1), i.e. tau_i = 1 + sqrt(i) with i = k - 1 counted from 0, so client 1 is the
    fastest at exactly compute_s (the heterogeneous setting of the Rennala and Ringmaster papers)."""
    latency_s: float = knob(0.0, SECONDS)
    """One-way link latency of every push and fetch (virtual seconds)."""
    bandwidth_Bps: Optional[float] = knob(None, Range(0.0, 1e15, lo_open=True, nullable=True))
    """Link bandwidth in bytes/s for the parameter bytes of each push and fetch; null: free."""
    comm_params: Optional[float] = knob(None, Range(0.0, 1e13, lo_open=True, nullable=True))
    """Count communication as if the parameter vector had this many float32 entries (null: the
    model's real size); lets a small model stand in for an AlexNet-sized one (paper2013)."""
    server_apply_s: float = knob(0.0, SECONDS)
    """Virtual seconds the server takes to apply one push; it serves one push at a time. A push the
    protocol discards (ringmaster, rennala) or the server refuses (diverging) takes none: the server
    only replies, as the real one does."""
    reply_holds_server: bool = knob(False, FLAG)
    """The server sends each push's reply before it serves the next push, so the reply's transfer
    keeps it busy (the real driver's Dispatcher holds its lock through the send; cost=fit sets it
    for a real recording); false: only the apply does."""
    topology: str = knob("dedicated", Choice(("dedicated", "shared")))
    """dedicated: every client has a host, a device and a link of its own (only the server's
    apply is shared); shared: clients on hosts share the host's devices and link, and every
    push and fetch crosses the server's link (repro/sim/resources.py)."""
    shared: SharedConfig = knob(SharedConfig, None)
    """cost.topology=shared: the hosts' devices and links, and the server's link."""
    machine: MachineConfig = knob(MachineConfig, None)
    """cost.topology=shared: the server and its clients on one machine's cores."""
    path: Optional[str] = knob(None, Text("a run folder", nullable=True), shapes=False)
    """With profile 'replay': the recorded run folder whose update order is replayed. With the
    events schedule (cost=fit): recorded run folders, ':'-separated, whose timings.csv the cost
    model is fitted to (repro/sim/fit.py); their fitted values replace the ones configured."""
    churn: ChurnConfig = knob(ChurnConfig, None)
    """Simulated churn (repro.sim.churn): clients lost, back, and joining in virtual time."""

    def updated(self, **changes) -> "CostConfig":
        """``dataclasses.replace`` that takes a nested group's key by its old flat name too
        (``clients_per_host=4`` sets ``shared.clients_per_host``; :data:`repro.config.renames.RENAMED`)."""
        direct = {name: value for name, value in changes.items() if "cost." + name not in RENAMED}
        for name in changes.keys() - direct.keys():   # onto a group given whole, if one is
            _, group, leaf = RENAMED["cost." + name].split(".")
            direct[group] = dataclasses.replace(direct.get(group, getattr(self, group)), **{leaf: changes[name]})
        return dataclasses.replace(self, **direct)

    @classmethod
    def of(cls, **changes) -> "CostConfig":
        """The default cost with ``changes`` (old flat names taken: :meth:`updated`)."""
        return cls().updated(**changes)

    def speed(self, client: int) -> float:
        """Client ``client``'s relative step time from ``speeds`` or ``speed_law`` (1: neither;
        the straggler's factor and the jitter come on top)."""
        if self.speeds is not None:
            return self.speeds[client - 1]
        if self.speed_law == "sqrt":
            return 1.0 + math.sqrt(client - 1)   # i = client - 1 = 0..N-1: client 1 at compute_s
        return 1.0
