"""Elastic clients of the real driver: joining a running run, and the server's side of a join.

This module owns the join handshake, nothing of training. A running single-node server keeps
its rendezvous store open for the whole run and logs ``accepting joins at HOST:PORT``. A joiner
(``python -m repro.run backend=real <the run's overrides> backend.join=HOST:PORT``) takes a
ticket from the store (an atomic counter), writes its request under the ticket (its config's
fingerprint, a client id to rejoin as, its pid and host), and reads the answer: a client id, or
why it is refused (another model or config, beyond ``backend.max_clients``, a live id asked for,
the run is ending). Then the two make their 2-rank gloo group from the ticket's prefix of the
store (:func:`repro.real.transport.pair_group`, as torchft's parameter-server prototype does), swap
HELLOs, and the client is served like any other: it fetches the current version and is counted
from its first push. No world group is touched, so nobody else waits while a client joins.

Ids: a new joiner gets the next id never used in the run (so an id is never reused for another
process, across resumes too); a restarted client may ask for its lost id back
(``backend.join_client``), which is recorded as ``client_rejoined``. What is per client (speeds,
data shards) for id k > num_clients is slot ((k - 1) mod N) + 1
(:func:`repro.config.settings.client_slot`).

Every wait is bounded as before: a joiner silent between its ticket and its HELLO is dropped after
``backend.client_timeout_s``; a joiner waits for its answer at most ``backend.timeout_s``, and
loads its data before it takes a ticket, so that the server's wait for its pair group is not
spent on it. Once the run serves no more joins the acceptor marks the store closed and refuses
every ticket it has not read, so a late joiner is told at once (exit 2, as any refusal; also
when nothing listens any more). Nothing of a join stays in the store: the request is deleted
once read, the answer by the joiner once read (and by the server after the join, for a joiner
that died before), the pair group's gloo addresses once the group is made or given up.

Under torchrun: each worker with ``backend.join`` is one joiner, so ``torchrun --nnodes=1:2
--max-restarts=K`` restarts a lost client and it joins again (a fresh id) while the server, a
single-node run outside torchrun, goes on; see the README's "Clients restarted by torchrun".
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import sys
import threading
import time

import torch.distributed as dist

from repro.config.settings import RunConfig, to_dict
from repro.logs import get_logger

_log = get_logger("repro.real.elastic")

COUNT_KEY = "repro/join/count"
CLOSED_KEY = "repro/join/closed"   # set once the run serves no more joins (it is ending)
EXIT_REFUSED = 2   # a refused join is bad input: the joiner's config, id or timing


def ticket_key(n: int, what: str) -> str:
    return f"repro/join/{n}/{what}"


def fingerprint(cfg: RunConfig) -> str:
    """What a joiner must share with the run: what is trained and how (the model, the data, the
    algorithm, the protocol, the seed, nsync, num_clients for the slots). Not the run's
    bookkeeping (folders, progress, backend keys)."""
    d = to_dict(cfg)
    shared = {k: d[k] for k in ("data", "model", "algo", "protocol", "seed", "nsync", "num_clients")}
    return hashlib.sha256(json.dumps(shared, sort_keys=True, default=str).encode()).hexdigest()[:16]


ENDED = "the run has ended (its budget is spent or it was stopped): nothing to join"


class Refused(Exception):
    """A join the server turns down; the message says why."""


class Acceptor(threading.Thread):
    """The server's side: watch the store for tickets and admit each joiner in ticket order.
    ``loop`` is the :class:`~repro.real.server.Dispatcher` (admit, add_client, closed)."""

    def __init__(self, loop, store, address: str):
        super().__init__(name="join-acceptor", daemon=True)
        self.loop, self.store, self.address = loop, store, address
        self.done = threading.Event()
        self.seen = 0
        self.waiting_since: dict[int, float] = {}   # tickets taken whose request is not written yet

    def run(self) -> None:
        while not self.done.is_set() and not self.loop.closed:
            try:
                self.poll()
            except Exception as exc:   # the store is gone: the run is ending
                if not self.done.is_set() and not self.loop.closed:
                    _log.info(f"[real server] join acceptor stopped: {exc}")
                return
            self.done.wait(0.1)
        try:
            self.close()
        except Exception:   # the store is gone already: a joiner is told by its connect
            pass

    def close(self) -> None:
        """Tell every joiner that the run has ended instead of letting it wait for an answer
        (``backend.timeout_s``) while the server finishes: the closed mark first, then a refusal
        for each ticket not yet read. A ticket taken after the count is read here sees the mark
        (:func:`join_run` looks after taking its ticket), so no joiner is left unanswered."""
        self.store.set(CLOSED_KEY, "1")
        for n in range(self.seen + 1, self.store.add(COUNT_KEY, 0) + 1):
            self.store.set(ticket_key(n, "answer"), json.dumps({"refused": ENDED}))

    def poll(self) -> None:
        count = self.store.add(COUNT_KEY, 0)
        while self.seen < count:
            n = self.seen + 1
            if not self.store.check([ticket_key(n, "request")]):
                first = self.waiting_since.setdefault(n, time.monotonic())
                if time.monotonic() - first < self.loop.cfg.backend.client_timeout_s:
                    return   # its request is on its way
                _log.info(f"[real server] join ticket {n} wrote no request within "
                          f"backend.client_timeout_s; skipped")
            else:
                self.admit(n, json.loads(self.store.get(ticket_key(n, "request"))))
            self.seen = n

    def admit(self, n: int, request: dict) -> None:
        self.store.delete_key(ticket_key(n, "request"))   # read; the answer is the joiner's to delete
        try:
            k = self.loop.admit(request)
        except Refused as why:
            self.store.set(ticket_key(n, "answer"), json.dumps({"refused": str(why)}))
            _log.info(f"[real server] join refused (pid {request.get('pid')} on {request.get('host')}): {why}")
            return
        self.store.set(ticket_key(n, "answer"), json.dumps({"client": k}))
        self.loop.add_client(k, self.store, f"repro/join/{n}/pair")
        # joined (it read its answer before its pair group) or dropped: a joiner that died or hung
        # after reading its answer never deleted it
        self.store.delete_key(ticket_key(n, "answer"))

    def finish(self) -> None:
        self.done.set()


def join_run(cfg: RunConfig) -> int:
    """A joining client's process: ask the server at ``backend.join`` for an id, connect, train
    until STOP. Returns the process exit code (0 after STOP, 2 refused, also when the run has
    ended or nothing listens at the address, 1 lost)."""
    from repro.real.client import build_client, client_device, run_client
    from repro.real.transport import Channel, disconnect, pair_group, pin_gloo_to_loopback

    from repro.problem.build import load_data

    host, _, port = cfg.backend.join.rpartition(":")
    pin_gloo_to_loopback(host, single_node=True)
    # the data before the ticket: once admitted, the server waits backend.client_timeout_s for the
    # pair group, and loading data (seconds on a busy machine) must not eat into that wait
    ds = load_data(cfg, "cpu")
    timeout = datetime.timedelta(seconds=cfg.backend.timeout_s)
    try:
        store = dist.TCPStore(host, int(port), None, False, timeout=timeout)
    except Exception as exc:
        print(f"[real join] refused: no run is listening at backend.join={cfg.backend.join} (it has "
              f"ended, or the address is wrong): {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    n = store.add(COUNT_KEY, 1)
    if store.check([CLOSED_KEY]):   # after the ticket: see Acceptor.close
        print(f"[real join] refused: {ENDED}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    store.set(ticket_key(n, "request"), json.dumps({
        "fingerprint": fingerprint(cfg), "client": cfg.backend.join_client, "pid": os.getpid(),
        "host": socket.gethostname()}))
    try:
        answer = json.loads(store.get(ticket_key(n, "answer")))
    except Exception as exc:
        print(f"[real join] the server at {cfg.backend.join} did not answer within backend.timeout_s="
              f"{cfg.backend.timeout_s:g} s: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        return 1
    store.delete_key(ticket_key(n, "answer"))   # read: nothing of this ticket stays in the store
    if "refused" in answer:
        print(f"[real join] refused: {answer['refused']}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    k = int(answer["client"])
    # the same local rank rule as a spawned client: client k, device (k mod G)
    setup = build_client(cfg, k, client_device(cfg, k), ds)
    try:
        group = pair_group(store, f"repro/join/{n}/pair", 1, cfg.backend.timeout_s)
    except Exception as exc:
        print(f"[real join] client {k} could not connect to the server: {str(exc).splitlines()[0]}",
              file=sys.stderr, flush=True)
        return 1
    _log.info(f"[real client {k}] joined the run at {cfg.backend.join}")
    try:
        channel = Channel(group, 0, cfg.backend.timeout_s, watched=True, peer_in_group=0)
        return run_client(cfg, k, channel, setup)
    finally:
        disconnect()
