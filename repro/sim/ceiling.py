"""Where speedup stops: the throughput a cost profile allows, predicted from the profile alone.

Every client cycles through fetch -> compute (``nsync`` steps) -> push -> the server's apply, so
the simulator's clock is a closed queueing network, and its throughput has the classic
asymptotic bounds (operational analysis; Lazowska et al. 1984, ch. 5): it cannot exceed what the
clients would push if nothing were shared, nor what any shared resource can carry. In pushes per
second, for N clients on H hosts (:mod:`repro.sim.resources` for the disciplines):

* **clients**: sum_k 1 / cycle_k, with cycle_k = nsync c f_k + 2 transfer_s + server_apply_s (one
  segment of steps of c seconds, f_k the client's relative step time (cost.speeds or
  cost.speed_law) times the straggler's factor, one push, one fetch, one apply):
  each client alone (a transfer that finds the server's link idle sends
  ``cost.shared.server_burst_bytes`` of its bytes at once, as the clock's token bucket does);
* **server apply**: 1 / server_apply_s (one push at a time); with ``cost.reply_holds_server``
  1 / (server_apply_s + transfer_s): the server sends each reply before it serves the next push;
* **server link** (``shared``): B_s / (B_path transfer_s), each way: a transfer is transfer_s
  seconds of work at B_path bytes/s (its idle path), so a busy link of B_s bytes/s finishes that
  many a second; each push crosses it inbound and each fetch outbound, one of each per cycle;
* **host links** (``shared``): H B_h / (B_path transfer_s);
* **host devices** (``shared``, ``devices_per_host`` d): a push needs nsync c f_k seconds of one
  device, and a busy host's d devices are shared equally (processor sharing) by its n clients:
  each gets min(1, d / n) of one and pushes that over its own work a second, so a host carries
  min(1, d / n) sum_k 1 / (nsync c f_k) (H d / (nsync c) for equal clients; an uneven host's
  fast clients push more often). On one machine (``cost.machine.single``) a push and a fetch
  are CPU work too, added to each push's work (exact for equal clients): a loopback copy takes
  two shares (one per end) for its transfer_s; across a limited link, B_path transfer_s
  ``link_cpu_s_per_byte`` each (its kernels' work). The evaluations' (``cost.machine.eval_s``)
  are not counted.

The predicted throughput is the smallest bound; it is reached when the binding resource never
idles (clients well beyond the knee) and approached from below near it, where clients wait for
each other only sometimes. The speedup ceiling is X(N) / X(1): one client alone pushes once a
cycle. Jitter is mean-preserving and changes no bound. A protocol that discards pushes
(ringmaster) spends no apply on them (:meth:`repro.sim.cost.Schedule.handled`): its applied
pushes stay within these bounds, which count an apply per push; its pushes in all may pass them.

**The bound needs clients out of step.** A resource carries its bound only if it never idles,
and clients in lockstep leave it idle: clients that start together (all of them, at time 0)
with equal step times and no jitter compute together, push together and fetch together, so a
busy link's two directions take turns (the pushes cross it inbound while nothing goes out, then
the fetches outbound while nothing comes in) and each idles about half the time. With
``cost=uniform`` on a shared server link (no jitter, no apply time) the simulator then measures
about half the link's bound at every N (45-50% from 4 to 64 clients whose step and transfer take
1 s each): correct for lockstep clients, not a defect of the clock. What puts clients out of step
brings the bound back: jitter (lognormal, sigma 0.1: over 90% of it from 16 clients on), or an
apply time that serialises the herd. The lab's figure (``+exp=ceiling``,
:mod:`repro.analysis.lab.ceiling`) draws runs without jitter as a lockstep series beside the
jittered ones (``+exp=ceiling cost.jitter=lognormal,none``); tests/test_ceiling.py measures both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from repro.config.settings import CostConfig
from repro.sim.cost import CostModel, link_bandwidths, path_bandwidth, step_time

CLIENTS, APPLY, SERVER_LINK, HOST_LINKS, DEVICES = ("clients", "server apply", "server link", "host links",
                                                    "host devices")


@dataclass(frozen=True)
class Ceiling:
    """The bounds of one (profile, N, nsync): ``bounds`` maps each limit to pushes per second."""

    num_clients: int
    nsync: int
    cycle_s: float            # client 1's cycle on idle resources (who runs alone at N = 1)
    bounds: dict[str, float]

    @property
    def pushes_per_s(self) -> float:
        return min(self.bounds.values())

    @property
    def binding(self) -> str:
        """The limit that sets the throughput (ties: the clients' own pace first)."""
        return min(self.bounds, key=lambda name: (self.bounds[name], name != CLIENTS))


def ceiling(cost: CostConfig, num_clients: int, nsync: int, param_bytes: int) -> Ceiling:
    """The throughput bounds of ``num_clients`` clients at ``nsync`` under ``cost`` (a model of
    ``param_bytes`` bytes; a minibatch step of ``cost.compute_s``)."""
    step_s = float(cost.compute_s)
    model = CostModel(cost, 0, param_bytes, step_s)
    transfer, apply = model.transfer_s, cost.server_apply_s
    factors = [step_time(cost, k, 1.0) for k in range(1, num_clients + 1)]
    alone = transfer - idle_burst_s(cost, model)   # a transfer on idle links
    cycle = nsync * step_s * factors[0] + 2 * alone + apply
    bounds = {CLIENTS: sum(1.0 / (nsync * step_s * f + 2 * alone + apply) for f in factors)}
    serve = apply + (transfer if cost.reply_holds_server else 0.0)   # the reply holds the server too
    if serve > 0:
        bounds[APPLY] = 1.0 / serve
    if cost.topology == "shared":
        hosts = math.ceil(num_clients / cost.shared.clients_per_host)
        host_bw, server_bw = link_bandwidths(cost)
        full = path_bandwidth(cost)
        if server_bw is not None and transfer > 0:
            bounds[SERVER_LINK] = server_bw / (full * transfer)
        if host_bw is not None and transfer > 0:
            bounds[HOST_LINKS] = hosts * host_bw / (full * transfer)
        if cost.shared.devices_per_host is not None:
            work = [nsync * step_s * f + transfers_cpu_s(cost, transfer, full) for f in factors]
            per_host, d = cost.shared.clients_per_host, cost.shared.devices_per_host
            bounds[DEVICES] = sum(min(1.0, d / len(host)) * sum(1.0 / w for w in host)
                                  for host in (work[i:i + per_host] for i in range(0, len(work), per_host)))
    return Ceiling(num_clients, nsync, cycle, bounds)


def transfers_cpu_s(cost: CostConfig, transfer: float, full: float | None) -> float:
    """Core-seconds of one push's two transfers on one machine (``cost.machine.single``; 0
    elsewhere): as :meth:`repro.sim.resources.ContendedScheduler._rerate_machine` weighs them."""
    if not cost.machine.single:
        return 0.0
    return 2 * (full * cost.machine.link_cpu_s_per_byte * transfer if full is not None else 2 * transfer)


def idle_burst_s(cost: CostConfig, model: CostModel) -> float:
    """Seconds a transfer saves when it finds the server's link idle, its bucket full
    (``cost.shared.server_burst_bytes`` under ``shared`` with a limited server link; else 0)."""
    if cost.topology != "shared" or link_bandwidths(cost)[1] is None or not cost.shared.server_burst_bytes:
        return 0.0
    return min(cost.shared.server_burst_bytes, float(model.nbytes)) / path_bandwidth(cost)
