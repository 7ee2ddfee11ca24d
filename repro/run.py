"""Entry point: ``python -m repro.run [overrides]`` and ``python -m repro.run +exp=NAME``: the Hydra work
alone. The command line is checked and the config composed and parsed into a RunConfig for :func:`run`;
a single run is validated once (:func:`precheck`) before Hydra makes a folder, a grid's points as each starts.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys


def _exit_now(signum, frame) -> None:
    """SIGINT before cli()'s own handlers (the imports below load for half a second): exit 130 at
    once. Not by SystemExit: raised inside an import it was swallowed (exit 0) or became a traceback."""
    with contextlib.suppress(Exception):   # what --help printed goes out first (not inside a write: reentrant)
        sys.stdout.flush()
    os._exit(130)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _exit_now)

import re
from pathlib import Path

import hydra
from hydra.errors import MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from repro.config import loader
from repro.config.checks import validate
from repro.config.renames import modern_override
from repro.config.loader import (CONF_DIR, check_folder_makeable, check_overrides, check_package, compose,
                               composition_line, exit_bad_input, owning_option, parse, parsed_overrides)
from repro.config.settings import RunConfig
from repro.errors import BAD_POINTS, EXIT_BAD_INPUT, ConfigError
from repro.files.storage import DISK_FAULTS, disk_error, is_read_only
from repro.hydra_internals import run_single_job, sweeps
from repro.logs import detach_files_in, get_logger, mark
from repro.runtime import (EXIT_INTERRUPTED, PR_SET_PDEATHSIG, StopRequest, exit_on_signal, fork_server_context,
                           named_by_world, prctl, torchrun_env)

log = get_logger("repro.run")
GRID = "repro.grid.Grid"   # a grid's progress, its Ctrl-C, its points' worker slots (conf/exp/shared/grid.yaml)
# the process that launches the grid (a worker's bad point exits 2, which costs only that point,
# repro.launcher). A pid, not a flag: a worker gets job() and its globals pickled by value (it is __main__'s)
_launcher_pid: int | None = None


if not OmegaConf.has_resolver("job_name"):
    OmegaConf.register_new_resolver("job_name", lambda overrides: loader.job_name(list(overrides)))
if not OmegaConf.has_resolver("hydra_record"):   # the Hydra record's folder, this process's own
    OmegaConf.register_new_resolver("hydra_record", lambda run_dir: str(_incoming_record(run_dir)))


def _incoming_record(run_dir):
    from repro.runs.folder import HYDRA_RECORD, incoming_record   # only once a job runs or shows: not for --help
    return incoming_record(run_dir) if run_dir else HYDRA_RECORD   # no job (--cfg all --resolve): where it ends


def resolve(cfg: RunConfig, run_dir: str | Path | None = None, typed: list[str] = ()):
    """The one resolve step, before any driver runs: ``cost=replay`` becomes the recorded run's settings
    (``typed``, the job's overrides, must not say otherwise), ``cost=fit`` the fitted costs, and under
    torchrun the world decides ``num_clients``; a rewritten config is validated. ConfigError: exit 2."""
    if cfg.backend.name == "real":
        if (env := torchrun_env()) is None:
            return cfg
        from repro.real.launch import world_config
        resolved = world_config(cfg, env)
    else:
        from repro.sim.driver import resolve as resolve_sim
        from repro.sim.replay import refuse_typed
        refuse_typed(typed, cfg, (resolved := resolve_sim(cfg, run_dir)).cfg)
    rewritten = getattr(resolved, "cfg", resolved)
    if rewritten is not cfg:   # torchrun's world, a replay, a fit: e.g. backup workers vs clients
        validate(rewritten)
    return resolved


def run(cfg: RunConfig, run_dir: str | Path, typed: list[str] = ()) -> dict:
    """Train as configured, writing ``run_dir``; return the summary. What a folder already holding a run
    means is the run core's to decide (:func:`repro.runs.folder.run_folder`)."""
    resolved = resolve(cfg, run_dir, typed)
    if cfg.backend.name == "real":
        from repro.real.launch import run_real
        return run_real(resolved, run_dir)
    from repro.sim.driver import simulate
    return simulate(resolved, run_dir)


def pasteable(path: str | Path) -> str:
    """``path`` as it pastes after ``key=`` on a shell command line (Hydra reads ``=`` and ``,`` as syntax:
    single quotes inside double quotes), relative to the current folder when inside it."""
    with contextlib.suppress(OSError, ValueError):   # outside this folder (or no current folder): as it is
        path = Path(path).relative_to(os.getcwd())
    text = str(path)
    return text if re.fullmatch(r"[\w./@%+-]+", text) else "\"'" + text + "'\""


def last_lines(summary: dict, run_dir: Path, loss_only: bool = False) -> str:
    """The run's last two lines: its status and final numbers (the test loss where ``loss_only``), with
    the summary's message for a diverged or completed run, then its folder."""
    key = "test_loss" if loss_only else "test_error"
    value = (summary.get("final") or {}).get(key)
    shown = "n/a" if value is None else f"{value:.4g}" if loss_only else f"{100 * value:.2f}%"
    if summary.get("clock") == "virtual":
        times = f"virtual time {summary['time_s']:.2f} s, wall {summary['wall_time_s']:.1f} s"
    else:   # wall clock: time_s runs from the first fetch, wall_time_s includes start-up
        times = f"wall time {summary['time_s']:.1f} s training, {summary['wall_time_s']:.1f} s with start-up"
    note = summary.get("message") if summary["status"] in ("completed", "diverged") else ""
    return (f"{summary['status']}: version {summary['version']}  epoch {summary['epoch']:.2f}  "
            f"{key.replace('_', ' ')} {shown}  {times}" + (f"; {note}" if note else "") + "\n"
            f"run folder: {pasteable(run_dir)}")


def job(dcfg: DictConfig, cfg: RunConfig | None = None) -> float | None:
    """One run in the folder Hydra made for it: ``cfg`` is the config the command line parsed
    (a single run), or None for a grid point, parsed here from Hydra's ``dcfg``."""
    # Hydra's public resolver for its own settings: this job's folder, single run or grid, the typed overrides
    mode = OmegaConf.create({"dir": "${hydra:runtime.output_dir}", "mode": "${hydra:mode}",
                             "typed": "${hydra:overrides.task}"})
    run_dir = Path(mode.dir)
    if is_read_only(run_dir):   # a finished run is only skipped there: no run.log either
        detach_files_in(run_dir)
    try:
        summary = None
        if cfg is None:   # a grid point: a finished one is skipped before torch loads
            from repro.runs.folder import finished
            cfg = parse(dcfg)
            summary = finished(cfg, run_dir)
            if summary is None:
                from repro.workload.build import check_components   # torch: not for --help nor bad input
                check_components(cfg)
        mark("main", "config parsed")
        summary = summary or run(cfg, run_dir, list(mode.typed))
    except ConfigError as err:
        from repro.gridpoint import remove_empty_run_dir
        remove_empty_run_dir(run_dir.resolve(), Path(str(dcfg.get("results_dir", "results"))).resolve())
        if "MULTIRUN" in str(mode.mode):
            print(f"error: grid point {run_dir.name} not run: {err}", file=sys.stderr, flush=True)
            if os.getpid() != _launcher_pid:   # a worker's point (repro.launcher: it costs only itself)
                refused = SystemExit(EXIT_BAD_INPUT)
                refused.point = run_dir.name   # for the launcher's last line
                raise refused
            BAD_POINTS.append(run_dir.name)   # the grid goes on; cli exits 2 after it
            return None
        exit_bad_input(err)
    except OSError as err:
        if err.errno not in DISK_FAULTS or "MULTIRUN" in str(mode.mode):
            raise
        # a full or read-only disk: one line naming the folder, not a traceback (run.log's raw error too)
        print(f"failed: {disk_error(err, err.filename).strerror}\nrun folder: {pasteable(run_dir)}",
              file=sys.stderr, flush=True)
        sys.exit(1)
    from repro.workload.data import DATASETS
    # a problem whose test error means nothing (the quadratic): its loss is what to show
    loss_only = cfg.data.name in DATASETS and DATASETS[cfg.data.name].task != "classification"
    status_line, folder_line = last_lines(summary, run_dir, loss_only).splitlines()
    log.info(status_line)
    print(folder_line, flush=True)
    if summary["status"] not in ("completed", "completed_degraded") and "MULTIRUN" not in str(mode.mode):
        sys.exit(EXIT_INTERRUPTED if summary["status"] == "interrupted" else 1)
    return (summary.get("final") or {}).get("test_error")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(dcfg: DictConfig) -> float | None:
    """Hydra's entry: a grid's points, and a command line with Hydra's own flags."""
    return job(dcfg)


def run_composed(dcfg: DictConfig, cfg: RunConfig) -> None:
    """A single run of the config the command line composed and parsed once (``dcfg`` with Hydra's node,
    ``cfg`` its RunConfig), as ``@hydra.main`` would run it, without composing again."""
    run_single_job(dcfg, lambda: job(dcfg, cfg))


# -- the command line (its words are checked before Hydra sees them: repro.config.loader) ----------------

def _is_sweep(argv: list[str]) -> bool:
    if any(a in ("-m", "--multirun") for a in argv):
        return True
    try:   # Hydra's own parser: a list [1,2] or a quoted 'a,b' holds a comma but sweeps nothing
        return sweeps([a for a in argv if "=" in a and not a.startswith(("-", "hydra"))])
    except OverrideParseException:   # Hydra's message comes where the config is composed
        return False


def _flags_last(argv: list[str]) -> list[str]:
    """The overrides, then Hydra's flags with their values: its parser takes the overrides as one run of
    words (flags last: ``--info``'s value is optional, and an override after it would be taken for one)."""
    is_flag = [w.startswith("-") or (i > 0 and argv[i - 1] in loader.VALUE_FLAGS and "=" not in w)
               for i, w in enumerate(argv)]
    return [w for w, f in zip(argv, is_flag) if not f] + [w for w, f in zip(argv, is_flag) if f]


def _one_value_overrides(argv: list[str]) -> list[str]:
    """The overrides that set one value (a grid's sweeps left out): what composes one config."""
    return [a for a in argv if "=" in a and not a.startswith("-") and not _is_sweep([a])]


def precheck(argv: list[str]) -> tuple[DictConfig, RunConfig] | None:
    """A single run's whole config, composed once and validated before Hydra makes a folder (the model
    against the data last: it imports torch), returned with Hydra's node for :func:`run_composed`. For
    a grid, only its folder (``hydra.sweep.dir``) is checked here, then None: its points as each starts."""
    if _is_sweep(argv):
        try:   # the grid's folder, from the overrides that set one value (Hydra judges the rest)
            dcfg = compose(_one_value_overrides(argv), return_hydra_config=True)
        except Exception as exc:   # a key that only a swept option has: Hydra judges it point by point
            if isinstance(exc, (MissingConfigException, OverrideParseException)) \
                    or "'hydra." in str(exc).partition("\n")[0]:   # choice(): Hydra's 5 lines, exit 1
                exit_bad_input(composition_line(exc))   # every point's (Hydra: 7 to 14 lines, exit 1)
            return None
        _refuse_run_of_grid(argv, dcfg)
        if "-m" not in argv and "--multirun" not in argv and dcfg.hydra.mode != RunMode.MULTIRUN:
            sweep = next(a for a in argv if "=" in a and _is_sweep([a]))   # Hydra: exit 1, five lines
            exit_bad_input(f"'{sweep}' is a sweep: add -m to run one run per value (a list is "
                           f"KEY=[A,B], a text with a comma KEY='A,B')")
        check_folder_makeable(dcfg, grid=True)
        if "grid" not in (dcfg.hydra.get("callbacks") or {}):   # a plain -m: Ctrl-C started every later
            sys.argv.insert(1, f"+hydra.callbacks.grid._target_={GRID}")   # point ('interrupted'), exit 0
        return None
    dcfg = _composed([a for a in argv if "=" in a and not a.startswith("-")], return_hydra_config=True)
    _refuse_run_of_grid(argv, dcfg)
    try:   # the settings without Hydra's node (its ${hydra:...} need a job)
        cfg = parse(OmegaConf.masked_copy(dcfg, [k for k in dcfg if k != "hydra"]))
        if loader.SHOWS & set(argv):   # Hydra prints the config (the node --package names: there) or its help
            return check_package(argv, dcfg, exit_bad_input), cfg
        check_folder_makeable(dcfg, grid=dcfg.hydra.mode == RunMode.MULTIRUN)   # before the components: no torch
        from repro.workload.build import check_components   # the model and batch vs the data (torch)
        check_components(cfg)
    except ConfigError as err:
        exit_bad_input(err)
    return dcfg, cfg


def _composed(overrides: list[str], **kwargs) -> DictConfig:
    """Hydra's composition of ``overrides``; its error is bad input, one line (exit 2): a run's,
    a joiner's (backend.join=[::1]:PORT) or a torchrun worker's command line alike."""
    try:
        return compose(overrides, **kwargs)
    except Exception as exc:   # Hydra's composition error, e.g. a real-only key under backend=sim
        key = next((k for _, k, _ in parsed_overrides(overrides) if f"'{k}'" in str(exc)), None)
        owner = owning_option(key) if key else None   # else exp_name=é, a(b: with how to quote a value
        exit_bad_input(f"'{key}' is a setting of {owner}: add {owner} to use it" if owner else composition_line(exc))


def _refuse_run_of_grid(argv: list[str], dcfg: DictConfig) -> None:
    """``--run +exp=fig1``: Hydra ran the whole grid all the same (its file sets hydra.mode=MULTIRUN)."""
    if ("--run" in argv or "-r" in argv) and dcfg.hydra.mode == RunMode.MULTIRUN:
        exp = dcfg.hydra.runtime.choices.get("exp")
        keys = ", ".join(dcfg.hydra.sweeper.get("params") or {}) or "its sweeps"
        exit_bad_input(f"--run: {f'+exp={exp}' if exp else 'hydra.mode=MULTIRUN'} is a grid: leave out --run "
                       f"to run the whole grid, or run one point with hydra.mode=RUN and one value of {keys}")


def _parsed(argv: list[str], resolved: bool = False) -> RunConfig:
    """The config the command line's overrides give (``resolved``: after :func:`resolve`), parsed outside
    Hydra's job (a joining client, a torchrun worker: neither makes a run folder); bad input exits 2."""
    try:
        cfg = parse(_composed([a for a in argv if "=" in a and not a.startswith(("hydra", "-"))]))
        return resolve(cfg) if resolved else cfg
    except ConfigError as err:
        exit_bad_input(err)


def cli() -> None:
    mark("main", "imported")
    sys.argv[1:] = argv = _flags_last([modern_override(a) for a in sys.argv[1:]])   # Hydra's main reads sys.argv
    check_overrides(argv)
    if "--hydra-help" in argv:   # Hydra composes its help without our config: a key of ours was its traceback
        sys.argv[1:] = [a for a in argv if "=" not in a or a.lstrip("+~").startswith("hydra")]
    if "--help" in argv or "-h" in argv:
        dcfg = compose(_one_value_overrides(argv), return_hydra_config=True)
        choices = {g: str(dcfg.hydra.runtime.choices.get(g)) for g in loader.ALL_GROUPS}
        tree = OmegaConf.to_container(OmegaConf.masked_copy(dcfg, [k for k in dcfg if k != "hydra"]))
        print(loader.help_text(tree, choices))
        return
    if "--version" in argv:   # Hydra's own answer was "Hydra 1.3.8" alone
        from repro import __version__
        print(f"gpu-asgd-repro {__version__} (Hydra {hydra.__version__})")
        return
    try:
        env = torchrun_env()
    except ConfigError as err:
        exit_bad_input(err)
    if env is not None:
        # a rank or joiner ends with its torchrun agent: a SIGKILLed torchrun signals no worker, and they
        # trained on headless. Each later thread inherits the setting and signals of its own, so SIGUSR1 is
        # one SIGTERM, torchrun's own stop (a second forces): rank 0 checkpoints, a joiner leaves
        told: list[int] = []
        signal.signal(signal.SIGUSR1, lambda *_: told or told.append(1) or signal.raise_signal(signal.SIGTERM))
        prctl(PR_SET_PDEATHSIG, signal.SIGUSR1)
    if any(a.lstrip("+").startswith("backend.join=") and not a.endswith("=null") for a in argv):
        # before torch loads (it reads this once): at a listener that answers as no run does (a
        # web server) TCPStore retries until backend.timeout_s, printing a C++ stack per try
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
        from repro.real.elastic import join_process   # one more client for a running run
        join_process(_parsed(argv))   # exits
    if env is not None and env.rank > 0:
        from repro.real.launch import run_torchrun_worker
        sys.exit(run_torchrun_worker(_parsed(argv, resolved=True)))
    typed = {}   # rank 0's num_clients as configured: the job's resolve step logs the world's (run.log)
    if env is not None and (configured := _parsed(argv)).backend.name == "real":
        try:   # the world's refusals (WORLD_SIZE, torchrun's address) before Hydra makes a folder
            resolve(configured.replace(num_clients=env.world_size - 1))   # (its line: the job's)
        except ConfigError as err:
            exit_bad_input(err)
        sys.argv[1:] = argv = named_by_world(argv, configured.num_clients, env.world_size - 1)
        typed["num_clients"] = configured.num_clients
    # one StopRequest for the process's life: a second signal forces (exit 130) wherever it lands,
    # also after the run has ended, and during the interpreter's shutdown
    try:
        with StopRequest():
            try:
                # a single real run's fork server imports torch while we check the config, not after
                if "backend=real" in argv and not _is_sweep(argv) and torchrun_env() is None:
                    fork_server_context(start=True)
                checked = precheck(argv)
                hydra_flags = any(a.startswith("-") for a in argv)   # --cfg job, --info, -m
                if checked is None or hydra_flags or checked[0].hydra.mode == RunMode.MULTIRUN:
                    global _launcher_pid
                    _launcher_pid = os.getpid()
                    main()   # a grid (+exp=NAME's own mode included), or Hydra's flags: Hydra's path
                    if BAD_POINTS:
                        exit_bad_input(f"{len(BAD_POINTS)} grid point(s) not run, named above: "
                                       + "; ".join(BAD_POINTS))
                else:
                    run_composed(checked[0], checked[1].replace(**typed) if typed else checked[1])   # (validated)
            except KeyboardInterrupt:
                sys.exit(EXIT_INTERRUPTED)
    finally:
        exit_on_signal()


if __name__ == "__main__":
    cli()
