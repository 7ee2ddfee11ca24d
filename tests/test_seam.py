"""One seam between the drivers and the run core (issue 31, item 2).

A driver hands the core what it needs when it begins, hands it pushes, carries the replies of
each :class:`~repro.runs.core.Outcome` and reads the run through the core's properties: it never
writes into the core's state or objects, nor probes the schedule for what it can do. A push and
its wire header share one field list, so a new push field is declared where it is produced
and read where it is used, and nothing in between changes.
"""
import re
from dataclasses import dataclass

import pytest
import torch

from repro.asgd.algorithm import Push, push_fields
from repro.asgd.protocols import _push_from_state, _push_state
from repro.config.settings import DataConfig, ModelConfig, ProtocolConfig, RunConfig
from repro.workload.start import build_problem
from repro.real.frames import Frame, Header, Kind
from repro.runs.core import RunCore
from repro.runs.folder import run_folder
from repro.sim.cost import Schedule

from tests.helpers.paths import ROOT

DRIVERS = sorted((ROOT / "repro" / "sim").glob("*.py")) + sorted((ROOT / "repro" / "real").glob("*.py"))
REACHES = {
    "the core's run log or state": re.compile(r"\bcore\.(runlog|state)\b"),
    "a probe of the schedule": re.compile(r"\b(hasattr|getattr)\(\s*[\w.]*sched"),
    "a swap of the server's parameters": re.compile(r"\.server\.params\s*=[^=]"),
    "a comparison of tensor addresses": re.compile(r"data_ptr\(\)"),
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
    header = TimedHeader.of_push(push, 6, device=-1, sent_at=12.5)
    back = TimedHeader.unpack(header.pack(frame))
    assert back == header and back.push["grad_norm"] == 1.5 and back.push["window"] == (3, 9)
    rebuilt = back.to_push(frame.payload[:6])
    assert type(rebuilt) is TimedPush and _fields(rebuilt) == _fields(push)
    assert torch.equal(rebuilt.update, update)
    state = _push_state(push)   # a sync round's held push, as a checkpoint keeps it
    assert state["grad_norm"] == 1.5 and state["window"] == [3, 9]
    assert _fields(_push_from_state(state)) == _fields(Push(**{k: v for k, v in _fields(push).items()
                                                                 if k not in ("grad_norm", "window")},
                                                              update=update))


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
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="virtual", backend="sim")
        core.begin([1, 2], driver_state=lambda: saved.append(1) or {"mine": 1})
        held = core.on_push(_push(core, 1, TimedPush, grad_norm=2.0), 1.0)
        assert (held.replies, held.applied, held.stopping) == ((), False, False)
        core.record_timing(1.0, 1, 0, to_client_s=0.1, compute_s=0.2, to_server_s=0.3, queue_s=0.0, apply_s=0.0)
        closed = core.on_push(_push(core, 2), 2.0)
        assert sorted(r.client for r in closed.replies) == [1, 2] and closed.applied
        evaluated = []
        while not core.stopping:
            core.on_push(_push(core, 1), 3.0)
            core.on_push(_push(core, 2), 3.0)
            evaluated.append(core.settle(3.0).evaluated)
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
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="wall", backend="real")
        frame = Frame(core.server.params.numel())
        before = core.server.params.clone()
        core.begin([1, 2], params_home=frame.payload)
        assert torch.equal(frame.payload, before)
        push = _push(core, 1)
        push.update.fill_(1.0)
        assert core.on_push(push, 0.5).applied
        assert not torch.equal(frame.payload, before) and torch.equal(frame.payload, core.server.params)
        core.finish("interrupted")
