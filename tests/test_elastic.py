"""Elastic clients of the real driver (issue 20): a client joins a running run through the
store, a lost client is replaced, a refused join leaves the run untouched.

Three join tests run in the default suite (a SIGKILLed client of a run in the test's process
replaced by a joiner, whose run is then replayed; in-process: a join after the run ended, a ticket that never brings its
request); the others are ``slow``, as are the edges in tests/test_elastic_edges.py. Every run
listens on loopback only and each test removes its processes.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import signal
import threading
import time

import pandas as pd
import pytest
import torch

from repro.config.settings import BackendConfig, CostConfig, ModelConfig
from repro.real import run_real
from tests.helpers.invariants import check_run_folder
from tests.helpers.joins import elastic_cfg, join_keys_left, start_joiner, wait_log
from tests.helpers.processes import assert_no_leftovers, free_port
from tests.helpers.runs import killing_a_client, launch_real, real_cfg, wait_rows
from tests.helpers.tables import table_frames


class _Said(logging.Handler):
    """What a run in this process logs (the package's logger), for a thread to wait on."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def wait(self, pattern: str, ended: threading.Event, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(re.search(pattern, line) for line in self.lines):
            assert not ended.is_set() and time.monotonic() < deadline, f"the run never logged {pattern!r}"
            time.sleep(0.05)


def _kill_one_and_join(tmp_path, cfg, victim: int, **backend):
    """Run ``cfg`` in this process (its fork server is up: no launcher importing torch), SIGKILL
    client ``victim`` once it is training, start a joiner (with ``backend`` settings) after the
    loss is logged, check that the join left no key in the store (its ticket, its pair group's
    addresses); return the run folder once both have ended and the joiner left nothing behind."""
    run_dir, said, ended, joined = tmp_path / "run", _Said(), threading.Event(), {}

    def join_after_the_loss():   # a thread: the run holds the main one
        try:
            said.wait("accepting joins at", ended)
            said.wait("lost at version", ended)
            joined["joiner"] = start_joiner(tmp_path, cfg, **backend)
            said.wait(r"client \d+ (re)?joined", ended)   # a lost id back is "rejoined"
            joined["keys left"] = join_keys_left(cfg.backend.master_port)
        except AssertionError as exc:
            joined["error"] = exc

    logger, thread = logging.getLogger("repro"), threading.Thread(target=join_after_the_loss, daemon=True)
    logger.addHandler(said)
    thread.start()
    try:
        with killing_a_client(run_dir, 10, victim - 1):
            run_real(cfg, run_dir)
    finally:
        ended.set()
        thread.join()
        logger.removeHandler(said)
        if "joiner" in joined:
            try:
                assert joined["joiner"].wait(timeout=30) == 0, (tmp_path / "joiner.log").read_text()
            finally:
                assert_no_leftovers(joined["joiner"])
    if "error" in joined:
        raise joined["error"]
    assert joined["keys left"] == []
    return run_dir


def test_killed_client_is_replaced_by_a_joiner(tmp_path, no_children):
    """SIGKILL a client mid-run and join a replacement: the run ends completed (not degraded),
    versions contiguous and unique, events client_lost then client_joined, and the joiner's
    pushes in updates.csv under a new id (never the dead process's)."""
    # client 2 steps 16x slower (cost.speeds): once the fast client 1 is killed the run lasts
    # long enough for a joiner to start (alone, client 2 needs ~15 s for the 8 epochs); joiner 3
    # takes slot 1, the fast one, and ends the run soon after it joins
    cfg = elastic_cfg(free_port(), num_epochs=8.0, cost=CostConfig(speeds=[1.0, 16.0]))
    run_dir = _kill_one_and_join(tmp_path, cfg, victim=1)
    upd, _, summary = table_frames(run_dir)
    assert summary["status"] == "completed", summary["message"]
    kinds = [e["type"] for e in summary["events"]]
    assert kinds.index("client_lost") < kinds.index("client_joined")
    joined = next(e for e in summary["events"] if e["type"] == "client_joined")
    assert joined["client"] == 3   # the next id never used, not the dead client's
    assert (upd.client == 3).sum() > 0
    assert (upd[upd.client == 3].staleness >= 0).all()
    check_run_folder(run_dir)
    assert_replay_reproduces(run_dir, tmp_path / "replay")


def assert_replay_reproduces(run_dir, replay_dir, interrupt: bool = False) -> None:
    """``cost=replay`` of a recorded run whose membership changed applies the same pushes in the
    same order with the same numbers (a joiner fetches its join's version, as in the real run;
    bitwise here: see tests/test_replay.py for why) and records the same membership events.
    ``interrupt``: the replay is stopped just after the last membership event and resumed
    (resume=true), which must change nothing."""
    from repro.config.checks import from_dict
    from repro.sim.driver import simulate

    cfg = from_dict(json.loads((run_dir / "config.json").read_text()))
    cfg = cfg.replace(cost=CostConfig(profile="replay", schedule="replay", path=str(run_dir)),
                      backend=BackendConfig(name="sim"))
    real_upd, _, real = table_frames(run_dir)
    membership = lambda s: [(e["type"], e["client"], e["version"]) for e in s["events"]  # noqa: E731
                            if e["type"].startswith("client_")]
    assert membership(real), "a recording without joins or losses proves nothing here"
    if interrupt:
        stop_at = membership(real)[-1][2] + 2
        assert simulate(cfg, replay_dir, stop_at_version=stop_at)["status"] == "interrupted"
        cfg = cfg.replace(resume=True)
    simulate(cfg, replay_dir)
    upd, _, summary = table_frames(replay_dir)
    exact = ["version", "client", "read_version", "staleness", "num_steps", "num_samples", "time_s"]
    pd.testing.assert_frame_equal(real_upd[exact], upd[exact])
    pd.testing.assert_series_equal(real_upd.train_loss, upd.train_loss, rtol=1e-6, atol=0)
    pd.testing.assert_series_equal(real_upd.train_error, upd.train_error)
    assert membership(summary) == membership(real)
    assert summary["status"] == real["status"], summary["message"]


@pytest.mark.slow
def test_two_joiners_raise_throughput(tmp_path):
    """Two clients join a 1-client run mid-way: pushes per second rise (a budget far beyond the
    test; it is interrupted once the three have pushed a while together)."""
    cfg = elastic_cfg(free_port(), num_clients=1, num_epochs=1000.0, eval_every=500.0, max_clients=3)
    proc, run_dir = launch_real(tmp_path, cfg)
    joiners = []
    try:
        wait_log(proc, tmp_path / "run.log", "accepting joins at")
        wait_rows(proc, run_dir, 30)
        joiners = [start_joiner(tmp_path, cfg, f"joiner{i}") for i in (1, 2)]
        wait_log(proc, tmp_path / "run.log", "client 3 joined", timeout_s=120)
        wait_rows(proc, run_dir, sum(1 for _ in open(run_dir / "updates.csv")) + 60)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        for j in joiners:
            assert j.wait(timeout=30) == 0
    finally:
        assert_no_leftovers(proc)
        for j in joiners:
            assert_no_leftovers(j)
    upd, _, summary = table_frames(run_dir)
    assert summary["status"] == "interrupted", summary["message"]
    assert {2, 3} <= set(upd.client)
    t_joined = max(e["joined_time_s"] for e in summary["events"] if e["type"] == "client_joined")
    t_first = min(e["joined_time_s"] for e in summary["events"] if e["type"] == "client_joined")
    solo = upd[upd.time_s < t_first].sort_values("time_s")
    trio = upd[upd.time_s > t_joined].sort_values("time_s")
    rate = lambda d: (len(d) - 1) / (d.time_s.iloc[-1] - d.time_s.iloc[0])  # noqa: E731
    assert rate(trio) > rate(solo), (rate(solo), rate(trio))
    check_run_folder(run_dir)


@pytest.mark.slow
def test_refused_joins_leave_the_run_untouched(tmp_path):
    """A joiner with another model, one beyond backend.max_clients, and one asking for a live
    id are refused (exit 2, a message naming why) while the run trains on with its own clients
    (a budget far beyond the test: it pushes on after the refusals, then is interrupted); the
    refusals leave no key in the store; a join after the run's process exited is refused too."""
    cfg = elastic_cfg(free_port(), num_epochs=1000.0, eval_every=500.0)
    proc, run_dir = launch_real(tmp_path, cfg)
    try:
        wait_log(proc, tmp_path / "run.log", "accepting joins at")
        wait_rows(proc, run_dir, 5)
        joiners = [start_joiner(tmp_path, cfg.replace(model=ModelConfig(name="mlp")), "other"),
                   start_joiner(tmp_path, cfg, "full"), start_joiner(tmp_path, cfg, "live", join_client=1)]
        assert [j.wait(timeout=90) for j in joiners] == [2, 2, 2]
        assert join_keys_left(cfg.backend.master_port) == []   # refused tickets leave nothing either
        wait_rows(proc, run_dir, sum(1 for _ in open(run_dir / "updates.csv")) + 20)   # it goes on
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        assert_no_leftovers(proc)
    late = start_joiner(tmp_path, cfg.replace(backend=dataclasses.replace(cfg.backend, timeout_s=3.0)), "late")
    try:   # the run's process has exited: nothing listens at its address any more
        assert late.wait(timeout=60) == 2
    finally:
        assert_no_leftovers(late)
    assert "no run is listening" in (tmp_path / "late.log").read_text()
    assert "config differs" in (tmp_path / "other.log").read_text()
    assert "max_clients=2" in (tmp_path / "full.log").read_text()
    assert "not a lost client" in (tmp_path / "live.log").read_text()
    upd, _, summary = table_frames(run_dir)
    assert summary["status"] == "interrupted"
    assert not [e for e in summary["events"] if e["type"].startswith("client_")]
    assert set(upd.client) == {1, 2}
    check_run_folder(run_dir)


@pytest.mark.slow
def test_restarted_client_rejoins_under_its_id(tmp_path, no_children):
    """A SIGKILLed client restarted with backend.join_client=<its id> is client_rejoined: the
    run ends completed, the id's pushes continue after the event, and a replay reproduces them,
    also one interrupted after the rejoin and resumed."""
    cfg = elastic_cfg(free_port(), num_epochs=20.0, cost=CostConfig(speeds=[4.0, 1.0]))
    run_dir = _kill_one_and_join(tmp_path, cfg, victim=2, join_client=2)
    upd, _, summary = table_frames(run_dir)
    assert summary["status"] == "completed", summary["message"]
    back = next(e for e in summary["events"] if e["type"] == "client_rejoined")
    assert back["client"] == 2 and summary["lost_clients"] == []
    assert (upd[upd.version > back["version"]].client == 2).any()
    check_run_folder(run_dir)
    # the rejoiner is a fresh process under its lost id; the replay also stops and resumes after it
    assert_replay_reproduces(run_dir, tmp_path / "replay", interrupt=True)


# -- the bookkeeping of a join, without processes (fast) -----------------------------------------

def _push(k: int, read_version: int) -> "Push":
    import torch

    from repro.asgd.algorithm import Push

    return Push(client=k, read_version=read_version, update=torch.zeros(3), num_steps=1, num_samples=1,
                train_loss=1.0, train_error=0.5, stream_position=(0, 0))


def test_a_joiner_from_before_a_resume_stands_in_for_no_client_lost_after_it(tmp_path):
    """A resume restarts clients 1..num_clients, not joiners: client 3 joined (an extra, room
    under backend.max_clients) before the run was interrupted, client 1 was lost after the
    resume, and client 2 alone finished the budget: completed_degraded. The summary said
    completed, the earlier join counted as client 1's replacement."""
    from repro.asgd.algorithm import Push
    from repro.runs.core import RunCore
    from repro.runs.folder import run_folder
    from repro.workload.start import build_problem

    cfg, resume = real_cfg(nsync=1, num_epochs=0.5), None
    for phase in ("before", "after"):
        with run_folder(cfg, tmp_path) as run:
            run.core = core = RunCore(cfg, build_problem(cfg, torch.device("cpu")), tmp_path,
                                      clock="wall", backend="real", resume=resume)
            core.begin([1, 2])   # what the real driver starts, fresh or resumed
            if phase == "before":
                core.join(3, 0.5)
                core.finish("interrupted")
                resume, cfg = torch.load(tmp_path / "checkpoint.pt", weights_only=True), cfg.replace(resume=True)
                continue
            core.lose(1, "killed", 1.0)
            while not core.on_push(Push(client=2, read_version=core.server.version, num_steps=1,
                                        update=torch.zeros_like(core.server.params), num_samples=32,
                                        train_loss=1.0, train_error=0.5, stream_position=(0, 32)), 2.0).stopping:
                core.settle(2.0)
            summary = core.finish(*core.final_status(interrupted=False))
    assert (summary["status"], summary["lost_clients"]) == ("completed_degraded", [1]), summary


def test_a_lost_client_back_is_logged_rejoined_and_a_new_one_joined(tmp_path, monkeypatch, caplog):
    """The server's log said 'client 2 joined' for a lost client restarted under its id, which
    its events call client_rejoined: it now says 'rejoined' for it, 'joined' for a new id."""
    import repro.real.server as server
    from repro.runs.core import RunCore
    from repro.runs.folder import run_folder
    from repro.runtime import StopRequest
    from repro.workload.start import build_problem

    class Link:   # the pair group's channel and receiver, without a peer
        frame = None

        def __init__(self, *a, **kw):
            pass
        send = post = start = release = finish = __init__

    for name, fake in (("pair_group", Link), ("Channel", Link), ("Receiver", Link), ("greeted", Link),
                       ("forget_pair", Link)):
        monkeypatch.setattr(server, name, fake)
    cfg = real_cfg(nsync=1, num_epochs=0.5)
    with run_folder(cfg, tmp_path) as run, caplog.at_level("INFO", logger="repro"):
        run.core = core = RunCore(cfg, build_problem(cfg, torch.device("cpu")), tmp_path, clock="wall", backend="real")
        loop = server.Dispatcher(cfg, core, {1: Link(), 2: Link()}, StopRequest())
        core.begin([1, 2])
        with loop.lock:
            loop.lose(2, "killed")
        for k in (2, 3):
            loop.add_client(k, None, "")
        core.finish("interrupted")
    said = [r.getMessage() for r in caplog.records if " at version " in r.getMessage()]
    assert [m.split(" at version")[0].split("] ")[-1] for m in said if "joined" in m] == \
        ["client 2 rejoined", "client 3 joined"], said


def test_a_join_with_another_config_is_refused_naming_each_key_that_differs():
    """The joiner sends what it trains by key, so the refusal names each difference; it said
    only '(data, model, algo, protocol, seed, nsync or num_clients)', which left the user to
    find the key. A request without those keys (an older joiner's) gets the general line."""
    from types import SimpleNamespace

    from repro.real.elastic import Refused
    from repro.real.frames import fingerprint, trained
    from repro.real.server import Dispatcher

    cfg = elastic_cfg(0)
    joiner = cfg.replace(nsync=3, algo=dataclasses.replace(cfg.algo, lr=0.1))
    loop = SimpleNamespace(lock=threading.Lock(), closed=False, stopping=False, cfg=cfg)
    for request, named in (({"trained": trained(joiner)}, "(nsync=3, the run's 4; algo.lr=0.1, the run's 0.2)"),
                           ({}, "(data, model, algo, protocol, seed, nsync or num_clients)")):
        with pytest.raises(Refused) as why:
            Dispatcher.admit(loop, {"fingerprint": fingerprint(joiner), "client": None, **request})
        assert named in str(why.value), why.value


def test_protocols_count_a_joiner_from_its_fetch():
    """ssp: a joiner's clock starts at the slowest live client's (it holds nobody back and runs
    at most the bound ahead); sync: a round waits for the clients live at its start, and the
    joiner counts from the next round."""
    from repro.asgd.protocols import SSP, Sync, View
    from repro.config.settings import ProtocolConfig

    ssp = SSP(real_cfg(protocol=ProtocolConfig(name="ssp", staleness_bound=1)), [1, 2], 0)
    for v in range(3):
        ssp.on_push(_push(1, v), View(v, frozenset({1, 2})))
        ssp.on_push(_push(2, v), View(v, frozenset({1, 2})))
    ssp.on_join(3, View(6, frozenset({1, 2})))
    assert ssp.pushes[3] == 3   # not 0: clients 1 and 2 are not held back waiting for it
    sync = Sync(real_cfg(protocol=ProtocolConfig(name="sync")), [1, 2], 0)
    sync.on_push(_push(1, 0), View(0, frozenset({1, 2})))
    sync.on_join(3, View(0, frozenset({1, 2})))
    live = frozenset({1, 2, 3})
    decision = sync.on_push(_push(2, 0), View(0, live))
    assert decision.apply is not None and decision.preempt == (3,)   # closed without the joiner
    assert sync.needed(live) == 3   # the next round counts it


def test_ringmaster_and_rennalas_defaults_count_a_joiner():
    """R and S unset follow the live clients as the real driver's joins change them: with joiner
    3, three equally fast clients' pushes are 2 stale and applied (the start's R = 2 discarded
    them); a segment fetched among three keeps R = 3 after a loss (and a resume); Rennala's step
    waits for a push of each of the three live clients (S = 2 stepped without the joiner)."""
    from repro.asgd.optimal import Rennala, Ringmaster
    from repro.asgd.protocols import View
    from repro.config.settings import ProtocolConfig

    two, three, cfg = frozenset({1, 2}), frozenset({1, 2, 3}), real_cfg(protocol=ProtocolConfig(name="ringmaster"))
    ring = Ringmaster(cfg, [1, 2], 0)
    ring.on_join(3, View(0, two))
    for v, k in enumerate((1, 2, 3, 1, 2, 3)):   # each read the version its push before made
        decision = ring.on_push(_push(k, max(0, v - 2)), View(v, three))
        assert decision.apply is not None and decision.discarded == (), (k, v)
    assert ring.on_push(_push(1, 4), View(6, two)).apply is not None   # 3 lost: 2 stale, R 3
    restored = Ringmaster(cfg, [1, 2], 0)   # a resume keeps each segment's R
    restored.load_state_dict(ring.state_dict())
    assert restored.on_push(_push(2, 5), View(7, two)).apply is not None
    ren = Rennala(real_cfg(protocol=ProtocolConfig(name="rennala")), [1, 2], 0)
    ren.on_join(3, View(0, two))
    assert ren.on_push(_push(1, 0), View(0, three)).apply is None
    assert ren.on_push(_push(2, 0), View(0, three)).apply is None
    assert ren.on_push(_push(3, 0), View(0, three)).apply.num_samples == 3


def test_a_joiners_push_takes_no_place_in_a_sync_round():
    """Sync without backup workers: a joiner fetched round 0's parameters and pushed before
    client 2 (a joiner as fast as client 1, client 2 slower): the round still waits for client
    2, then merges all three pushes and discards nothing (it closed at the joiner's push and
    dropped client 2's segment). With every client of the round's start lost, the joiner's
    push closes it."""
    from repro.asgd.protocols import NOTHING, Sync, View
    from repro.config.settings import ProtocolConfig

    sync = Sync(real_cfg(protocol=ProtocolConfig(name="sync")), [1, 2], 0)
    sync.on_push(_push(1, 0), View(0, frozenset({1, 2})))
    sync.on_join(3, View(0, frozenset({1, 2})))
    live = frozenset({1, 2, 3})
    assert sync.on_push(_push(3, 0), View(0, live)) is NOTHING
    decision = sync.on_push(_push(2, 0), View(0, live))
    assert decision.apply.num_samples == 3 and decision.reply == (1, 2, 3) and decision.discarded == ()
    alone = Sync(real_cfg(protocol=ProtocolConfig(name="sync")), [1, 2], 0)
    alone.on_join(3, View(0, frozenset({1, 2})))
    alone.on_push(_push(3, 0), View(0, frozenset({1, 2, 3})))
    assert alone.on_lost(1, View(0, frozenset({2, 3}))) is NOTHING
    assert alone.on_lost(2, View(0, frozenset({3}))).apply is not None


def test_bad_elastic_keys_exit_before_any_work():
    from repro.config.checks import validate
    from repro.errors import ConfigError

    cases = {"backend.max_clients": dict(max_clients=1), "backend.join": dict(join="nohost"),
             "backend.join_client": dict(join_client=2)}
    for key, backend in cases.items():
        cfg = real_cfg(num_clients=2)
        cfg = cfg.replace(backend=dataclasses.replace(cfg.backend, **backend))
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            validate(cfg)


def test_a_join_after_the_run_ended_is_told_so(monkeypatch, capsys):
    """Once a run serves no more joins, every joiner is refused with 'the run has ended' (exit
    2), at once rather than after backend.timeout_s: one whose ticket the acceptor had not read,
    and one that takes its ticket afterwards. In-process: a store and an acceptor whose run is
    closed (the slow refusal test joins a real run after its process exited)."""
    import datetime
    from types import SimpleNamespace

    import torch.distributed as dist

    from repro.real.elastic import COUNT_KEY, ENDED, Acceptor, join_run, ticket_key

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")   # join_run pins gloo to loopback: restored after
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=5))
    early = store.add(COUNT_KEY, 1)   # a joiner that took its ticket before the run closed
    cfg = elastic_cfg(0)
    acceptor = Acceptor(SimpleNamespace(closed=True, cfg=cfg), store)
    acceptor.start()
    acceptor.join(timeout=10)
    assert json.loads(store.get(ticket_key(early, "answer"))) == {"refused": ENDED}
    late = cfg.replace(backend=dataclasses.replace(cfg.backend, join=f"127.0.0.1:{store.port}", timeout_s=5.0))
    assert join_run(late) == 2
    assert "the run has ended" in capsys.readouterr().err


def test_a_ticket_without_a_request_is_skipped_after_the_client_timeout():
    """A joiner that takes its ticket and hangs before writing its request holds the tickets
    after it only for backend.client_timeout_s: then it is skipped and the next joiner admitted
    (in-process: a store, an acceptor polled by hand; the slow edge test does it with processes,
    also for a joiner that hangs after its answer)."""
    import datetime
    from types import SimpleNamespace

    import torch.distributed as dist

    from repro.real.elastic import COUNT_KEY, Acceptor, ticket_key

    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=5))
    cfg = elastic_cfg(0)
    cfg = cfg.replace(backend=dataclasses.replace(cfg.backend, client_timeout_s=0.3))
    added = []
    loop = SimpleNamespace(closed=False, cfg=cfg, admit=lambda request: 7,
                           add_client=lambda k, store, prefix: added.append((k, prefix)))
    acceptor = Acceptor(loop, store)
    store.add(COUNT_KEY, 1)   # ticket 1: hangs
    second = store.add(COUNT_KEY, 1)
    store.set(ticket_key(second, "request"), json.dumps({"fingerprint": "", "client": None}))
    acceptor.poll()
    assert added == [] and acceptor.seen == 0   # waiting for ticket 1's request
    time.sleep(0.4)
    acceptor.poll()
    assert added == [(7, f"repro/join/{second}/pair")] and acceptor.seen == 2
    assert not store.check([ticket_key(second, "request"), ticket_key(second, "answer")])


def test_a_malformed_join_request_is_refused_and_the_next_joiner_admitted():
    """A ticket whose request is not a joiner's (a damaged or foreign write into the run's store:
    not JSON, not an object, a client id that is no integer) is refused under its ticket and the
    next joiner admitted; the first one stopped the acceptor, and every later joiner waited
    backend.timeout_s for an answer (in-process, as the test above)."""
    import datetime
    from types import SimpleNamespace

    import torch.distributed as dist

    from repro.real.elastic import COUNT_KEY, Acceptor, ticket_key

    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=5))
    added = []
    loop = SimpleNamespace(closed=False, cfg=elastic_cfg(0), admit=lambda request: 7,
                           add_client=lambda k, store, prefix: added.append(k))
    bad = ["not json{", "[1]", json.dumps({"client": "abc"}), b"\xff"]
    for request in [*bad, json.dumps({"fingerprint": "", "client": None})]:
        store.set(ticket_key(store.add(COUNT_KEY, 1), "request"), request)
    Acceptor(loop, store).poll()
    for n in range(1, len(bad) + 1):
        assert "a malformed join request" in json.loads(store.get(ticket_key(n, "answer")))["refused"]
    assert added == [7]
