"""One seam between the drivers and the run core (issue 31, item 2).

A driver hands the core what it needs when it begins, hands it pushes, carries the replies of
each :class:`~repro.runs.core.Outcome` and learns from the Outcomes alone whether the run is
stopping: it never writes into the core's state or objects, nor probes the schedule for what it
can do. A push and
its wire header share one field list, so a new push field is declared where it is produced
and read where it is used, and nothing in between changes.
"""
import re
from dataclasses import dataclass

import pytest
import torch

from repro.asgd.algorithm import Push, push_fields, push_type_name
from repro.asgd.protocols import _push_from_state, _push_state
from repro.config.settings import DataConfig, ModelConfig, ProtocolConfig, RunConfig
from repro.errors import ConfigError
from repro.workload.start import build_problem
from repro.real.frames import Frame, Header, Kind
from repro.runs.core import Outcome, RunCore
from repro.runs.folder import run_folder
from repro.sim.cost import Schedule

from tests.helpers.paths import ROOT

DRIVERS = sorted((ROOT / "repro" / "sim").glob("*.py")) + sorted((ROOT / "repro" / "real").glob("*.py"))
REACHES = {
    "the core's run log or state": re.compile(r"\bcore\.(runlog|state)\b"),
    "a probe of the schedule": re.compile(r"\b(hasattr|getattr)\(\s*[\w.]*sched"),
    "a swap of the server's parameters": re.compile(r"\.server\.params\s*=[^=]"),
    "a comparison of tensor addresses": re.compile(r"data_ptr\(\)"),
    "a read of stopping beside the Outcomes": re.compile(r"\bcore\.stopping\b"),
    # e.g. the real server set core.evals.waiting around begin(); begin takes it (waiting=...)
    "an assignment into the core's objects": re.compile(r"\bcore\.\w+\.\w+\s*=[^=]"),
}


@pytest.mark.parametrize("what", sorted(REACHES))
def test_no_driver_reaches_into_the_core_or_probes_the_schedule(what):
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in DRIVERS
             for n, line in enumerate(path.read_text().splitlines(), 1) if REACHES[what].search(line)]
    assert not found, f"{what} in the drivers:\n" + "\n".join(found)


def test_every_schedule_answers_every_verb_the_loop_calls():
    """The loop calls membership_due, evaluated and timing on any schedule; a schedule without
    recorded joins, evaluation cost or a model of the parts answers with the defaults."""
    class Bare(Schedule):
        def next(self):
            return None

        def served(self, client, applied_at): ...
        def cancel(self, client): ...
        def state_dict(self): return {}
        def load_state_dict(self, state): ...

    bare = Bare()
    assert bare.membership_due(3) == [] and bare.evaluated(1.0) is None and bare.check(1, 0) is None
    timing = bare.timing()
    assert sorted(timing) == sorted(("to_client_s", "compute_s", "to_server_s", "queue_s", "apply_s"))
    assert all(v != v for v in timing.values()) and bare.end_message == ""
    with pytest.raises(TypeError):
        Schedule()   # next, served, cancel and the state have no default


# ---------------------------------------------------------------------------------------------
# a push and its header: one field list
# ---------------------------------------------------------------------------------------------

@dataclass
class TimedPush(Push):
    """A push with two new fields, declared once: nothing else is edited for them to travel."""

    grad_norm: float = 0.0
    window: tuple[int, int] = (0, 0)


class TimedHeader(Header):
    push_type = TimedPush


def _fields(push: Push) -> dict:
    return {f.name: getattr(push, f.name) for f in push_fields(type(push))}


def test_a_new_push_field_crosses_the_wire_and_a_checkpoint_with_no_other_edit():
    update = torch.arange(6.0)
    push = TimedPush(client=2, read_version=5, update=update, num_steps=4, num_samples=128, train_loss=0.25,
                     train_error=0.125, stream_position=(1, 64), grad_norm=1.5, window=(3, 9))
    frame = Frame(6)
    frame.payload.copy_(update)
    back = TimedHeader.unpack(TimedHeader.pack_push(push, frame, 6, device=-1, sent_at=12.5))
    carried = {name: value for name, value in vars(push).items() if name not in ("client", "read_version", "update")}
    assert back == TimedHeader(Kind.PUSH, 2, 5, 6, carried, device=-1, sent_at=12.5)
    assert back.push["grad_norm"] == 1.5 and back.push["window"] == (3, 9)
    rebuilt = back.to_push(frame.payload[:6])
    assert type(rebuilt) is TimedPush and _fields(rebuilt) == _fields(push)
    assert torch.equal(rebuilt.update, update)
    state = _push_state(push)   # a sync round's held push, as a checkpoint keeps it
    assert state["grad_norm"] == 1.5 and state["window"] == [3, 9]
    held = _push_from_state(state)   # its type and every field, not a plain Push without them
    assert type(held) is TimedPush and _fields(held) == _fields(push) and torch.equal(held.update, update)


def test_a_checkpoint_without_push_types_still_loads_its_held_pushes_as_plain_pushes():
    """Checkpoints written before the type was recorded held plain pushes: they load as before."""
    push = Push(client=1, read_version=2, update=torch.ones(3), num_steps=1, num_samples=8,
                train_loss=0.5, train_error=0.25, stream_position=(0, 8))
    state = {k: v for k, v in _push_state(push).items() if k != "type"}
    held = _push_from_state(state)
    assert type(held) is Push and _fields(held) == _fields(push)


def test_the_core_never_needs_a_stopping_property():
    """One way for a driver to learn a run is stopping: the Outcome of each call that can end it."""
    assert not hasattr(RunCore, "stopping")


def test_a_push_field_that_cannot_cross_the_wire_is_refused_naming_it():
    @dataclass
    class Noted(Push):
        note: str = ""

    with pytest.raises(TypeError, match="'note'"):
        push_fields(Noted)


def test_the_header_round_trips_every_kind():
    frame = Frame(4)
    for header in (Header(Kind.PARAMS, 3, 7, 4, position=(2, 96), sent_at=1.25), Header(Kind.STOP, 1, 7, 0),
                   Header(Kind.HELLO, 0, 0, 4), Header(Kind.PARAMS, 3, 8, 4)):
        assert Header.unpack(header.pack(frame)) == header


# ---------------------------------------------------------------------------------------------
# what the core returns
# ---------------------------------------------------------------------------------------------

def _cfg(**kw) -> RunConfig:
    return RunConfig(num_clients=2, nsync=1, num_epochs=2.0, eval_every=0.5, progress=False,
                     data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"), **kw)


def _core(run, cfg: RunConfig, tmp_path, **kw) -> RunCore:
    """``run``'s core, as the simulator builds it unless ``kw`` says otherwise."""
    kw = {"clock": "virtual", "backend": "sim", **kw}
    run.core = RunCore(cfg, build_problem(cfg, torch.device("cpu")), tmp_path, **kw)
    return run.core


def _push(core: RunCore, client: int, push_type=Push, **extra) -> Push:
    return push_type(client=client, read_version=core.server.version,
                     update=torch.zeros_like(core.server.params), num_steps=1, num_samples=32,
                     train_loss=1.0, train_error=0.5, stream_position=(0, 32), **extra)


def test_the_core_says_what_it_did_with_each_push(tmp_path):
    """A sync round's first push is held (nothing applied, no reply); the second closes the
    round (applied, both replied); settle says when it evaluated; the core writes the timings
    row it is handed; an extra push field that updates.csv has no column for is not logged."""
    cfg = _cfg(protocol=ProtocolConfig(name="sync"))
    saved = []
    with run_folder(cfg, tmp_path) as run:
        core = _core(run, cfg, tmp_path)
        core.begin([1, 2], driver_state=lambda: saved.append(1) or {"mine": 1})
        held = core.on_push(_push(core, 1, TimedPush, grad_norm=2.0), 1.0)
        assert (held.replies, held.applied, held.stopping) == ((), False, False)
        core.record_timing(1.0, 1, 0, to_client_s=0.1, compute_s=0.2, to_server_s=0.3, queue_s=0.0, apply_s=0.0)
        closed = core.on_push(_push(core, 2), 2.0)
        assert sorted(r.client for r in closed.replies) == [1, 2] and closed.applied
        evaluated, settled = [], Outcome()
        while not settled.stopping:
            core.on_push(_push(core, 1), 3.0)
            core.on_push(_push(core, 2), 3.0)
            told = []
            settled = core.settle(3.0, evaluated=told.append)
            evaluated.append(told == [3.0])
        assert any(evaluated) and not all(evaluated)   # eval_every 0.5 epochs: not every round
        summary = core.finish(*core.final_status(interrupted=False))
    assert summary["status"] == "completed" and saved   # the final checkpoint asked the driver
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["driver"] == {"mine": 1}
    timings = (tmp_path / "timings.csv").read_text().splitlines()
    assert timings[1].split(",")[:5] == ["0", "1.0", "virtual", "1", "0"]
    assert "grad_norm" not in (tmp_path / "updates.csv").read_text()


def test_the_core_keeps_its_parameters_where_the_driver_says(tmp_path):
    """The real driver's reply frame holds the server's parameters from begin() on: an apply
    changes the frame, so a reply copies nothing."""
    cfg = _cfg()
    with run_folder(cfg, tmp_path) as run:
        core = _core(run, cfg, tmp_path, clock="wall", backend="real")
        frame = Frame(core.server.params.numel())
        before = core.server.params.clone()
        core.begin([1, 2], params_home=frame.payload)
        assert torch.equal(frame.payload, before)
        push = _push(core, 1)
        push.update.fill_(1.0)
        assert core.on_push(push, 0.5).applied
        assert not torch.equal(frame.payload, before) and torch.equal(frame.payload, core.server.params)
        core.finish("interrupted")


def _held_round(tmp_path, type_name: str | None = None) -> tuple[RunConfig, dict]:
    """A sync run's checkpoint holding client 1's TimedPush in a half-full round (its recorded
    type replaced by ``type_name``), and the config to resume it with."""
    cfg = _cfg(protocol=ProtocolConfig(name="sync"))
    with run_folder(cfg, tmp_path) as run:
        core = _core(run, cfg, tmp_path)
        core.begin([1, 2])
        assert not core.on_push(_push(core, 1, TimedPush, grad_norm=2.5, window=(4, 7)), 1.0).replies
        core.finish("interrupted")
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    if type_name is not None:
        state["protocol"]["pushes"]["1"]["type"] = type_name
    return cfg.replace(resume=True), state


def test_a_resumed_round_holds_the_push_subclass_it_held_with_all_its_fields(tmp_path):
    cfg, state = _held_round(tmp_path)
    assert state["protocol"]["pushes"]["1"]["type"].endswith("test_seam:TimedPush")
    with run_folder(cfg, tmp_path) as run:
        core = _core(run, cfg, tmp_path, resume=state)
        core.begin([1, 2], protocol_state=state["protocol"], fetching=False)
        held = core.protocol.pushes[1]
        assert type(held) is TimedPush and (held.grad_norm, held.window) == (2.5, (4, 7))
        core.finish("interrupted")


@pytest.mark.parametrize("name", ["tests.gone_module:TimedPush", "repro.asgd.algorithm:Gone",
                                  "repro.asgd.algorithm:Applied"])
def test_a_held_push_type_that_cannot_be_rebuilt_is_refused_naming_it_and_the_run_folder(tmp_path, name):
    """Never a silent plain Push: an unimportable type, or one that is no Push, is bad input."""
    cfg, state = _held_round(tmp_path, name)
    with run_folder(cfg, tmp_path) as run:
        core = _core(run, cfg, tmp_path, resume=state)
        with pytest.raises(ConfigError) as err:
            core.begin([1, 2], protocol_state=state["protocol"], fetching=False)
        core.finish("interrupted")
    message = str(err.value)
    assert name in message and str(tmp_path) in message and "\n" not in message, message


def test_the_command_line_refuses_such_a_resume_with_exit_2_and_one_line(tmp_path, monkeypatch, capsys):
    """...and the folder stays resumable once the type can be imported."""
    from repro.sim.driver import simulate

    from tests.helpers.grids import cli_in_process
    from tests.helpers.runs import CLI_ARGS, cli_cfg

    run_dir = tmp_path / "run"
    assert simulate(cli_cfg("protocol=sync"), run_dir, stop_at_version=4)["status"] == "interrupted"
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    push = _push_state(TimedPush(client=1, read_version=4, update=state["server"]["params"].clone(),
                                 num_steps=2, num_samples=64, train_loss=1.0, train_error=0.5,
                                 stream_position=(0, 64)))
    state["protocol"]["pushes"] = {"1": {**push, "type": "gone_module:TimedPush"}}
    torch.save(state, run_dir / "checkpoint.pt")
    # in the test's process (its exit status and what it says are tested, not its process: a
    # fresh interpreter's imports cost ~2 s each; tests/helpers/grids.cli_in_process)
    code = cli_in_process(monkeypatch, f"hydra.run.dir={run_dir}", *CLI_ARGS, "protocol=sync", "resume=true")
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    said = [line for line in stderr.splitlines() if "gone_module:TimedPush" in line]
    assert len(said) == 1 and str(run_dir) in said[0] and "Traceback" not in stderr, stderr
    state["protocol"]["pushes"]["1"]["type"] = push_type_name(Push)   # the type made importable
    torch.save(state, run_dir / "checkpoint.pt")
    code = cli_in_process(monkeypatch, f"hydra.run.dir={run_dir}", *CLI_ARGS, "protocol=sync", "resume=true")
    assert code == 0, capsys.readouterr().err   # the refusal left the run resumable
