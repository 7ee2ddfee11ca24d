"""Hydra callbacks of an experiment grid: :class:`BuildFigure` draws the figure from the grid's own
points once it has ended; :class:`Grid` prints its progress and stops it cleanly on Ctrl-C, under any
launcher. What users see: docs/paper.md, "Grids" and "Ctrl-C"; how: docs/architecture.md, "Grids".
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from repro.errors import BAD_POINTS, ConfigError
from repro.gridpoint import (STOP_DIR, PointGuard, check_distinct, forget_folder, grid_points, lock_holder,
                             point_folders, point_state, process_started, summary_status)
from repro.logs import follow_verbose
from repro.runtime import EXIT_INTERRUPTED, StopRequest


# -- the figure ------------------------------------------------------------------------------------------

class BuildFigure(Callback):
    """Draw ``figure`` from this grid's own points into ``out_dir`` after the grid (other runs of the
    folder and refused points left out, named in a warning). ``name``: the files' base name (default:
    the figure's), so a variant (``fig3_paper``) never overwrites the original's files."""

    def __init__(self, figure: str, out_dir: str = "figures", name: str | None = None) -> None:
        self.figure, self.out_dir, self.name = figure, out_dir, name or figure   # out_dir: ${figures_dir}, resolved

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        overrides = [str(o) for o in config.hydra.overrides.task]
        points = grid_points(config)   # None: draw every run of one configuration
        # a point refused as bad input did not run: its folder may hold an old run of other settings
        refused = [p for p in points or [] if p in BAD_POINTS]
        if points and len(refused) == len(points):
            print(f"{self.name}: no figure drawn: every point of the grid was refused (named above)",
                  file=sys.stderr, flush=True)
            return
        sweep = Path(str(config.hydra.sweep.dir))   # results_dir/exp_name, unless hydra.sweep.dir moved it
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                paths = self.build(str(sweep.parent), sweep.name, points, figure_stem(self.name, overrides), refused)
        except ConfigError as err:
            print(f"{self.name}: no figure drawn: {err}", file=sys.stderr, flush=True)
            return
        finally:
            for w in caught:
                print(f"warning: {w.message}", file=sys.stderr, flush=True)
        print(f"{self.name}: wrote " + ", ".join(str(p) for p in paths), flush=True)

    def build(self, results_dir: str, exp_name: str, jobs: list[str] | None = None,
              stem: str | None = None, refused: list[str] = ()) -> list[Path]:
        from repro.analysis import build_figure
        return build_figure(self.figure, results_dir, self.out_dir, exp_name=exp_name,
                            jobs=jobs, stem=stem or self.name, each=True, refused=refused)


def figure_stem(name: str, overrides: list[str]) -> str:
    """The base name of a grid's figure files, from its command line (``overrides``): the rules are
    docs/paper.md's, "One figure, one configuration"."""
    from repro.analysis.render import file_label
    from repro.config.loader import job_name
    from repro.hydra_internals import override_values
    given = override_values([a for a in overrides if "=" in a and not a.startswith("-")])   # quotes undone
    if "figures_dir" in given:
        return name
    if given.get("exp_name"):
        # a grid that draws several figures (own_data and partition): the one named as its
        # experiment takes the experiment's new name, the others add theirs, so none overwrites
        stem = file_label(str(given["exp_name"]))
        return stem if given.get("exp") in (None, name) else f"{stem}-{file_label(name)}"
    label = job_name(overrides)
    return name if label == "base" else f"{name}-{file_label(label)}"


# -- the grid: its points, their states, progress and stopping ------------------------------------------

def _varying(names: list[str]) -> dict[str, str]:
    """{folder name: the part that differs between grid points} (``nsync=4,seed=1``): the keys
    every point sets alike (``num_epochs=0.5`` from the command line) say nothing."""
    split = {n: dict(kv.partition("=")[::2] for kv in n.split(",")) for n in names}
    keys = {k for kv in split.values() for k in kv}
    same = {k for k in keys if len({kv.get(k) for kv in split.values()}) == 1}
    return {n: ",".join(f"{k}={v}" for k, v in kv.items() if k not in same) or n for n, kv in split.items()}


class Grid(Callback):
    """Progress of a grid and a clean Ctrl-C. ``every_s``: print the progress line this often even when
    nothing changes (0: only on changes); ``stop_wait_s``: how long the launcher waits, after Ctrl-C, for
    running points to record ``interrupted`` before it ends them."""

    def __init__(self, every_s: float = 60.0, stop_wait_s: float = 120.0, poll_s: float = 1.0) -> None:
        self.every_s, self.stop_wait_s, self.poll_s = every_s, stop_wait_s, poll_s
        self.main_pid: int | None = None
        self.main_host, self.main_started, self.launch_id, self.label = "", None, "", "grid"
        self.sweep_dir: Path | None = None
        self._reset_local()

    def _reset_local(self) -> None:
        """State that lives in the launching process only (never pickled to a worker)."""
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._stop: StopRequest | None = None
        self._started = time.monotonic()
        self.points: list[str] | None = None
        self._short: dict[str, str] = {}
        self._skipped: set[str] = set()
        self._lost_ones: set[str] = set()
        self._show = True

    def __getstate__(self) -> dict:
        # workers (joblib, submitit) get a copy of the callbacks: without threads, handlers, events
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset_local()

    # -- the launching process ----------------------------------------------------------------
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_places(config)
        self.main_pid, self.main_host = os.getpid(), socket.gethostname()
        self.main_started, self.launch_id = process_started(self.main_pid), uuid.uuid4().hex[:12]
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.label = f"grid {config.get('exp_name', '')}".strip()
        self._show = bool(config.get("progress", True))
        self._started = time.monotonic()
        self.points = point_folders(config)
        check_distinct(self.points or [])
        if self.points:
            self._short = _varying(self.points)
            if not config.get("force", False):   # force=true re-runs finished points
                self._skipped = {p for p in self.points if point_state(self.sweep_dir / p) == "done"}
        if str(config.hydra.launcher.get("_target_", "")).endswith("JoblibLauncher"):
            from repro.launcher import PointSlots, use_point_slots   # a dead worker costs only its point
            use_point_slots(self.label, self._lost)
            if self.points:
                n = min(PointSlots().effective_n_jobs(config.hydra.launcher.get("n_jobs", -1)), len(self.points))
                _say(f"joblib (loky): launching {len(self.points)} jobs in {n} worker process(es)")
        self._stop = StopRequest(on_signal=self._on_signal, force=self._forced).__enter__()
        if self._stop.is_set():   # a signal during start-up, to the command line's handler: no point starts
            self._on_signal(self._stop.reason)
        self._thread = threading.Thread(target=self._watch, name="grid-progress", daemon=True)
        self._thread.start()

    def _lost(self) -> str:
        """The points whose worker just died: their folder says running, and nobody holds it."""
        killed = [f for f, state in self.states().items() if state == "killed" and f not in self._lost_ones]
        self._lost_ones.update(killed)
        return "; ".join(self._name(f) for f in killed) or "a grid point"

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._stop_watching()
        print(self.progress_line(final=True, prefix="finished: "), file=sys.stderr, flush=True)

    def _forced(self, name: str) -> SystemExit:
        """The second signal: stop now (the launcher ends its workers)."""
        _say(f"[{self.label}] {name} again: stopping now")
        return SystemExit(EXIT_INTERRUPTED)

    def _on_signal(self, name: str) -> None:
        """The first signal (SIGINT, SIGTERM, SIGHUP): mark the launch stopped, so that every
        point stops cleanly and none starts, wait for this host's points, exit 130."""
        self._mark_stopped()
        running = self._in_flight()
        _say(f"[{self.label}] {name}: no new grid point starts; "
             + (f"waiting for {len(running)} running point(s) to record 'interrupted' "
                f"({', '.join(self._name(p) for p in running)}); again to stop now"
                if running else "none is running"))
        deadline = time.monotonic() + self.stop_wait_s
        while running and time.monotonic() < deadline:
            time.sleep(0.1)
            running = self._in_flight()
        remote = [f for f in self._folders() if (lock_holder(self.sweep_dir / f) or {}).get(
            "host", socket.gethostname()) != socket.gethostname()] if self.sweep_dir else []
        self._halt(f"stopped by {name}"
                   + (f"; {len(running)} point(s) did not stop within {self.stop_wait_s:g} s and are "
                      "ended now" if running else "")
                   + (f"; {len(remote)} point(s) run on other hosts: they stop when they see the stop "
                      "mark (or scancel stops them)" if remote else ""))

    def _halt(self, why: str) -> NoReturn:
        """End the launch: the stop mark, the progress thread and the handlers go, the last
        progress line, why, and how to go on (which folders to resume), then exit 130."""
        self._mark_stopped()
        self._stop_watching()
        _say(self.progress_line(final=True))
        where = f" (their folders are under {self.sweep_dir})" if self.sweep_dir else ""
        _say(f"[{self.label}] {why}. The same command with resume=auto continues the interrupted points "
             f"and skips the finished ones{where}.")
        raise SystemExit(EXIT_INTERRUPTED)

    def _stop_watching(self) -> None:
        """The progress thread ends, then the signal handlers go back to what they were (in that
        order: a second Ctrl-C while the thread is joined still reaches ours, exit 130)."""
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        if self._stop is not None:
            self._stop.__exit__(None, None, None)
        self._stop = None

    # -- where a grid point runs ------------------------------------------------------------
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """In the point's process, before its run: a point of a stopped launch does not start;
        any other watches for the stop mark and, on this host, for its launcher's death."""
        follow_verbose(config.hydra.get("verbose"))   # Hydra has configured the point's logging
        if self.mark_path().exists():
            run_dir = Path(str(config.hydra.runtime.output_dir))
            _say(f"[{self.label}] {self._name(run_dir.name)} does not start: the grid was stopped "
                 "(the same command with resume=auto runs it)")
            forget_folder(run_dir)
            raise SystemExit(EXIT_INTERRUPTED)   # not an exception: Hydra only warns of those
        if os.getpid() != self.main_pid:
            PointGuard.start(self)

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        """In the launching process (hydra/launcher=basic) a Ctrl-C reaches the run, which stops
        cleanly and returns: stop the grid here instead of starting the next point."""
        if os.getpid() != self.main_pid:
            return
        run_dir = Path(str(config.hydra.runtime.output_dir))
        # (an interrupted folder from an earlier launch is refused or resumed)
        if summary_status(run_dir) == "interrupted":
            self._halt(f"stopped: {self._name(run_dir.name)} was interrupted")

    # -- the stop mark ------------------------------------------------------------------------
    def mark_path(self) -> Path:
        """This launch's stop mark: its own, so two grids sharing a sweep folder (an experiment
        run twice with other overrides) never stop each other."""
        return (self.sweep_dir or Path(".")) / STOP_DIR / (self.launch_id or "none")

    def _mark_stopped(self) -> None:
        if self.sweep_dir is not None:
            path = self.mark_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}))

    # -- progress -----------------------------------------------------------------------------
    def _folders(self) -> list[str]:
        if self.points is not None or self.sweep_dir is None or not self.sweep_dir.is_dir():
            return self.points or []
        return sorted(p.name for p in self.sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))

    def _name(self, folder: str) -> str:
        return self._short.get(folder, folder)

    def _in_flight(self) -> list[str]:
        """The points running on this host (the terminal's Ctrl-C reached them): the launcher waits for
        them, not for a point on another host (Slurm), which sees the stop mark or ``scancel``."""
        holders = {f: lock_holder(self.sweep_dir / f) or {} for f in self._folders()}
        return [f for f, h in holders.items() if h.get("host") == socket.gethostname() and h.get("pid") != os.getpid()]

    def states(self) -> dict[str, str]:
        return {f: point_state(self.sweep_dir / f) for f in self._folders()} if self.sweep_dir else {}

    def progress_line(self, final: bool = False, prefix: str = "", states: dict | None = None) -> str:
        states = self.states() if states is None else states
        # a point refused as bad input (repro.run.job, repro.launcher) did not run: its folder may hold an old run
        states = {f: "refused" if f in BAD_POINTS else s for f, s in states.items()}
        groups = {state: [f for f, s in states.items() if s == state] for state in set(states.values())}
        done = groups.get("done", [])
        skipped = len(self._skipped & set(done))
        parts = [f"{len(done)}/{len(states)} done" + (f" ({skipped} skipped: already finished)" if skipped else "")]
        parts += [f"{len(groups[state])} {state}: " + "; ".join(self._name(f) for f in groups[state])
                  for state in ("running", "interrupted", "failed", "killed", "refused") if groups.get(state)]
        if groups.get("waiting"):
            parts.append(f"{len(groups['waiting'])} {'not started' if final else 'waiting'}")
        took = int(round(time.monotonic() - self._started))
        took_text = f"{took // 60}m{took % 60:02d}s" if took >= 60 else f"{took}s"
        return f"[{self.label}] {prefix}" + ", ".join(parts) + f"  ({took_text})"

    def _watch(self) -> None:
        last_key, last_print = None, time.monotonic()
        while not self._done.wait(self.poll_s):
            try:
                states = self.states()
            except Exception:   # a folder mid-write; try again
                continue
            key = tuple(sorted(states.items()))
            now = time.monotonic()
            if self._show and (key != last_key or (self.every_s and now - last_print >= self.every_s)):
                if last_key is not None or any(s == "running" for s in states.values()):
                    print(self.progress_line(states=states), file=sys.stderr, flush=True)
                last_key, last_print = key, now


def _check_places(config: DictConfig) -> None:
    """exp_name and results_dir checked before Hydra makes the sweep folder (a grid point is
    checked only once it runs, when its folder exists): exit 2, no folder."""
    from repro.config.checks import check_places
    from repro.config.loader import exit_bad_input
    from repro.config.settings import RunConfig
    try:
        check_places(RunConfig(exp_name=str(config.get("exp_name", "default")),
                               results_dir=str(config.get("results_dir", "results")),
                               figures_dir=str(config.get("figures_dir", "figures"))))
    except ConfigError as err:
        exit_bad_input(err)


def _say(line: str) -> None:
    """A line on stderr; a closed terminal (SIGHUP) must not turn a clean stop into a crash."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)

