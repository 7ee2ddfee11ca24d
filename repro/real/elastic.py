"""Elastic clients of the real driver: joining a running run, and the server's side of a join.

This module owns the join handshake, nothing of training (what a user sees: docs/real.md, "Joins, and security"). A
joiner takes a ticket from the running server's store, writes its request under it and reads the answer (a client
id, or why not); the two then make their own 2-rank gloo group (:func:`~repro.real.groups.pair_group`), swap HELLOs,
and the client is served like any other. Every wait is bounded; a join that cannot go on ends in one line (issue 32).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import NoReturn

import torch.distributed as dist

from repro.config.settings import RunConfig
from repro.logs import get_logger
from repro.real.client import build_client, device_for, run_client
from repro.real.frames import fingerprint, trained
from repro.real.groups import bounded, disconnect, first_line, pair_group, pin_gloo
from repro.real.transport import Channel
from repro.runtime import EXIT_INTERRUPTED, SIGNALS
from repro.workload.build import load_data

_log = get_logger("repro.real.elastic")

COUNT_KEY = "repro/join/count"
CLOSED_KEY = "repro/join/closed"   # set once the run serves no more joins (it is ending)
BUSY_KEY = "repro/busy"   # the run's (not a join's): counted up while the server waits for an evaluation
EXIT_REFUSED = 2   # a refused join is bad input: the joiner's config, id or timing
ENDED = "the run has ended (its budget is spent or it was stopped): nothing to join"


def ticket_key(n: int, what: str) -> str:
    return f"repro/join/{n}/{what}"


class Refused(Exception):
    """A join the server turns down; the message says why."""


class Acceptor(threading.Thread):
    """The server's side: admit each ticket's joiner in order (``loop``: the :class:`~repro.real.server.Dispatcher`)."""

    def __init__(self, loop, store):
        super().__init__(name="join-acceptor", daemon=True)
        self.loop, self.store = loop, store
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
        with contextlib.suppress(Exception):   # the store may be gone: a joiner is told by its connect
            self.close()

    def close(self) -> None:
        """Tell every joiner at once that the run has ended: the closed mark first, then a refusal for each
        ticket not yet read (a ticket taken after the count is read here sees the mark: :func:`_take_ticket`)."""
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
                _log.info(f"[real server] join ticket {n} wrote no request within backend.client_timeout_s; skipped")
            else:
                self.admit(n, self.store.get(ticket_key(n, "request")))
            self.seen = n

    def admit(self, n: int, raw: bytes) -> None:
        self.store.delete_key(ticket_key(n, "request"))   # read; the answer is the joiner's to delete
        request: dict = {}
        try:
            request = join_request(raw)
            k = self.loop.admit(request)
        except Refused as why:
            self.store.set(ticket_key(n, "answer"), json.dumps({"refused": str(why)}))
            _log.info(f"[real server] join refused (pid {request.get('pid')} on {request.get('host')}): {why}")
            return
        self.store.set(ticket_key(n, "answer"), json.dumps({"client": k}))
        self.loop.add_client(k, self.store, ticket_key(n, "pair"))
        self.store.delete_key(ticket_key(n, "answer"))   # joined, or dropped (and so never deleted it)


def join_request(raw: bytes) -> dict:
    """A ticket's request, or Refused when it is not a joiner's (a damaged or foreign write to the store)."""
    try:
        request = json.loads(raw)
    except ValueError as exc:   # (a JSONDecodeError, or bytes that are not UTF-8)
        raise Refused(f"a malformed join request: {exc}") from None
    if not isinstance(request, dict) or not isinstance(request.get("client"), (int, type(None))):
        raise Refused("a malformed join request: not a JSON object with a client id or null")
    return request


class JoinEnded(Exception):
    """A join that ends before training; the message is its one line, ``code`` the exit code."""

    def __init__(self, message: str, code: int = EXIT_REFUSED):
        super().__init__(message)
        self.code = code


def _take_ticket(host: str, port: int, cfg: RunConfig):
    """Connect to the run's store, take a ticket, write the request under it: (store, ticket), or JoinEnded."""
    timeout = datetime.timedelta(seconds=cfg.backend.timeout_s)
    store = dist.TCPStore(host, port, None, False, timeout=timeout)
    if not store.check([COUNT_KEY]):   # a TCPStore, not a run's (make_store marks it): torchrun's, say
        raise JoinEnded(f"refused: backend.join={cfg.backend.join} is a store but not a run's (a torchrun "
                        f"run serves no joins; a run that does logs 'accepting joins at HOST:PORT')")
    n = store.add(COUNT_KEY, 1)
    if store.check([CLOSED_KEY]):   # after the ticket: see Acceptor.close
        raise JoinEnded(f"refused: {ENDED}")
    store.set(ticket_key(n, "request"), json.dumps({
        "fingerprint": fingerprint(cfg), "trained": trained(cfg), "client": cfg.backend.join_client,
        "pid": os.getpid(), "host": socket.gethostname()}))
    return store, n


def _read_answer(store, n: int, timeout_s: float) -> dict:
    """Ticket ``n``'s answer, waited for up to ``timeout_s`` past the server's last count of BUSY_KEY (it
    admits nobody while it waits for an evaluation); each look bounded (a stopped server answers nothing)."""
    key, beats, since = ticket_key(n, "answer"), None, time.monotonic()
    while not (seen := bounded(lambda: (store.check([key]), store.add(BUSY_KEY, 0)), timeout_s, "answer"))[0]:
        if seen[1] != beats:
            beats, since = seen[1], time.monotonic()
        elif time.monotonic() - since > timeout_s:
            raise TimeoutError(f"answer: no answer within {timeout_s:g} s")
        time.sleep(0.05)

    def read() -> dict:
        answer = json.loads(store.get(key))
        store.delete_key(key)   # read: nothing of this ticket stays in the store
        return answer
    return bounded(read, timeout_s, "answer")


def ask(cfg: RunConfig):
    """The join handshake: (store, ticket, client id), or JoinEnded saying why not; each step bounded."""
    host, _, port = cfg.backend.join.rpartition(":")
    timeout_s, where = cfg.backend.timeout_s, f"backend.join={cfg.backend.join}"
    try:   # nothing listening is refused at once (TCPStore would retry, printing C++ stacks)
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise JoinEnded(f"refused: no run is listening at {where} (it has ended, or the address is wrong): "
                        f"{exc.strerror or exc}") from None
    try:
        store, n = bounded(lambda: _take_ticket(host, int(port), cfg), timeout_s, "connect")
    except TimeoutError:
        raise JoinEnded(f"refused: nothing at {where} answered as a run within backend.timeout_s="
                        f"{timeout_s:g} s (is it the address a run logs as 'accepting joins at'?)") from None
    except JoinEnded:
        raise
    except Exception as exc:
        raise JoinEnded(f"refused: no run is listening at {where}: {first_line(exc)}") from None
    try:
        answer = _read_answer(store, n, timeout_s)
    except Exception as exc:
        raise JoinEnded(f"the server at {cfg.backend.join} did not answer within backend.timeout_s="
                        f"{timeout_s:g} s: {first_line(exc)}", code=1) from None
    if "refused" in answer:
        raise JoinEnded(f"refused: {answer['refused']}")
    return store, n, int(answer["client"])


def join_run(cfg: RunConfig, on_admitted=lambda k: None) -> int:
    """A joining client's process: ask the server at ``backend.join`` for an id, connect, train until STOP.
    Returns the exit code (0 after STOP, 2 refused, 1 lost); ``on_admitted(k)``: told the id once connected."""
    pin_gloo(cfg.backend.join.rpartition(":")[0], single_node=True)
    ds = load_data(cfg, "cpu")   # before the ticket: the server's wait for the pair group is not spent on it
    try:
        store, n, k = ask(cfg)
    except JoinEnded as why:
        print(f"[real join] {why}", file=sys.stderr, flush=True)
        return why.code
    setup = build_client(cfg, k, device_for(cfg, "client_device", k), ds)   # a spawned client's rule: device k mod G
    timeout_s = cfg.backend.timeout_s
    try:
        group = bounded(lambda: pair_group(store, ticket_key(n, "pair"), 1, timeout_s), timeout_s, "pair group")
    except Exception as exc:
        print(f"[real join] client {k} could not connect to the server: {first_line(exc)}", file=sys.stderr, flush=True)
        return 1
    _log.info(f"[real client {k}] joined the run at {cfg.backend.join}")
    on_admitted(k)
    try:
        channel = Channel(group, 0, timeout_s, watched=True, peer_in_group=0)
        return run_client(cfg, k, channel, setup, rejoin="a server drops a client silent for its "
                          f"backend.client_timeout_s (one suspended, say): {rejoin_hint(k)}")
    finally:
        disconnect()


def rejoin_hint(k: int) -> str:
    """How lost client ``k`` comes back: the server takes its id back once it counts it lost."""
    return f"if the run goes on, rejoin as this client with the same command and backend.join_client={k}"


def join_process(cfg: RunConfig) -> NoReturn:
    """The command line's joiner, to its exit: :func:`join_run` in a thread, so that a signal is heard at once
    in the main thread, whatever C++ wait the joiner is in (one line, exit 130). Every ending is ``os._exit``
    once the output is flushed: the interpreter's shutdown would destroy gloo's objects while their threads
    still run, which aborts ('terminate called without an active exception')."""
    admitted: list[int] = []
    result: list[int] = []

    def leave(signum, frame) -> None:
        name = signal.Signals(signum).name
        if admitted:
            k = admitted[0]
            line = (f"[real client {k}] {name}: left the run at {cfg.backend.join}; the server counts "
                    f"client {k} lost ({rejoin_hint(k)})")
        else:
            line = f"[real join] {name}: stopped before joining the run at {cfg.backend.join}"
        print(line, file=sys.stderr, flush=True)
        _leave_now(EXIT_INTERRUPTED)

    for sig in SIGNALS:
        signal.signal(sig, leave)
    worker = threading.Thread(target=lambda: result.append(join_run(cfg, admitted.append)), name="joiner", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)   # in slices: a signal's handler runs between them
    _leave_now(result[0] if result else 1)


def _leave_now(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
