"""Where speedup stops: the throughput bounds a cost profile allows, predicted from the profile alone;
why, and why they need clients out of step: docs/simulator.md, "Where speedup stops".
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
    """The throughput bounds of ``num_clients`` clients at ``nsync`` under ``cost`` (``param_bytes``: the model's)."""
    step_s = float(cost.compute_s)
    model = CostModel(cost, 0, param_bytes, step_s)
    transfer, apply = model.transfer_s, cost.server_apply_s
    factors = [step_time(cost, k, 1.0) for k in range(1, num_clients + 1)]
    alone = transfer - idle_burst_s(cost, model)   # a transfer on idle links
    cycles = [nsync * step_s * f + 2 * alone + apply for f in factors]
    bounds = {CLIENTS: sum(1.0 / c for c in cycles)}
    serve = apply + (transfer if cost.reply_holds_server else 0.0)   # the reply holds the server too
    if serve > 0:
        bounds[APPLY] = 1.0 / serve
    if cost.topology == "shared":
        hosts = math.ceil(num_clients / cost.shared.clients_per_host)
        host_bw, server_bw = link_bandwidths(cost)
        full = path_bandwidth(cost)
        for name, bw in ((SERVER_LINK, server_bw), (HOST_LINKS, None if host_bw is None else hosts * host_bw)):
            if bw is not None and transfer > 0:
                bounds[name] = bw / (full * transfer)
        if cost.shared.devices_per_host is not None:
            work = [nsync * step_s * f + transfers_cpu_s(cost, transfer, full) for f in factors]
            per_host, d = cost.shared.clients_per_host, cost.shared.devices_per_host
            bounds[DEVICES] = sum(min(1.0, d / len(host)) * sum(1.0 / w for w in host)
                                  for host in (work[i:i + per_host] for i in range(0, len(work), per_host)))
    return Ceiling(num_clients, nsync, cycles[0], bounds)


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
