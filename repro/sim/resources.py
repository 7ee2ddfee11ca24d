"""Shared resources in the simulator's clock (``cost.topology=shared``): who waits for whom, as an
event-driven fluid simulation (docs/simulator.md, "Shared resources").
"""
from __future__ import annotations

import heapq
import itertools
import math

from repro.sim.cost import CostModel, Schedule, link_bandwidths, path_bandwidth

FETCH, COMPUTE, PUSH, EVAL = "fetch", "compute", "push", "eval"
EVALUATOR = 0   # the stages' key of the server's evaluations (clients are 1, 2, ...)
SERVER_IN, SERVER_OUT = "server:in", "server:out"
SERVER_LINK = {PUSH: SERVER_IN, FETCH: SERVER_OUT}   # the way of the server's link a transfer takes


def max_min_shares(paths: dict[int, tuple[str, ...]], capacity: dict[str, float]) -> dict[int, float]:
    """Bytes/s of each transfer (``paths``: transfer -> the limited links it crosses), max-min fair
    by progressive filling, a path's transfers as one group; ``inf`` for one crossing none."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for f, path in paths.items():
        groups.setdefault(path, []).append(f)
    count: dict[str, int] = {}
    crossing: dict[str, list[tuple[str, ...]]] = {}
    for path, fs in groups.items():
        for link in path:
            count[link] = count.get(link, 0) + len(fs)
            crossing.setdefault(link, []).append(path)
    left = {link: capacity[link] for link in count}
    level: dict[tuple[str, ...], float] = {}
    # the smallest (share, link) first; a link's share only grows as others freeze (what they
    # freeze at is at most its share), so a stale entry is a lower bound: refreshed when popped
    heap = [(left[link] / n, link) for link, n in count.items()]
    heapq.heapify(heap)
    while heap:
        old, link = heapq.heappop(heap)
        if link not in count:
            continue
        share = left[link] / count[link]
        if share != old:
            heapq.heappush(heap, (share, link))
            continue
        del count[link]
        for path in crossing[link]:
            if path in level:
                continue
            level[path] = share
            n = len(groups[path])
            for other in path:
                if other in count:
                    left[other] = max(0.0, left[other] - share * n)
                    count[other] -= n
                    if not count[other]:
                        del count[other]
    return {f: level.get(path, math.inf) for path, fs in groups.items() for f in fs}


class Stage:
    """One client's current stage: ``work`` seconds at full speed left at ``t0``, done at ``rate``
    since, so it ends at ``end``; ``seq`` orders ties (the cycle's start)."""
    __slots__ = ("kind", "t0", "work", "rate", "seq", "end")

    def __init__(self, kind: str, t0: float, work: float, rate: float, seq: int):
        self.kind, self.t0, self.work, self.seq = kind, t0, work, seq
        self.set_rate(t0, rate)

    def set_rate(self, t: float, rate: float) -> None:
        """From ``t`` on, run at ``rate``: the work done since ``t0`` at the old rate is taken off."""
        if t != self.t0:
            self.work = max(0.0, self.work - self.rate * (t - self.t0))
            self.t0 = t
        self.rate = rate
        self.end = self.t0 + self.work / rate if rate > 0 else math.inf


class ContendedScheduler(Schedule):
    """Push arrivals in virtual time with shared devices and links; one apply at a time, in order."""

    def __init__(self, model: CostModel, client_ids: list[int], nsync: int):
        cost = model.cost
        self.model, self.nsync, self.devices = model, nsync, cost.shared.devices_per_host
        self.one_machine, self.eval_waiting = cost.machine.single, False
        self.replying: list[int] = []   # replies that hold the server, sent in turn (reply_holds_server)
        # per client: the start of its stage, and its parts so far (timings.csv's columns)
        self.started: dict[int, float] = {}
        self.flight: dict[int, dict[str, float]] = {}
        self.host = {k: i // cost.shared.clients_per_host for i, k in enumerate(sorted(client_ids))}
        host_bw, server_bw = link_bandwidths(cost)
        links = {k: (f"host{h}:up", f"host{h}:down") for k, h in self.host.items()}   # a host's link, each way
        ways = [((SERVER_IN, SERVER_OUT), server_bw)] + [(pair, host_bw) for pair in dict.fromkeys(links.values())]
        self.capacity = {link: bw for pair, bw in ways if bw is not None for link in pair}   # the limited ones
        # client -> {stage: the limited links its transfer crosses}
        self.paths = {k: {PUSH: tuple(x for x in (up, SERVER_IN) if x in self.capacity),
                          FETCH: tuple(x for x in (SERVER_OUT, down) if x in self.capacity)}
                      for k, (up, down) in links.items()}
        self.full_Bps = path_bandwidth(cost)     # a transfer alone on its path: rate 1
        # cost.shared.server_burst_bytes: each way's bucket, [tokens, idle since] (since None: in use)
        self.bucket = {link: [cost.shared.server_burst_bytes, 0.0] for link in (SERVER_IN, SERVER_OUT)
                       if cost.shared.server_burst_bytes > 0 and link in self.capacity}
        self.stages: dict[int, Stage] = {}
        self.ends: list[tuple] = []   # heap of (end, seq, n, client, stage); stale entries skipped
        self.arrived: list[tuple[float, int, int]] = []   # (arrival, seq, client), first come first
        self.now, self.seq, self.server_free = 0.0, 0, 0.0
        self.segments = {k: 0 for k in client_ids}
        self._reindex()
        for k in client_ids:              # every client fetches version 0 at t = 0
            self._start(k, COMPUTE, 0.0, self._new_seq())
        self._rerate(0.0, set(self.host.values()), ())

    def next(self) -> tuple[int, int, float] | None:
        while not self.arrived or self.replying:   # cost.reply_holds_server: until sent
            if not self._step(math.inf):
                raise RuntimeError("no push in flight: every client waits for a reply")
        arrive, _, client = self.arrived.pop(0)
        start = self.server_free = max(arrive, self.server_free)   # the server serves one push at a time
        parts = self.flight.pop(client, {})
        self.last_timing = {"to_client_s": parts.get(FETCH, 0.0), "compute_s": parts.get(COMPUTE, 0.0),
                            "to_server_s": parts.get(PUSH, 0.0), "queue_s": start - arrive,
                            "apply_s": self.model.server_apply_s}
        return client, self.nsync, start + self.model.server_apply_s

    def handled(self, t: float, discarded: bool) -> float:
        super().handled(t, discarded)   # the same server, here among shared resources
        while self._step(self.server_free):        # what happens while it applies
            pass
        self.now = max(self.now, self.server_free)
        return self.server_free

    def evaluated(self, t: float) -> None:
        """An evaluation from ``t`` on: cost.machine.eval_s of CPU work on one machine, else nothing."""
        if not (self.one_machine and self.model.cost.machine.eval_s > 0):
            return
        if EVALUATOR in self.stages:   # the one evaluator is busy: one evaluation waits for it
            self.eval_waiting = True
            return
        self.stages[EVALUATOR] = Stage(EVAL, t, self.model.cost.machine.eval_s, 0.0, self._new_seq())
        self._rerate(t, (), ())

    def served(self, client: int, applied_at: float) -> None:
        self.cancel(client)
        if self.model.cost.reply_holds_server:   # one reply at a time, as the real Dispatcher sends
            self.replying.append(client)
            if len(self.replying) > 1:          # after those before it: its wait is in its to_client_s
                self.started[client] = applied_at
                return
        self._start(client, FETCH, applied_at, self._new_seq())
        self._rerate(applied_at, (), (FETCH,))

    def cancel(self, client: int) -> None:
        """Drop the client's push in flight, freeing its resources now."""
        self.arrived = [a for a in self.arrived if a[2] != client]
        self.flight.pop(client, None)
        stage = self.stages.pop(client, None)
        if stage is not None:
            if stage.kind in SERVER_LINK:
                self._link_idle(stage.kind, self.now)
            computing = stage.kind == COMPUTE
            self._rerate(self.now, (self.host[client],) if computing else (), () if computing else (stage.kind,))

    def state_dict(self) -> dict:
        return {"now": self.now, "seq": self.seq, "server_free": self.server_free,
                "segments": [[k, v] for k, v in self.segments.items()],
                "stages": [[k, st.kind, st.t0, st.work, st.rate, st.seq] for k, st in self.stages.items()],
                "arrived": [list(a) for a in self.arrived], "eval_waiting": self.eval_waiting,
                "replying": list(self.replying), "started": [[k, v] for k, v in self.started.items()],
                "flight": [[k, v] for k, v in self.flight.items()],
                "bucket": [[link, *v] for link, v in sorted(self.bucket.items())]}

    def load_state_dict(self, state: dict) -> None:
        self.now, self.seq, self.server_free = float(state["now"]), int(state["seq"]), float(state["server_free"])
        self.segments = {int(k): int(v) for k, v in state["segments"]}
        self.stages = {int(k): Stage(str(kind), float(t0), float(work), float(rate), int(seq))
                       for k, kind, t0, work, rate, seq in state["stages"]}
        self.arrived = [(float(t), int(s), int(c)) for t, s, c in state["arrived"]]
        self.eval_waiting = bool(state.get("eval_waiting", False))
        self.replying = [int(k) for k in state.get("replying", [])]
        self.started = {int(k): float(v) for k, v in state.get("started", [])}
        self.flight = {int(k): {str(a): float(b) for a, b in v.items()} for k, v in state.get("flight", [])}
        for link, tokens, since in state.get("bucket", []):
            self.bucket[str(link)] = [float(tokens), None if since is None else float(since)]
        self._reindex()

    def _new_seq(self) -> int:
        self.seq += 1
        return self.seq - 1

    def _start(self, client: int, kind: str, t: float, seq: int) -> None:
        """Begin a stage at ``t``; its rate is set by the :meth:`_rerate` that follows."""
        if kind == COMPUTE:
            segment = self.segments[client]
            self.segments[client] = segment + 1
            work = self.model.segment_s(client, segment, self.nsync)
        else:
            work = self.model.transfer_s
            if self.bucket:   # the bytes the server link's bucket sends at once cost no link time
                work -= self._burst(client, kind, t) / self.full_Bps
        self.stages[client] = Stage(kind, t, work, 0.0, seq)
        self.started[client] = t

    def _burst(self, client: int, kind: str, t: float) -> float:
        """Bytes of a transfer starting at ``t`` that the server link's bucket sends at once."""
        link = SERVER_LINK[kind]
        if link not in self.bucket or link not in self.paths[client][kind] or self.bucket[link][1] is None:
            return 0.0   # no bucket on its way, or another transfer is using the link
        tokens, since = self.bucket[link]
        tokens = min(self.model.cost.shared.server_burst_bytes, tokens + self.capacity[link] * (t - since))
        sent = min(tokens, float(self.model.nbytes))
        self.bucket[link] = [tokens - sent, None]
        return sent

    def _link_idle(self, kind: str, t: float) -> None:
        """A transfer of ``kind`` ended at ``t``: its bucket refills from ``t`` if no other crosses it."""
        link = SERVER_LINK[kind]
        if link in self.bucket and not any(st.kind == kind and link in self.paths[k][kind]
                                           for k, st in self.stages.items()):
            self.bucket[link][1] = t

    def _step(self, until: float) -> bool:
        """End the earliest stage if it ends at or before ``until``; False if none does."""
        ends = self.ends
        while ends and (self.stages.get(ends[0][3]) is not ends[0][4] or ends[0][4].end != ends[0][0]):
            heapq.heappop(ends)   # that stage ended, or its rate (so its end) changed since
        if not ends or ends[0][0] > until:
            return False
        client, stage = ends[0][3], ends[0][4]
        t = self.now = max(stage.end, self.now)   # a re-based stage never ends in the past
        if stage.kind == EVAL:   # the server's evaluation ends: its share goes back
            del self.stages[client]
            if self.eval_waiting:   # evaluations due meanwhile are one, as the real server's
                self.eval_waiting = False
                self.stages[EVALUATOR] = Stage(EVAL, t, self.model.cost.machine.eval_s, 0.0, self._new_seq())
            self._rerate(t, (), ())
            return True
        self.flight.setdefault(client, {})[stage.kind] = t - self.started[client]
        if stage.kind == FETCH:
            if client in self.replying:   # the reply is sent: the next reply, then the next push
                self.replying.remove(client)
                self.server_free = max(self.server_free, t)
                if self.replying and self.replying[0] not in self.stages:
                    since = self.started[self.replying[0]]
                    self._start(self.replying[0], FETCH, t, self._new_seq())
                    self.started[self.replying[0]] = since
            self._start(client, COMPUTE, t, stage.seq)
        elif stage.kind == COMPUTE:
            self._start(client, PUSH, t, stage.seq)
        else:
            del self.stages[client]
            self.arrived.append((t, stage.seq, client))
        if stage.kind in SERVER_LINK:
            self._link_idle(stage.kind, t)
        pools = (self.host[client],) if stage.kind in (FETCH, COMPUTE) else ()
        self._rerate(t, pools, (FETCH,) if stage.kind == FETCH else (PUSH,))
        return True

    def _rerate(self, t: float, hosts, directions) -> None:
        """New rates from ``t`` on for the devices of ``hosts`` and the transfers in ``directions``
        (PUSH: up and in; FETCH: out and down); a stage whose rate is unchanged is left as it is."""
        if self.one_machine:   # every stage is CPU work on the one host: all rates move together
            self._rerate_machine(t)
            return
        for h in hosts:
            mine = [k for k, st in self.stages.items() if st.kind == COMPUTE and self.host[k] == h]
            rate = 1.0 if self.devices is None or len(mine) <= self.devices else self.devices / len(mine)
            for k in mine:
                self._set_rate(k, t, rate)
        for direction in directions:
            for k, rate in self._flow_rates(direction).items():
                self._set_rate(k, t, rate)

    def _rerate_machine(self, t: float) -> None:
        """cost.machine.single: the cores shared by every compute (weight 1), loopback transfer (2)
        and transfer across a limited link (its bytes/s x link_cpu_s_per_byte)."""
        links = {**self._flow_rates(FETCH), **self._flow_rates(PUSH)}
        # cores per unit of a limited-link transfer's rate; 0 without a limited link, where
        # full_Bps is infinite (inf x 0 would be nan)
        cpu_s_per_byte = self.model.cost.machine.link_cpu_s_per_byte
        per_rate = self.full_Bps * cpu_s_per_byte if cpu_s_per_byte else 0.0
        weight = sum(1 if st.kind not in (FETCH, PUSH) else per_rate * links[k] if self.paths[k][st.kind] else 2
                     for k, st in self.stages.items())
        cpu = 1.0 if weight <= self.devices else self.devices / weight
        for k, st in list(self.stages.items()):
            if k not in links:
                self._set_rate(k, t, cpu)
            else:   # a transfer: across a limited link, the link's share alone
                self._set_rate(k, t, links[k] if self.paths[k][st.kind] else min(cpu, links[k]))

    def _set_rate(self, client: int, t: float, rate: float) -> None:
        stage = self.stages[client]
        if stage.rate != rate:
            stage.set_rate(t, rate)
            heapq.heappush(self.ends, (stage.end, stage.seq, next(self.tick), client, stage))
            if len(self.ends) > 8 * len(self.stages) + 64:
                self._reindex()

    def _reindex(self) -> None:
        """The heap of stage ends, rebuilt from the stages (after a load; or to drop stale entries)."""
        self.tick = itertools.count()
        self.ends = [(st.end, st.seq, next(self.tick), k, st) for k, st in self.stages.items() if st.rate > 0]
        heapq.heapify(self.ends)

    def _flow_rates(self, direction: str) -> dict[int, float]:
        """Each transfer's fraction of full speed: its max-min fair share of its links."""
        paths = {k: self.paths[k][direction] for k, st in self.stages.items() if st.kind == direction}
        if not self.capacity:
            return dict.fromkeys(paths, 1.0)
        return {k: 1.0 if math.isinf(s) else s / self.full_Bps for k, s in max_min_shares(paths, self.capacity).items()}
