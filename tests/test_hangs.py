"""No run hangs (issue 16, section 1): a non-finite start ends the run ``diverged`` at once, in
both drivers; one push may not exceed the budget; a stop request is honoured between two local
steps of a push, however long, in the simulator and in a real client. Every test is bounded by
its own timeout, so a regression fails instead of hanging the suite."""
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
import torch

from repro.asgd.flatnet import FlatNet
from repro.config.checks import validate
from repro.config.settings import AlgoConfig, BackendConfig, CostConfig, DataConfig, ModelConfig, RunConfig
from repro.errors import ConfigError
from repro.workload.build import EvalSets
from repro.workload.start import build_problem
from repro.real.client import build_client, run_client
from repro.real.server import Dispatcher
from repro.real.frames import Header, Kind, hello
from repro.runs.core import RunCore
from repro.runs.folder import run_folder
from repro.runtime import StopRequest
from repro.sim.driver import simulate
from tests.helpers.channels import ScriptedChannel, watching_client
from tests.helpers.grids import cli_run

ROOT = Path(__file__).resolve().parent.parent
NAN = float("nan")


def cfg_for(**kw) -> RunConfig:
    base = dict(num_clients=2, nsync=2, num_epochs=2.0, eval_every=0.5, progress=False,
                data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"),
                algo=AlgoConfig(lr=0.05, momentum=0.5), cost=CostConfig(profile="u", compute_s=0.01))
    base.update(kw)
    return RunConfig(**base)


def evaluating_slowly(monkeypatch, batches: int, every_s: float) -> None:
    """Every evaluation first evaluates ``batches`` one-sample batches ``every_s`` apart (progress,
    :meth:`Evaluations.join`'s), then the real one."""
    import time

    from repro.runs import evaluations

    evaluate = evaluations.evaluate

    def slow(net, params, sets):
        for _ in range(batches):
            net.module(sets.x_test[:1])   # a batch: progress
            time.sleep(every_s)
        return evaluate(net, params, sets)

    monkeypatch.setattr(evaluations, "evaluate", slow)


def poisoned(cfg: RunConfig, what: str):
    """The problem ``cfg`` trains, with NaN where ``what`` says (below any input check: the
    run core must end the run whatever reaches it)."""
    problem = build_problem(cfg, torch.device("cpu"))
    ds = problem.dataset
    if what == "weight":
        problem.init_params[0] = NAN
    elif what == "every input":
        ds.x_train.fill_(NAN)
        ds.x_test.fill_(NAN)
    elif what == "one test input":
        ds.x_test[0, 0, 0, 0] = NAN
    problem.eval_sets = EvalSets.of(ds)
    return problem


# ---------------------------------------------------------------------------------------------
# a non-finite start
# ---------------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["weight", "every input", "one test input"])
def test_a_non_finite_start_ends_the_run_diverged_at_version_0(tmp_path, what):
    """Version 0's evaluation is non-finite: the run ends diverged before any push (it used to
    train on with evaluations off, or loop for good on pushes it could not apply). With finite
    parameters the message says the data (or the model's overflow) is the cause."""
    cfg = cfg_for()
    summary = simulate(cfg, tmp_path, problem=poisoned(cfg, what))
    assert summary["status"] == "diverged", summary["message"]
    assert summary["version"] == 0 and pd.read_csv(tmp_path / "updates.csv").empty
    finite_params = what != "weight"
    assert ("initial parameters are finite" in summary["message"]) == finite_params, summary["message"]


@pytest.mark.timeout(60)
def test_a_non_finite_push_after_divergence_still_stops_the_run(tmp_path):
    """A run already diverged whose stop flag was lost (as version 0's was, overwritten by the
    budget check): the next non-finite push must stop it again, not be skipped without a row
    while the loop turns for good."""
    from repro.asgd.algorithm import Push

    cfg = cfg_for()
    with run_folder(cfg, tmp_path) as run:
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="virtual", backend="sim")
        core.begin([1, 2])
        core.diverge("by hand")
        core.state.stopping = False
        bad = Push(client=1, read_version=0, update=torch.zeros_like(core.server.params), num_steps=2,
                   num_samples=64, train_loss=NAN, train_error=1.0, stream_position=(0, 0))
        outcome = core.on_push(bad, 1.0)
        assert [(r.client, r.stop) for r in outcome.replies] == [(1, True)]
        assert outcome.stopping
        assert core.finish(*core.final_status(interrupted=False))["status"] == "diverged"


@pytest.mark.timeout(180)
def test_a_real_run_from_non_finite_parameters_ends_diverged(tmp_path, monkeypatch):
    """The real server evaluates version 0 before it greets the clients: non-finite, every
    client is told STOP and the run ends diverged (it used to serve pushes it could not apply,
    for good)."""
    import repro.real.launch as launch

    def nan_problem(cfg, device):
        problem = build_problem(cfg, device)
        problem.init_params[0] = NAN
        return problem

    monkeypatch.setattr(launch, "build_problem", nan_problem)
    backend = BackendConfig(name="real", timeout_s=60.0, client_timeout_s=30.0, client_device="cpu")
    cfg = RunConfig(num_clients=2, nsync=4, num_epochs=3.0, eval_every=1.0, progress=False,
                    algo=AlgoConfig(lr=0.2, momentum=0.0), backend=backend)
    summary = launch.run_real(cfg, tmp_path)
    assert summary["status"] == "diverged" and summary["version"] == 0, summary["message"]
    assert multiprocessing.active_children() == []


# ---------------------------------------------------------------------------------------------
# one push may not exceed the budget
# ---------------------------------------------------------------------------------------------

def test_a_segment_larger_than_the_budget_is_refused_naming_nsync(tmp_path):
    """512 samples x 1 epoch / batch 32 = 16 minibatches: nsync 17 is refused before any file
    of the run is written; 16 (one push spends the budget) runs."""
    with pytest.raises(ConfigError, match="'nsync': 17.*at most 16"):
        validate(cfg_for(nsync=17, num_epochs=1.0, data=DataConfig(name="synthetic", num_train=512)))
    with pytest.raises(ConfigError, match="'nsync': 17.*at most 16"):
        simulate(cfg_for(nsync=17, num_epochs=1.0), tmp_path / "refused")   # size known once loaded
    assert not (tmp_path / "refused" / "config.json").exists()
    assert simulate(cfg_for(nsync=16, num_epochs=1.0), tmp_path / "ok")["status"] == "completed"


@pytest.mark.parametrize("protocol, key", [("sync", "num_clients"), ("sync_backup", "num_clients"),
                                           ("rennala", "protocol.collection_size"), ("rennala_n", "num_clients")])
def test_a_round_or_collection_larger_than_the_budget_is_refused(tmp_path, protocol, key):
    """16 minibatches (512 samples x 1 epoch / batch 32): a sync round of 5 clients (6 with one
    backup worker) or a rennala collection of 5 x nsync 4 merges 20 into one apply (a collection
    of 400 at num_epochs=1 trained 35 epochs), refused naming the key before any file of the run
    is written; 4 x 4 (the budget spent in one apply) runs."""
    from repro.config.settings import ProtocolConfig

    def cfg(size):
        p = {"sync": dict(name="sync"), "sync_backup": dict(name="sync", backup_workers=1),
             "rennala": dict(name="rennala", collection_size=size), "rennala_n": dict(name="rennala")}[protocol]
        n = size + p.get("backup_workers", 0) if key == "num_clients" else 2
        return cfg_for(nsync=4, num_epochs=1.0, num_clients=n, protocol=ProtocolConfig(**p))
    with pytest.raises(ConfigError, match=f"'{key}': [56].*at most [45] with protocol"):
        validate(cfg(5).replace(data=DataConfig(name="synthetic", num_train=512)))
    with pytest.raises(ConfigError, match=f"'{key}': [56].*at most [45] with protocol"):
        simulate(cfg(5), tmp_path / "refused")   # size known once loaded
    assert not (tmp_path / "refused" / "config.json").exists()
    done = simulate(cfg(4), tmp_path / "ok")
    assert done["status"] == "completed" and done["epoch"] == 1.0


@pytest.mark.timeout(180)
def test_the_command_line_refuses_a_push_of_many_budgets(tmp_path, monkeypatch, capsys):
    """The issue's reproduction, nsync=1000000 num_epochs=1 (one push ~60,000 times the budget),
    exits 2 naming nsync instead of computing for hours (synthetic data: a cheaper import than
    digits, the same check on the loaded training-set size)."""
    # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run)
    proc = cli_run(monkeypatch, capsys, "nsync=1000000", "num_epochs=1", "data=synthetic", "model=mlp",
                   f"results_dir={tmp_path}", "progress=false")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "'nsync': 1000000" in proc.stderr and "at most 16" in proc.stderr, proc.stderr[-2000:]
    assert not list(tmp_path.rglob("updates.csv"))


# ---------------------------------------------------------------------------------------------
# a stop request between two local steps
# ---------------------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_sigterm_stops_the_simulator_inside_a_long_push_and_resume_is_bitwise(tmp_path, monkeypatch):
    """Two pushes of 800 local steps each spend the budget. A SIGTERM at step 100 ends the run
    interrupted after that step (it used to compute on to the end of the push); the abandoned
    push is computed again by the resumed run, whose tables equal an uninterrupted run's
    (timings.csv's too: the push's parts are kept with it, where the resumed run wrote nan)."""
    cfg = cfg_for(nsync=800, num_epochs=100.0, eval_every=50.0)
    assert simulate(cfg, tmp_path / "whole")["status"] == "completed"
    calls, backward = [0], FlatNet.backward

    def sigterm_at_step_100(self, x, y):
        calls[0] += 1
        if calls[0] == 100:
            os.kill(os.getpid(), signal.SIGTERM)
        return backward(self, x, y)

    monkeypatch.setattr(FlatNet, "backward", sigterm_at_step_100)
    cut = simulate(cfg, tmp_path / "cut")
    monkeypatch.setattr(FlatNet, "backward", backward)
    assert cut["status"] == "interrupted" and calls[0] == 100 and cut["version"] == 0
    assert simulate(cfg.replace(resume=True), tmp_path / "cut")["status"] == "completed"
    for table in ("updates.csv", "evals.csv", "timings.csv"):
        assert (tmp_path / "cut" / table).read_bytes() == (tmp_path / "whole" / table).read_bytes()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("protocol", ["async", "sync"])
def test_a_real_client_reads_stop_between_two_local_steps(protocol):
    """A client computing a push of 10**6 steps reads the server's STOP after the step in which
    it arrived and exits 0 without pushing, whatever its protocol (it used to look only for
    preemptions, and only under sync with backup workers)."""
    from repro.config.settings import ProtocolConfig

    cfg = cfg_for(nsync=10**6, protocol=ProtocolConfig(name=protocol))
    setup = build_client(cfg, 1, torch.device("cpu"))
    numel = setup.inbox.capacity
    channel = ScriptedChannel([hello(setup.inbox, cfg), Header(Kind.PARAMS, 1, 0, numel),
                               Header(Kind.STOP, 1, 0, 0)], arrive_after=5)
    assert run_client(cfg, 1, channel, setup) == 0
    assert channel.polls == 5 and channel.sent == [Kind.HELLO]   # 5 steps, no push


def test_a_real_client_waiting_for_a_held_reply_reads_the_servers_heartbeat_and_waits_on():
    """The server heartbeats a client whose reply it holds (a sync round outlasting
    backend.timeout_s): the client waits on for its parameters; it took the HEARTBEAT for a
    protocol error and left the run (exit 1). The slow twin in test_real.py runs it for real."""
    cfg = cfg_for(nsync=2)
    setup = build_client(cfg, 1, torch.device("cpu"))
    numel = setup.inbox.capacity
    channel = ScriptedChannel([hello(setup.inbox, cfg), Header(Kind.PARAMS, 1, 0, numel),
                               Header(Kind.HEARTBEAT, 1, 1, 0), Header(Kind.PARAMS, 1, 1, numel),
                               Header(Kind.STOP, 1, 1, 0)], arrive_after=10**9)
    assert run_client(cfg, 1, channel, setup) == 0
    assert channel.sent == [Kind.HELLO, Kind.PUSH, Kind.PUSH]


class _Channel:
    def __init__(self):
        self.sent = []

    def send(self, header, frame):
        self.sent.append(header.kind)

    def post(self, frame):
        pass


def test_a_real_client_awaiting_the_servers_hello_reads_its_heartbeats_and_waits_on():
    """The server heartbeats its clients while it evaluates version 0, before its HELLO: the
    client waits on for the HELLO; it took the HEARTBEAT for a protocol error and left (exit 1)."""
    cfg = cfg_for(nsync=2)
    setup = build_client(cfg, 1, torch.device("cpu"))
    channel = ScriptedChannel([Header(Kind.HEARTBEAT, 1, 0, 0), Header(Kind.HEARTBEAT, 1, 0, 0),
                               hello(setup.inbox, cfg), Header(Kind.STOP, 1, 0, 0)], arrive_after=10**9)
    assert run_client(cfg, 1, channel, setup) == 0
    assert channel.sent == [Kind.HELLO]


class _Greeted(_Channel):
    """A client's channel that answers the server's HELLO with its own."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg

    def recv(self, frame):
        return hello(frame, self.cfg)


@pytest.mark.timeout(60)
def test_the_real_server_heartbeats_its_clients_while_it_evaluates_version_0_before_its_hello(
        tmp_path, monkeypatch):
    """Version 0's evaluation outlasts backend.timeout_s (0.4 s) evaluating a batch every 0.2 s:
    the server waits for it (Evaluations.join), but each client waits for the server's HELLO at
    most backend.timeout_s, so every client left and the run failed 'every client lost'. Now
    the server heartbeats every client while it waits (its slow twin: ..._keeps_the_real_clients)."""
    from repro.real.transport import Receiver

    evaluating_slowly(monkeypatch, 4, 0.2)
    monkeypatch.setattr(Receiver, "start", lambda receiver: None)   # no client pushes
    cfg = cfg_for(backend=BackendConfig(name="real", timeout_s=0.4))
    with run_folder(cfg, tmp_path) as run:
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real", eval_in_thread=True)
        channels = {1: _Greeted(cfg), 2: _Greeted(cfg)}
        Dispatcher(cfg, core, channels, StopRequest()).start()
        core.stop()
        core.finish(*core.final_status(interrupted=False))
    for sent in channels.values():
        assert sent.sent[-2:] == [Kind.HELLO, Kind.PARAMS] and len(sent.sent) > 2, sent.sent
        assert set(sent.sent[:-2]) == {Kind.HEARTBEAT}, sent.sent


@pytest.mark.timeout(60)
def test_a_joiner_waits_while_the_real_server_evaluates_version_0_and_joins_after(tmp_path, monkeypatch):
    """A joiner arrives while the server evaluates version 0 (1 s, a batch every 0.2 s) longer
    than backend.timeout_s (0.4 s): the server admits nobody meanwhile (it holds its lock), and
    the joiner, waiting at most backend.timeout_s for its answer, ended 'did not answer' (exit 1)
    although the run had logged 'accepting joins'. Now it waits while the server beats the store
    as it heartbeats its clients, and is admitted once the evaluation is done (in-process: a
    store, the acceptor, the joiner's handshake in a thread)."""
    import dataclasses
    import time

    from repro.real.elastic import Acceptor, ask
    from repro.real.processes import make_store
    from repro.real.transport import Receiver

    evaluating_slowly(monkeypatch, 5, 0.2)
    monkeypatch.setattr(Receiver, "start", lambda receiver: None)   # no client pushes
    admitted: list[int] = []

    def add_client(loop, k, store, prefix):   # as the real one, it returns once the joiner read its answer
        admitted.append(k)
        thread.join(timeout=30)

    monkeypatch.setattr(Dispatcher, "add_client", add_client)
    cfg = cfg_for(backend=BackendConfig(name="real", timeout_s=0.4, master_port=0, max_clients=3))
    store = make_store(cfg)
    joiner = cfg.replace(backend=dataclasses.replace(cfg.backend, join=f"127.0.0.1:{store.port}"))
    answered: dict = {}

    def join_while_evaluating(loop):
        while not loop.lock.locked():   # the greeting holds it while version 0 is evaluated
            time.sleep(0.01)
        try:
            answered["client"] = ask(joiner)[2]
        except Exception as exc:
            answered["error"] = exc

    with run_folder(cfg, tmp_path) as run:
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real", eval_in_thread=True)
        loop = Dispatcher(cfg, core, {1: _Greeted(cfg), 2: _Greeted(cfg)}, StopRequest())
        loop.acceptor = Acceptor(loop, store)
        loop.acceptor.start()
        thread = threading.Thread(target=join_while_evaluating, args=(loop,), daemon=True)
        thread.start()
        loop.greet()
        thread.join(timeout=30)
        loop.acceptor.done.set()
        core.stop()
        core.finish(*core.final_status(interrupted=False))
    assert answered == {"client": 3} and admitted == [3], answered
    assert int(store.add("repro/busy", 0)) > 0   # the evaluation outlasted backend.timeout_s: beaten


@pytest.mark.timeout(60)
def test_a_joiner_waits_while_the_real_server_evaluates_in_its_loop_mid_run_and_joins_after(tmp_path, monkeypatch):
    """backend.eval_in_thread=false: the evaluation a push makes due holds the server's lock up to
    backend.timeout_s (0.8 s; it takes 1.5 s, a batch every 0.3 s) without the busy count version
    0's makes. A joiner whose request the acceptor read only once that evaluation held the lock
    waited backend.timeout_s from its ticket and ended 'did not answer' (exit 1) just before the
    lock was free. Now the server counts the busy key while it waits (the one place version 0's
    wait counts it), and the joiner is admitted after (in-process, as version 0's twin above)."""
    import dataclasses
    import time

    from repro.real.elastic import Acceptor, ask, ticket_key
    from repro.real.processes import make_store

    admitted: list[int] = []

    def add_client(loop, k, store, prefix):   # as the real one, it returns once the joiner read its answer
        admitted.append(k)
        joining.join(timeout=30)

    monkeypatch.setattr(Dispatcher, "add_client", add_client)
    cfg = cfg_for(num_epochs=1.0, nsync=8, backend=BackendConfig(name="real", timeout_s=0.8, master_port=0,
                                                                 max_clients=3, eval_in_thread=False))
    store = make_store(cfg)
    joiner = cfg.replace(backend=dataclasses.replace(cfg.backend, join=f"127.0.0.1:{store.port}"))
    answered: dict = {}

    def join() -> None:
        try:
            answered["client"] = ask(joiner)[2]
        except Exception as exc:
            answered["error"] = exc

    def admit_once_evaluating(loop) -> None:   # the acceptor reads the request while the lock is held
        while core.evals.running is None:
            time.sleep(0.01)
        loop.acceptor.start()

    with run_folder(cfg, tmp_path) as run:
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real", eval_in_thread=True)
        loop = Dispatcher(cfg, core, {1: _Channel(), 2: _Channel()}, StopRequest())
        core.begin([1, 2])
        evaluating_slowly(monkeypatch, 5, 0.3)   # version 0's is not: the one at version 1 is
        loop.acceptor = Acceptor(loop, store)
        joining = threading.Thread(target=join, daemon=True)
        joining.start()
        while not store.check([ticket_key(1, "request")]):   # its answer's wait has begun
            time.sleep(0.01)
        time.sleep(0.2)   # the push comes a little after the ticket, as it may in any run
        threading.Thread(target=admit_once_evaluating, args=(loop,), daemon=True).start()
        loop.sent_version = {1: 0, 2: 0}
        numel = core.server.params.numel()
        header = Header(Kind.PUSH, 1, 0, numel, dict(num_steps=8, num_samples=problem.dataset.num_train // 2,
                                                     train_loss=1.0, train_error=0.5, stream_position=(0, 0)))
        assert loop.on_message(1, header, torch.zeros(numel)) is True   # version 1, its evaluation due
        joining.join(timeout=30)
        loop.acceptor.done.set()
        core.stop()
        core.finish(*core.final_status(interrupted=False))
    assert answered == {"client": 3} and admitted == [3], answered


@pytest.mark.timeout(60)
def test_the_real_server_stops_computing_clients_when_the_run_ends(tmp_path):
    """Client 1's push spends the budget while client 2 computes: client 2 is sent STOP at
    once (it reads it between two local steps), not after its own push."""
    cfg = cfg_for(num_epochs=1.0, nsync=8, backend=BackendConfig(name="real"))
    with run_folder(cfg, tmp_path) as run:
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real")
        channels = {1: _Channel(), 2: _Channel()}
        loop = Dispatcher(cfg, core, channels, StopRequest())
        core.begin([1, 2])
        loop.sent_version = {1: 0, 2: 0}
        numel = core.server.params.numel()
        budget = int(cfg.num_epochs * problem.dataset.num_train)
        header = Header(Kind.PUSH, 1, 0, numel, dict(num_steps=8, num_samples=budget, train_loss=1.0,
                                                     train_error=0.5, stream_position=(0, 0)))
        assert loop.on_message(1, header, torch.zeros(numel)) is False   # told STOP
        assert channels[1].sent == [Kind.STOP] and channels[2].sent == [Kind.STOP]
        assert loop.stopped == {1, 2} and not loop.live()
        core.finish(*core.final_status(interrupted=False))


class _Waited(_Greeted):
    """A client's channel with the sends' and receives' waits the server's main thread reads;
    ``stalls_s``: a STOP sent to it waits that long (a client suspended before it posted its
    receive: the send waits for it, up to backend.client_timeout_s)."""

    def __init__(self, cfg, stalls_s: float = 0.0):
        super().__init__(cfg)
        self.stalls_s, self.sent_at, self.timeout_s = stalls_s, None, cfg.backend.client_timeout_s

    def send(self, header, frame):
        super().send(header, frame)
        if header.kind == Kind.STOP and self.stalls_s:
            import time

            self.sending, self.sent_at = header.kind, time.monotonic()
            time.sleep(self.stalls_s)
            self.sent_at = None

    def sending_s(self):
        import time

        return 0.0 if self.sent_at is None else time.monotonic() - self.sent_at

    def receiving_s(self):
        return 0.0


@pytest.mark.timeout(60)
def test_the_real_server_says_once_which_client_a_send_at_the_end_waits_for(tmp_path, monkeypatch, caplog):
    """Client 1's push spends the budget, and its receiver sends STOP to client 2, suspended
    (SIGSTOP) before it posted its receive: the send waits for it, the lock held, up to
    backend.client_timeout_s (here 3 s), and the run's end with it, in silence (the line that
    it 'left before it could be told to stop' comes after). Now the server's main thread says
    at once, once, which client it waits for, for what, and for how long at most."""
    import time

    from repro.real.transport import Receiver

    monkeypatch.setattr(Receiver, "start", lambda receiver: None)   # the test pushes itself
    cfg = cfg_for(num_epochs=1.0, nsync=8, backend=BackendConfig(name="real", client_timeout_s=30.0))
    channels = {1: _Waited(cfg), 2: _Waited(cfg, stalls_s=3.0)}

    def push_the_budget(loop) -> None:   # as client 1's receiver does, once the clients are greeted
        while len(loop.sent_version) < 2:
            time.sleep(0.01)
        numel = core.server.params.numel()
        header = Header(Kind.PUSH, 1, 0, numel, dict(num_steps=8, num_samples=problem.dataset.num_train,
                                                     train_loss=1.0, train_error=0.5, stream_position=(0, 0)))
        loop.on_message(1, header, torch.zeros(numel))

    with run_folder(cfg, tmp_path) as run, caplog.at_level("INFO", logger="repro"):
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real", eval_in_thread=True)
        loop = Dispatcher(cfg, core, channels, StopRequest())
        pusher = threading.Thread(target=push_the_budget, args=(loop,), daemon=True)
        pusher.start()
        status, _ = loop.run()
        pusher.join(timeout=30)
        core.finish(status)
    assert status == "completed" and channels[2].sent[-1] == Kind.STOP
    said = [r.getMessage() for r in caplog.records if "waiting for client" in r.getMessage()]
    assert said == ["[real server] waiting for client 2 to take the STOP sent to it (nothing taken for 2 s: "
                    "suspended or hung?); the run waits up to backend.client_timeout_s=30 s, then counts it lost"], said


@pytest.mark.timeout(60)
def test_a_hung_evaluation_ends_the_real_run_failed_after_backend_timeout(tmp_path, monkeypatch, caplog):
    """The real server's finish waited without limit for the evaluation in its thread: one that
    hung left the run folder ``running`` for good. Now it waits ``backend.timeout_s`` and the run
    ends ``failed``, saying which evaluation, with one logged line; evals.csv keeps whole rows."""
    import threading

    from repro.files import schema
    from repro.runs import evaluations

    release = threading.Event()   # the hung evaluation, let go when the test ends
    cfg = cfg_for(num_epochs=1.0, nsync=8, backend=BackendConfig(name="real", timeout_s=0.2))
    try:
        with run_folder(cfg, tmp_path) as run, caplog.at_level("INFO", logger="repro"):
            problem = build_problem(cfg, torch.device("cpu"))
            run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real", eval_in_thread=True)
            loop = Dispatcher(cfg, core, {1: _Channel(), 2: _Channel()}, StopRequest())
            core.begin([1, 2])   # version 0 evaluated inline, as every run's is
            evaluate = evaluations.evaluate   # the same numbers, after the hang (the old finish waited)
            monkeypatch.setattr(evaluations, "evaluate", lambda *a: release.wait(10) or evaluate(*a))
            loop.sent_version = {1: 0, 2: 0}
            numel = core.server.params.numel()
            header = Header(Kind.PUSH, 1, 0, numel, dict(num_steps=8, num_samples=int(problem.dataset.num_train),
                                                         train_loss=1.0, train_error=0.5, stream_position=(0, 0)))
            assert loop.on_message(1, header, torch.zeros(numel)) is False   # the budget: version 1, evaluated
            summary = core.finish(*core.final_status(interrupted=False))
    finally:
        release.set()
    hung = "the evaluation at version 1 evaluated no batch in 0.2 s (backend.timeout_s)"
    assert summary["status"] == "failed" and summary["message"].startswith(hung), summary["message"]
    assert [r.getMessage() for r in caplog.records].count(hung) == 1
    on_disk = json.loads((tmp_path / schema.SUMMARY_FILE).read_text())
    assert (on_disk["status"], on_disk["message"]) == ("failed", summary["message"])
    evals = pd.read_csv(tmp_path / schema.EVALS_FILE)
    assert list(evals.version) == [0] and not evals.isna().any().any()
    assert schema.check_table(tmp_path / schema.EVALS_FILE, schema.EVAL_COLUMNS, 0, False)[1] == 0   # a resume's read


@pytest.mark.timeout(60)
def test_a_slow_evaluation_still_running_as_training_ends_is_waited_for_and_the_run_completes(tmp_path, monkeypatch):
    """The evaluation of the last version takes 2 s, longer than backend.timeout_s (1 s), but
    evaluates a batch every 0.25 s. The run's end waited backend.timeout_s in all, then failed a
    run whose training had finished, its last point lost. A user expects the run completed with
    that point: the end now waits while the evaluation makes progress (a batch every
    backend.timeout_s); only one that evaluates nothing for that long is hung."""
    from repro.files import schema

    cfg = cfg_for(num_epochs=1.0, nsync=8, backend=BackendConfig(name="real", timeout_s=1.0))
    with run_folder(cfg, tmp_path) as run:
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real", eval_in_thread=True)
        loop = Dispatcher(cfg, core, {1: _Channel(), 2: _Channel()}, StopRequest())
        core.begin([1, 2])
        evaluating_slowly(monkeypatch, 8, 0.25)   # version 0's is not: the last one is
        loop.sent_version = {1: 0, 2: 0}
        numel = core.server.params.numel()
        header = Header(Kind.PUSH, 1, 0, numel, dict(num_steps=8, num_samples=int(problem.dataset.num_train),
                                                     train_loss=1.0, train_error=0.5, stream_position=(0, 0)))
        assert loop.on_message(1, header, torch.zeros(numel)) is False   # the budget: version 1, in its thread
        summary = core.finish(*core.final_status(interrupted=False))
    assert summary["status"] == "completed", summary["message"]
    assert list(pd.read_csv(tmp_path / schema.EVALS_FILE).version) == [0, 1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", [0, 1], ids=["version 0's", "the final one"])
def test_an_evaluation_the_run_waits_for_is_waited_for_at_most_backend_timeout(tmp_path, monkeypatch, caplog,
                                                                                version):
    """Version 0's evaluation (begin) and the final one (finish) ran in the server's own thread
    without a bound: a hung one held the run, its folder 'running', for good (here until the test
    lets it go, after 5 s). Now each runs in its thread, waited for at most backend.timeout_s: the
    run ends failed with one line naming the version; the checkpoint keeps that evaluation."""
    from repro.asgd.algorithm import Push
    from repro.files import schema
    from repro.runs import evaluations

    release, evaluate = threading.Event(), evaluations.evaluate   # the hung evaluation, let go when the test ends
    cfg = cfg_for(num_epochs=1.0, nsync=8, backend=BackendConfig(name="real", timeout_s=0.2))
    try:
        with run_folder(cfg, tmp_path) as run, caplog.at_level("INFO", logger="repro"):
            problem = build_problem(cfg, torch.device("cpu"))
            run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real", eval_in_thread=True)
            hang = lambda: monkeypatch.setattr(evaluations, "evaluate", lambda *a: release.wait(5) or evaluate(*a))
            if version == 0:
                hang()
            assert core.begin([1, 2], driver_state=lambda: {"clients": {}}).stopping == (version == 0)
            if version == 1:   # the budget in one push, not evaluated before the end
                core.on_push(Push(client=1, read_version=0, update=torch.zeros_like(core.server.params),
                                  num_steps=8, num_samples=problem.dataset.num_train, train_loss=1.0,
                                  train_error=0.5, stream_position=(0, 0)), 0.1)
                hang()
            summary = core.finish(*core.final_status(interrupted=False))
    finally:
        release.set()
    hung = f"the evaluation at version {version} evaluated no batch in 0.2 s (backend.timeout_s)"
    assert summary["status"] == "failed" and summary["message"].startswith(hung), summary["message"]
    assert summary["message"].count(hung) == 1
    assert [hung in r.getMessage() for r in caplog.records].count(True) == 1
    assert json.loads((tmp_path / schema.SUMMARY_FILE).read_text())["status"] == "failed"
    assert list(pd.read_csv(tmp_path / schema.EVALS_FILE).version) == [0] * version
    assert torch.load(tmp_path / schema.CHECKPOINT_FILE, weights_only=True)["core"]["evaluating"]["version"] == version


@pytest.mark.timeout(60)
def test_an_evaluation_the_server_waits_for_is_waited_for_at_most_backend_timeout(tmp_path, monkeypatch):
    """backend.eval_in_thread=false evaluated in the server loop itself, without a bound: a hung
    evaluation held the loop, and the run folder 'running', for good. Now it runs in its thread
    and the loop waits for it at most backend.timeout_s: a quick one's row is written before the
    loop goes on; a hung one is left running, and the run's end fails the run naming it."""
    from repro.runs import evaluations

    release = threading.Event()   # the hung evaluation, let go when the test ends
    cfg = cfg_for(num_epochs=1.0, nsync=8, backend=BackendConfig(name="real", timeout_s=0.2, eval_in_thread=False))
    try:
        with run_folder(cfg, tmp_path) as run:
            problem = build_problem(cfg, torch.device("cpu"))
            run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real", eval_in_thread=True)
            core.begin([1, 2])   # version 0 evaluated inline, as every run's is
            core.evals.submit(1, 0.1, core.server.params)
            core.drain()
            assert core.runlog.last_eval_version == 1   # waited for: its row is there
            evaluate = evaluations.evaluate
            monkeypatch.setattr(evaluations, "evaluate", lambda *a: release.wait(30) or evaluate(*a))
            core.evals.submit(2, 0.2, core.server.params)   # returns (the test's timeout: it did not)
            core.drain()
            assert core.runlog.last_eval_version == 1 and not core.evals.due()
            summary = core.finish("completed")
    finally:
        release.set()
    hung = "the evaluation at version 2 evaluated no batch in 0.2 s (backend.timeout_s)"
    assert summary["status"] == "failed" and summary["message"].startswith(hung), summary["message"]


@pytest.mark.timeout(20)
def test_a_first_ctrl_c_ends_the_wait_for_a_hung_evaluation_and_the_run_interrupted(tmp_path, monkeypatch):
    """A first Ctrl-C while the run's end waited for an evaluation in its thread did nothing
    until backend.timeout_s was over (here 60 s: the test's timeout), then the run ended
    ``failed``; only a second one forced the stop. Now the first ends the wait and the run:
    ``interrupted``, the checkpoint written, the message with its resume hint."""
    from repro.files import schema
    from repro.runs import evaluations

    release = threading.Event()   # the hung evaluation, let go when the test ends
    cfg = cfg_for(num_epochs=1.0, nsync=8, backend=BackendConfig(name="real", timeout_s=60.0))
    try:
        with run_folder(cfg, tmp_path) as run:
            problem = build_problem(cfg, torch.device("cpu"))
            run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real", eval_in_thread=True)
            core.begin([1, 2])
            evaluate = evaluations.evaluate
            monkeypatch.setattr(evaluations, "evaluate", lambda *a: release.wait(60) or evaluate(*a))
            core.evals.submit(1, 0.1, core.server.params)
            ctrl_c = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))   # once the end waits
            ctrl_c.start()
            summary = core.finish("completed")
            ctrl_c.join()
    finally:
        release.set()
    assert summary["status"] == "interrupted", summary["message"]
    assert summary["message"].startswith("the evaluation at version 1 was not waited for: a stop was asked; ")
    assert summary["message"].endswith("resume=true continues from version 0"), summary["message"]
    assert (tmp_path / schema.CHECKPOINT_FILE).exists()


@pytest.mark.slow   # a real run, two waits of backend.timeout_s
@pytest.mark.timeout(150)
def test_a_hung_evaluation_the_real_server_waits_for_ends_the_run_failed(tmp_path, monkeypatch):
    """The same through run_real (backend.eval_in_thread=false): the loop waited for the hung
    evaluation for good, its clients lost meanwhile. Now the run ends failed, naming it."""
    from repro.real import run_real
    from repro.runs import evaluations
    from tests.helpers.runs import real_cfg

    release, evaluate, calls = threading.Event(), evaluations.evaluate, []

    def hung_after_version_0(*args):
        calls.append(args)
        if len(calls) > 1:
            release.wait(30)
        return evaluate(*args)

    monkeypatch.setattr(evaluations, "evaluate", hung_after_version_0)
    backend = BackendConfig(name="real", client_device="cpu", timeout_s=5.0, client_timeout_s=10.0,
                            eval_in_thread=False)
    try:
        summary = run_real(real_cfg(backend=backend), tmp_path / "run")
    finally:
        release.set()
    assert summary["status"] == "failed", summary["message"]
    assert summary["message"].startswith("the evaluation at version "), summary["message"]
    assert "evaluated no batch in 5 s (backend.timeout_s)" in summary["message"]
    assert multiprocessing.active_children() == []


# an evaluation that never ends, in and out of torch's C++ (a hung one that sleeps in Python, or
# blocks in one C++ wait, does not show it): the command line, its thread still running as it exits
_ENDLESS_EVALUATION = """
import sys, torch
from repro.runs import evaluations
evaluate = evaluations.evaluate
def endless(net, params, sets):
    if endless.calls:   # version 0's, inline, as every run's: the reference
        a = torch.ones(200, 200) / 200
        while True:
            a = torch.tanh(a @ a)
    endless.calls += 1
    return evaluate(net, params, sets)
endless.calls = 0
evaluations.evaluate = endless
from repro.run import cli
sys.argv[0] = "repro.run"
cli()
"""


@pytest.mark.slow   # seconds of subprocesses
@pytest.mark.timeout(180)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the real driver's fork server: Linux")
def test_a_hung_evaluation_ends_the_command_line_with_the_runs_status_not_an_abort(tmp_path):
    """The run ended ``failed`` past backend.timeout_s with its summary written, then the process
    aborted as it exited (exit 134, "terminate called without an active exception"): the
    interpreter's shutdown ended the evaluation's thread inside torch. Now it exits 1, the
    failed run's code, its run.log complete."""
    proc = subprocess.run([sys.executable, "-c", _ENDLESS_EVALUATION, "backend=real", "data=synthetic",
                           "model=mlp", "num_clients=2", "num_epochs=1", "eval_every=0.5",
                           "backend.timeout_s=0.5", "progress=false", f"results_dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 1 and "terminate called" not in proc.stderr, proc.stderr[-2000:]
    (summary,) = tmp_path.rglob("summary.json")
    hung = "the evaluation at version 2 evaluated no batch in 0.5 s (backend.timeout_s)"
    assert json.loads(summary.read_text())["status"] == "failed"
    assert "failed: version 4" in (summary.parent / "run.log").read_text().splitlines()[-1]
    assert hung in proc.stderr


# the same evaluation, under a script that calls the driver itself (the command line's own exit
# path is not there) and exits with a code of its own
_ENDLESS_EVALUATION_API = _ENDLESS_EVALUATION.replace('from repro.run import cli\nsys.argv[0] = "repro.run"\ncli()', """
from repro.api import configure
from repro.real import run_real
summary = run_real(configure(*sys.argv[2:]), sys.argv[1])
print("run " + summary["status"], flush=True)
sys.exit(3)""")


@pytest.mark.slow   # seconds of subprocesses
@pytest.mark.timeout(180)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the real driver's fork server: Linux")
def test_a_hung_evaluation_ends_a_script_that_calls_the_driver_with_its_own_code_not_an_abort(tmp_path):
    """The command line's exit path left the thread of a hung evaluation safely; a script that
    called run_real itself still aborted at exit (134, "terminate called without an active
    exception") instead of its own code."""
    proc = subprocess.run([sys.executable, "-c", _ENDLESS_EVALUATION_API, str(tmp_path / "run"), "backend=real",
                           "data=synthetic", "model=mlp", "num_clients=2", "num_epochs=1", "eval_every=0.5",
                           "backend.timeout_s=3"], cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 3 and "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert "run failed" in proc.stdout
    assert "the evaluation at version 2 evaluated no batch in 3 s" in proc.stderr


def test_an_abandoned_thread_is_ended_before_the_interpreter_finalises(monkeypatch):
    """What the process's exit runs (:func:`repro.runtime.abandon`'s exit call): a thread left
    computing, in and out of torch's C++, ends while the interpreter is whole."""
    from repro import runtime

    monkeypatch.setattr(runtime, "abandoned", [])
    registered = []
    monkeypatch.setattr(runtime.atexit, "register", registered.append)

    computing, ended = threading.Event(), []

    def endless():
        try:
            a = torch.ones(50, 50) / 50
            while True:
                a = torch.tanh(a @ a)
                computing.set()
        except SystemExit:   # (the default threading.excepthook ignores it; pytest's would warn)
            ended.append("SystemExit")

    thread = threading.Thread(target=endless, daemon=True)
    thread.start()
    assert computing.wait(10)
    runtime.abandon(thread)
    assert registered == [runtime._end_abandoned] and runtime.abandoned == [thread]
    runtime.abandon(threading.Thread())   # one exit call, whatever the number of threads
    assert len(registered) == 1
    registered[0]()
    assert not thread.is_alive() and ended == ["SystemExit"]


@pytest.mark.timeout(120)
def test_a_client_sees_the_servers_message_arrive_between_two_steps(tmp_path):
    """On real gloo: a STOP sent to a client while it computes is seen between two of its steps.
    (A gloo receive reports completion only through wait(): polling work.is_completed() never
    saw it, so a preempted client pushed its dropped segment and STOP waited for the push.)"""
    import datetime
    import time

    import torch.distributed as dist

    from repro.real.frames import Frame
    from repro.real.processes import client_context
    from repro.real.transport import Channel
    from repro.real.groups import connect, disconnect

    store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    # the client: a fork of the clients' fork server (torch loaded), as a real client is
    proc = client_context().Process(target=watching_client, args=(store.port, True))
    proc.start()
    try:
        groups = connect(0, 2, 60.0, store)
        time.sleep(0.5)
        Channel(groups[1], 1, 30.0).send(Header(Kind.STOP, 1, 0, 0), Frame(16))
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        disconnect()


@pytest.mark.timeout(60)
def test_a_version_a_loss_applies_on_the_real_server_is_evaluated_and_checkpointed(tmp_path, monkeypatch):
    """Sync, 2 clients: client 1 pushes into round 0, then client 2 is lost, which closes the
    round (version 1). With an evaluation and a checkpoint due at every version, version 1 gets
    both at once, as a version a push applies does (the simulator: test_churn); the real server
    carried the loss's replies but never asked the core's cadence, which waited for a next push."""
    from repro.config.settings import ProtocolConfig
    from repro.files import schema

    saved, save = [], RunCore.save_checkpoint
    monkeypatch.setattr(RunCore, "save_checkpoint", lambda core: (saved.append(core.server.version), save(core)))
    cfg = cfg_for(num_epochs=1.0, nsync=1, eval_every=0.001, checkpoint_every=1,
                  protocol=ProtocolConfig(name="sync"), backend=BackendConfig(name="real"))
    with run_folder(cfg, tmp_path) as run:
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real")
        loop = Dispatcher(cfg, core, {1: _Channel(), 2: _Channel()}, StopRequest())
        core.begin([1, 2])
        loop.sent_version = {1: 0, 2: 0}
        numel = core.server.params.numel()
        header = Header(Kind.PUSH, 1, 0, numel, dict(num_steps=1, num_samples=cfg.algo.batch_size,
                                                     train_loss=1.0, train_error=0.5, stream_position=(0, 0)))
        loop.on_message(1, header, torch.zeros(numel))
        assert core.server.version == 0   # held: the round waits for client 2
        with loop.lock:
            loop.lose(2, "gone")
        assert core.server.version == 1 and saved == [1]
        assert list(pd.read_csv(tmp_path / schema.EVALS_FILE).version) == [0, 1]
        core.finish(*core.final_status(interrupted=False))


@pytest.mark.slow   # a real run whose version 0 takes 8 s to evaluate
@pytest.mark.timeout(150)
def test_a_slow_version_0_evaluation_keeps_the_real_clients(tmp_path, monkeypatch):
    """Version 0's evaluation takes 8 s, longer than backend.timeout_s (5 s), but evaluates a
    batch every second: the server waits for it (Evaluations.join), and its clients, waiting
    for its HELLO at most backend.timeout_s, gave up: every client lost, the run failed. Now the
    server heartbeats them while it evaluates, and the run completes."""
    import time

    from repro.real import run_real
    from repro.runs import evaluations
    from tests.helpers.runs import real_cfg

    evaluate, calls = evaluations.evaluate, []

    def slow_version_0(net, params, sets):
        calls.append(1)
        for _ in range(8 if len(calls) == 1 else 0):
            net.module(sets.x_test[:1])   # a batch: progress
            time.sleep(1.0)
        return evaluate(net, params, sets)

    monkeypatch.setattr(evaluations, "evaluate", slow_version_0)
    backend = BackendConfig(name="real", client_device="cpu", timeout_s=5.0, client_timeout_s=10.0)
    summary = run_real(real_cfg(backend=backend, num_epochs=1.0), tmp_path / "run")
    assert summary["status"] == "completed", summary["message"]
    assert list(pd.read_csv(tmp_path / "run" / "evals.csv").version)[0] == 0
    assert multiprocessing.active_children() == []
