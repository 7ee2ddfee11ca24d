"""The run core: a run's bookkeeping, written once for both drivers (docs/architecture.md, "The seam").
A driver decides only *which* push comes next and *when*, and carries the replies; the core checks,
applies and logs each push, keeps the evaluation and checkpoint cadence, and ends the run."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from repro.asgd.algorithm import Push, ParameterServer, push_fields
from repro.asgd.protocols import Decision, View, make_protocol
from repro.config.checks import MAX_PUSHES_PER_CLIENT, check_segment, ignored_protocol_keys
from repro.config.loader import SHORTENED
from repro.config.settings import RunConfig, to_dict
from repro.files import schema
from repro.files.storage import save_checkpoint, to_cpu
from repro.logs import get_logger
from repro.workload.build import Problem, class_errors
from repro.runs.evaluations import Evaluations
from repro.runs.folder import resume_hint
from repro.runs.resume import load_protocol_state
from repro.runs.runlog import Progress, RunLog, diverged_advice, worse_than_start
from repro.runtime import environment, stop_asked

log = get_logger("repro.runs.core")

STALL_PUSHES = MAX_PUSHES_PER_CLIENT   # pushes per live client without an apply: the protocol makes no progress


@dataclass(frozen=True)
class Reply:
    """What the driver carries back to a client: the server's parameters, or STOP. ``preempt``: the
    client still computes a segment the protocol dropped (a backup worker); it starts over from them."""
    client: int
    stop: bool = False
    preempt: bool = False


@dataclass(frozen=True)
class Outcome:
    """What the core did: the ``replies`` the driver carries now, whether the server's version moved
    (``applied``), whether the push was dropped on arrival (``discarded``: by the protocol, or as
    diverging), and whether the run is ending (``stopping``: the driver stops its clients)."""
    replies: tuple[Reply, ...] = ()
    applied: bool = False
    discarded: bool = False
    stopping: bool = False


@dataclass
class RunState:
    """What the core knows about the run's course beyond the log."""
    stopping: bool = False          # no more pushes are applied (budget spent, diverged, stop)
    diverged: str = ""              # why, when it did
    error: str = ""                 # a failure a driver reported
    away: frozenset[int] = frozenset()   # lost clients due back at the end (final_status)
    driver_state: Callable[[], dict] = field(default=lambda: {})


class RunCore:
    """The server side of one run, writing ``run_dir``. Build it inside :func:`run_folder`."""

    def __init__(self, cfg: RunConfig, problem: Problem, run_dir: Path, *, clock: str, backend: str,
                 resume: dict | None = None, measured: dict | None = None, eval_in_thread: bool = False):
        self.cfg, self.problem, self.run_dir = cfg, problem, Path(run_dir)
        check_segment(cfg, problem.dataset.num_train)   # before any file of the run is written
        for key in ignored_protocol_keys(cfg):
            log.warning(f"{key} is ignored: protocol={cfg.protocol.name} does not read it")
        log.debug(f"{backend} run in {self.run_dir}: {cfg}")   # (hydra.verbose=true or repro)
        self.server: ParameterServer = problem.make_server(cfg)
        self.state = RunState()
        if resume is not None:
            self.server.load_state_dict(resume["server"])
        core_state = (resume or {}).get("core", {})
        legacy = ((resume or {}).get("protocol") or {}).get("discarded", [])   # kept by Sync before
        # [read_version, client] of each push dropped (or refused), and of each push merged (rennala)
        self.discarded = [[int(a), int(b)] for a, b in core_state.get("discarded", legacy)]
        self.collected = [[int(a), int(b)] for a, b in core_state.get("collected", [])]
        self.budget = cfg.num_epochs * problem.dataset.num_train
        recorded = to_dict(cfg)   # what config.json records: the resolved settings, with what the run measured
        for key, value in (measured or {}).items():   # (dotted keys: "cost.compute_s")
            section, _, leaf = key.rpartition(".")
            (recorded[section] if section else recorded)[leaf] = value
        recorded["environment"] = environment(self.server.params.device)
        recorded.update(problem.recorded())   # what is trained; for a shortened folder name, its overrides:
        if self.run_dir.name in SHORTENED:
            recorded["overrides"] = SHORTENED[self.run_dir.name]
        self.runlog = RunLog(self.run_dir, recorded, clock=clock, backend=backend,
                             num_train=problem.dataset.num_train, eval_every=cfg.eval_every,
                             target_error=cfg.target_error, resume_from=resume["runlog"] if resume else None)
        self.evals = Evaluations(problem, self.runlog, cfg.divergence_factor, eval_in_thread, state=core_state,
                                 wait_s=0.0 if cfg.backend.eval_in_thread else cfg.backend.timeout_s)
        self.progress = Progress(f"{backend} {cfg.exp_name}/{self.run_dir.name}", cfg.num_epochs, cfg.progress,
                                 loss_only=problem.dataset.task != "classification")
        self.finished: dict | None = None
        self.protocol = None   # made by begin(), when the clients are known
        self.live: frozenset[int] = frozenset()   # clients in the run (not lost)
        self._unapplied = 0                       # pushes since the last apply
        self._checkpointed = self.server.version   # the version of the last periodic checkpoint

    def begin(self, clients: list[int], time_s: float = 0.0, protocol_state: dict | None = None,
              fetching: bool = True, driver_state: Callable[[], dict] | None = None,
              params_home: torch.Tensor | None = None, waiting: Callable[[], None] | None = None) -> Outcome:
        """Start serving ``clients``: the protocol, and version 0 evaluated before any push. ``fetching``:
        each client holds the server's parameters now (not so in a resumed simulation); ``params_home``:
        a tensor the server keeps its parameters in from now on (the real driver's reply frame)."""
        self.state.driver_state = driver_state or self.state.driver_state
        if params_home is not None:
            self.server.keep_in(params_home)
        self.protocol = make_protocol(self.cfg, clients, self.server.version)
        self.live = frozenset(clients)
        for k in sorted(self.lost_clients & self.live):   # a resume started it again: it is back
            self.runlog.lost_clients.pop(str(k))
            self.runlog.add_event("client_rejoined", client=k, joined_time_s=round(time_s, 6))
        load_protocol_state(self.protocol, protocol_state, self.run_dir)
        for k in clients if fetching else ():
            self.server.fetched(k)
        if self.runlog.version == 0 and self.runlog.last_eval_version < 0:   # (may find version 0 non-finite)
            self.evaluate_now(self.server.version, time_s, self.server.params, waiting=waiting)
        elif self.evals.resumed is not None:   # running as the checkpoint was written: its row was cut
            self.evaluate_now(**self.evals.resumed, waiting=waiting)
        self.state.stopping |= self.runlog.samples_seen >= self.budget
        return Outcome(stopping=self.state.stopping)

    @property
    def error(self) -> str:
        """Why the run failed (:meth:`fail`), or ""."""
        return self.state.error

    @property
    def lost_clients(self) -> frozenset[int]:
        """The clients lost and not back, across resumes."""
        return frozenset(int(k) for k in self.runlog.lost_clients)

    @property
    def used_clients(self) -> frozenset[int]:
        """Every client id the run's events name (lost, joined, ...), across resumes."""
        return frozenset(int(e["client"]) for e in self.runlog.events if "client" in e)

    @property
    def time_s(self) -> float:
        """The run's clock at its last push (a resumed run's clock continues from there)."""
        return self.runlog.time_s

    def stop(self) -> None:
        """No more pushes are applied (a replay ran out, a stop): the driver's loop says how the run ended."""
        self.state.stopping = True

    def on_push(self, push: Push, time_s: float) -> Outcome:
        """One push: check it, ask the protocol, apply what it says, say who gets what back."""
        if self.state.stopping:
            return Outcome((Reply(push.client, stop=True),), stopping=True)
        version, decision, mine = self.server.version, Decision(), [int(push.read_version), int(push.client)]
        if why := self.evals.check_loss(push):   # every push, before any protocol merges it
            self.diverge(why)
            self.discarded.append(mine)   # dropped on arrival, no apply (which cost=fit leaves out)
            replies = self._deliver([Reply(push.client)])
        else:
            decision = self.protocol.on_push(push, self.view())
            self._unapplied = 0 if decision.apply is not None else self._unapplied + 1
            replies = self._carry_out(decision, time_s)
        return Outcome(tuple(replies), applied=self.server.version != version, stopping=self.state.stopping,
                       discarded=bool(why) or any([int(v), int(k)] == mine for v, k in decision.discarded))

    def record_timing(self, time_s: float, client: int, read_version: int, **parts: float) -> None:
        """One push's timings.csv row, after :meth:`on_push` (so it has the version of its updates row)."""
        self.runlog.log_timing(time_s=time_s, client=client, read_version=read_version, **parts)

    def view(self) -> View:
        return View(version=self.server.version, live=self.live, left=self.budget - self.runlog.samples_seen)

    def _carry_out(self, decision: Decision, time_s: float) -> list[Reply]:
        """Apply what the protocol decided, record what it discarded, make its replies."""
        if decision.apply is not None:
            self.apply(decision.apply, time_s)
        self.discarded += [[int(v), int(k)] for v, k in decision.discarded]
        self.collected += [[int(v), int(k)] for v, k in decision.collected]
        replies = [Reply(k) for k in decision.reply] + [Reply(k, preempt=True) for k in decision.preempt]
        # a protocol that holds every live client, or applies nothing push after push, fails the run
        name, watch = self.cfg.protocol.name, not self.state.stopping and bool(self.live)
        if watch and self.live <= set(self.protocol.waiting()):
            self.fail(f"protocol {name!r} holds every live client {sorted(self.live)} waiting for a "
                      "reply it never gives (a deadlock in the protocol)")
        elif watch and self._unapplied > STALL_PUSHES * len(self.live):
            self.fail(f"protocol {name!r} applied none of the last {self._unapplied} pushes "
                      f"({STALL_PUSHES} per live client): it makes no progress")
        return self._deliver(replies)

    def apply(self, push: Push, time_s: float):
        """Apply one push (or a protocol's merged push) with the server rule and log its row."""
        applied = self.server.apply(push)
        pushed = {f.name: f.cast(getattr(push, f.name)) for f in push_fields(type(push))
                  if f.name in schema.UPDATE_COLUMNS}
        self.runlog.log_push(version=applied.version, time_s=time_s, staleness=applied.staleness, **pushed)
        if self.runlog.samples_seen >= self.budget:
            self.state.stopping = True
        return applied

    def fail(self, why: str) -> None:
        """End the run ``failed`` (a bug, not the data): no more pushes are applied."""
        if not self.state.error:
            self.state.error = why
            log.error(f"failed: {why}")
        self.state.stopping = True

    def _deliver(self, replies: list[Reply]) -> list[Reply]:
        if self.state.stopping:   # whoever still waits on the protocol is told to stop too
            owed = [r.client for r in replies if not r.preempt] + list(self.protocol.on_stop())
            replies = [Reply(k, stop=True) for k in dict.fromkeys(owed)]
        for r in replies:
            if not r.stop:
                self.server.fetched(r.client)   # delay-compensating rules remember w_bak
        return replies

    def settle(self, time_s: float, evaluated: Callable[[float], None] = lambda t: None,
               waiting: Callable[[], None] | None = None) -> Outcome:
        """After the replies went out: evaluation and checkpoint cadence, progress. ``evaluated(time_s)``:
        an evaluation row was written now, before this version's checkpoint."""
        evals = self.runlog.last_eval_version
        self.drain()
        if self.evals.due() and not self.state.diverged:
            self.evals.submit(self.server.version, time_s, self.server.params, waiting=waiting)
            self.drain()
        if self.runlog.last_eval_version != evals:
            evaluated(time_s)
        every, version = self.cfg.checkpoint_every, self.server.version
        if every and version % every == 0 and version != self._checkpointed:
            self.save_checkpoint()
            self._checkpointed = version
        self.progress.update(self.runlog)
        return Outcome(stopping=self.state.stopping)

    def drain(self) -> Outcome:
        """Write the rows of finished evaluations (one may find the run diverged; one that failed fails it)."""
        for why in self.evals.drain():
            self.diverge(why)
        return Outcome(stopping=self.state.stopping)

    def evaluate_now(self, version: int, time_s: float, params: torch.Tensor, samples_seen: int | None = None,
                     waiting: Callable[[], None] | None = None) -> None:
        """Evaluate and wait (version 0's, a resumed one, the final one): one hung (Evaluations.join) fails the run."""
        self.evals.submit(version, time_s, params, inline=True, samples_seen=samples_seen)
        if hung := self.evals.join(self.cfg.backend.timeout_s, " (backend.timeout_s)", waiting):
            self.stop() if stop_asked() else self.fail(hung)
        self.drain()

    def diverge(self, why: str) -> None:
        """The run ends ``diverged``: no more pushes are applied (also when it already had)."""
        self.state.stopping = True
        if not self.state.diverged:
            self.state.diverged = why
            self.runlog.add_event("diverged", reason=why)
            log.info(f"diverged: {why}")

    def lose(self, client: int, reason: str, time_s: float = 0.0, applied_at: float | None = None) -> Outcome:
        """A client is gone: the replies owed to those it held back (``applied_at``: when a round it closes applies)."""
        if str(client) not in self.runlog.lost_clients:
            self.runlog.lost_clients[str(client)] = reason
            self.runlog.add_event("client_lost", client=client, reason=reason, lost_time_s=round(time_s, 6))
        self.live = self.live - {client}
        if self.protocol is None:
            replies = []
        elif self.state.stopping:
            replies = self._deliver([])
        else:
            replies = self._carry_out(self.protocol.on_lost(client, self.view()),
                                      time_s if applied_at is None else applied_at)
        return Outcome(tuple(replies), stopping=self.state.stopping)

    def join(self, client: int, time_s: float = 0.0) -> bool:
        """A client joined, fetching the current version now; True: a lost client back."""
        rejoin = self.runlog.lost_clients.pop(str(client), None) is not None
        self.runlog.add_event("client_rejoined" if rejoin else "client_joined", client=client,
                              joined_time_s=round(time_s, 6))
        if self.protocol is not None:   # a held push of its the protocol drops is discarded
            self.discarded += [[int(v), int(k)] for v, k in self.protocol.on_join(client, self.view()) or ()]
        self.live = self.live | {client}
        self.server.fetched(client)
        return rejoin

    def save_checkpoint(self) -> None:
        state = {"kind": self.runlog.backend, "server": to_cpu(self.server.state_dict()),
                 "runlog": self.runlog.state_dict(), "driver": self.state.driver_state(),
                 "core": to_cpu({**self.evals.state_dict(), "discarded": self.discarded, "collected": self.collected}),
                 "protocol": to_cpu(self.protocol.state_dict()) if self.protocol else {}}
        save_checkpoint(state, self.run_dir / schema.CHECKPOINT_FILE)

    def final_status(self, interrupted: bool, away: frozenset[int] = frozenset()) -> tuple[str, str]:
        """The status of a run whose loop ended, and its message; ``away``: lost clients due back."""
        self.state.away = away   # nor does the summary name them (lost_clients)
        if self.state.error:
            return "failed", self.state.error
        if interrupted:
            return "interrupted", ""
        if self.state.diverged:
            return "diverged", self.state.diverged
        if self.runlog.samples_seen < self.budget:
            return "failed", (f"every client was lost before the budget (epoch {self.runlog.epoch:.2f} of "
                              f"{self.cfg.num_epochs:g}; lost: {sorted(self.lost_clients)}); see the client_lost "
                              "events")
        gone = sorted(self.lost_clients - away)
        # the clients there at the end: a joiner may take a lost client's place; a real resume restarts only 1..N
        if gone and len(self.live | away) < self.cfg.num_clients:
            return "completed_degraded", f"clients {gone} were lost; the others finished the budget"
        return "completed", ""

    def finish(self, status: str, message: str = "", clean: bool = True, **extra) -> dict:
        """End the run: final evaluation (completed runs), final checkpoint of a clean state (``clean``:
        no push half-served), terminal summary, files closed. Idempotent. An evaluation that evaluates
        no batch for ``backend.timeout_s`` (5 s when not clean) ends it ``failed`` (or ``interrupted``)."""
        if self.finished is not None:
            return self.finished
        limit, key = (self.cfg.backend.timeout_s, " (backend.timeout_s)") if clean else (5.0, "")
        asked = stop_asked()   # one asked while the wait below runs (a first Ctrl-C) ends it
        if hung := self.evals.join(limit, key):   # a hung evaluation must not leave the folder 'running'
            log.error(hung)
            message = "; ".join(m for m in (hung, message) if m)
            status = "interrupted" if status == "interrupted" or (stop_asked() and not asked) else "failed"
        try:
            if clean:
                self.drain()
                if status.startswith("completed"):   # a last look at its parameters
                    if self.runlog.last_eval_version != self.server.version:
                        self.evaluate_now(self.server.version, self.runlog.time_s, self.server.params)
                    if not bool(torch.isfinite(self.server.params).all()):
                        self.diverge("non-finite parameters at the end of the run")
                    if self.state.error or self.state.diverged or stop_asked() and not asked:
                        status, message = self.final_status(interrupted=stop_asked() and not asked)
                    elif (classes := class_errors(self.problem.net, self.server.params,
                                                  self.problem.eval_sets)) is not None:
                        extra["final_class_test_error"] = classes   # the final parameters, per class
                self.save_checkpoint()
        except OSError as exc:   # a full disk: keep the last good checkpoint, say so
            status, message = "failed", f"could not write the run folder ({exc}); " + resume_hint(self.run_dir)
        if status == "interrupted" and (hint := resume_hint(self.run_dir)) not in message:
            message = f"{message or 'interrupted'}; {hint}"
        note = worse_than_start(self.runlog.evals.path) if status.startswith("completed") else \
            diverged_advice(self.cfg.algo.lr, self.cfg.num_clients) if status == "diverged" else ""
        message = "; ".join(m for m in (message, note) if m)
        if self.discarded or getattr(type(self.protocol), "discards", False):
            extra["discarded_pushes"] = self.discarded
        if self.collected or getattr(type(self.protocol), "collects", False):
            extra["collected_pushes"] = self.collected
        if self.runlog.backend == "real" and self.evals.cpu_s:   # what cost=fit's cost.eval_s reads
            extra["eval_cpu_s"] = sum(self.evals.cpu_s) / len(self.evals.cpu_s)
        self.finished = self.runlog.write_summary(status, message=message, protocol=self.cfg.protocol.name,
                                                  lost_clients=sorted(self.lost_clients - self.state.away), **extra)
        self.runlog.close()
        self.progress.update(self.runlog, force=True)
        return self.finished

