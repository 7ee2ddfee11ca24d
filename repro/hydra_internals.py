"""The one place where repro uses Hydra beyond its public interface (``hydra.core``, ``hydra._internal``,
which tests/test_house.py keeps out of every other module): which code, and why.

* the job list before any point runs (:func:`sweep_jobs`, :func:`job_folders`): Hydra gives it to the
  launcher alone, and the progress line, the figure and the refusal of two points of one folder need it;
  whether an override sweeps and the values it gives (:func:`sweeps`, :func:`override_values`,
  :func:`named_options`, :func:`plain_number`), in Hydra's grammar, not a guess at it;
* a point whose worker died still returns (:func:`job_return`): a missing ``JobReturn`` ends the grid;
* Hydra's flags and ``--package`` answered in one line (:func:`check_flags`, :func:`check_package`), and
  a key set under a null node named (:func:`null_node_named`): not a usage text, exit 1 or traceback;
* a single run composed once (:func:`run_single_job`): Hydra 1.3 has no public equivalent of what its
  main does after composing.

Every import of Hydra's internals sits inside a function: importing this module costs nothing.
"""
from __future__ import annotations

import copy
import re
from typing import Any, Callable


def run_single_job(dcfg: Any, task: Callable[[], Any]) -> None:
    """Run ``task`` as Hydra's main runs a single job of ``dcfg`` (composed with its Hydra node):
    Hydra's logging, its callbacks around the job, the job in ``hydra.run.dir``."""
    import logging
    import hydra._internal.hydra as main
    from hydra import initialize_config_dir
    from hydra._internal.callbacks import Callbacks   # the aggregate Hydra.run builds (hydra 1.3)
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import read_write
    from repro.logs import follow_verbose
    configure_log(dcfg.hydra.hydra_logging, dcfg.hydra.verbose)
    main.log = logging.getLogger(main.__name__)   # as Hydra.compose_config sets it
    if main.log.isEnabledFor(logging.DEBUG):   # hydra.verbose=true: what Hydra's main logs once it has composed
        conf = next(s.path for s in dcfg.hydra.runtime.config_sources if s.provider == "main")
        with initialize_config_dir(config_dir=conf, version_base="1.3", job_name=dcfg.hydra.job.name):
            overrides = [*dcfg.hydra.overrides.hydra, *dcfg.hydra.overrides.task]
            GlobalHydra.instance().hydra._print_debug_info("config", overrides, RunMode.RUN)
    with read_write(dcfg.hydra):   # as Hydra's main records a single run in .hydra/hydra.yaml
        dcfg.hydra.mode = RunMode.RUN
        dcfg.hydra.overrides.hydra.append("hydra.mode=RUN")
    callbacks = Callbacks(dcfg)
    callbacks.on_run_start(config=dcfg, config_name="config")
    ret = run_job(task_function=lambda _: follow_verbose(dcfg.hydra.verbose) or task(),   # (logging configured)
                  config=dcfg, job_dir_key="hydra.run.dir", job_subdir_key=None,
                  hydra_context=HydraContext(config_loader=None, callbacks=callbacks))
    callbacks.on_run_end(config=dcfg, config_name="config", job_return=ret)
    _ = ret.return_value   # re-raises what the job raised


def sweep_jobs(config: Any) -> list[list[str]] | None:
    """Each job's overrides, in launch order, for a config composed with its Hydra node; None when a
    sweeper other than Hydra's basic one decides the jobs."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    if not str(config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    hydra = GlobalHydra.instance()   # the sweeper's config loader: a glob(*) of a group's options reads it
    loader = hydra.config_loader() if hydra.is_initialized() else None
    overrides = OverridesParser.create(config_loader=loader).parse_overrides(arguments)
    return BasicSweeper.split_arguments(overrides, max_batch_size=None)[0]   # the basic sweeper's own split


def job_folders(config: Any, jobs: list[list[str]]) -> list[str]:
    """Each job's folder as the launcher names it (``hydra.sweep.dir``/``hydra.sweep.subdir``), from the
    job's own config composed as the launcher composes it, its number too."""
    import os
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict
    loader, before, folders = GlobalHydra.instance().config_loader(), HydraConfig.instance().cfg, []
    try:
        for num, job in enumerate(jobs):
            cfg = loader.load_sweep_config(config, list(job))
            with open_dict(cfg):
                cfg.hydra.job.id = cfg.hydra.job.num = num
            HydraConfig.instance().set_config(cfg)   # resolves ${hydra:...}, as the launcher's run_job
            folders.append(os.path.join(str(OmegaConf.select(cfg, "hydra.sweep.dir")),
                                        str(OmegaConf.select(cfg, "hydra.sweep.subdir"))))
    finally:
        HydraConfig.instance().cfg = before
    return folders


def sweeps(arguments: list[str]) -> bool:
    """Whether any of the override ``arguments`` is a sweep (``nsync=1,2``, ``range(1,3)``) as
    Hydra's parser reads it: a list ``[1,2]`` or a quoted ``'a,b'`` is not. Raises Hydra's
    OverrideParseException for an argument its grammar cannot read."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    return any(o.is_sweep_override() for o in OverridesParser.create().parse_overrides(arguments))


def override_values(job: list[str]) -> dict[str, Any]:
    """{key: value} of a job's overrides as Hydra's parser reads them: quotes and escapes undone
    (``results_dir='/a,b'`` is ``/a,b``), a key's ``+`` or ``~`` dropped."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    return {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(job)}


def named_options(override: str) -> list[str] | None:
    """The values ``KEY=VALUE`` gives its key, as Hydra's parser reads them: ``a,b``, ``a, b`` and
    ``choice(a,b)`` each give a and b; None for a glob, which picks among the options there are.
    What its grammar cannot read is split at its commas (Hydra's composition answers it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    try:
        parsed = OverridesParser.create().parse_override(override)
        if parsed.value_type == ValueType.GLOB_CHOICE_SWEEP:
            return None
        return list(parsed.sweep_string_iterator()) if parsed.is_sweep_override() else [
            parsed.get_value_element_as_str()]
    except Exception:   # OverrideParseException, or a sweep that cannot be listed (interval)
        return override.partition("=")[2].split(",")


def plain_number(override: str) -> str:
    """The value of ``override`` as Hydra's sweeper writes a grid point's where it is a number, so a single
    run names its folder as the grid point does (``0`` for ``-0``, ``0.001`` for ``1e-3``, ``1e-05`` for
    ``1e-5``); any other value, a sweep and what Hydra's grammar cannot read stay as given."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException
    given = override.partition("=")[2]
    try:
        parsed = OverridesParser.create().parse_override(override)
    except OverrideParseException:
        return given
    value = None if parsed.is_sweep_override() else parsed.value()
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else given


def check_flags(argv: list[str], refuse: Callable[[str], Any]) -> None:
    """Parse ``argv`` with Hydra's own argument parser, handing its complaint to ``refuse``
    (argparse printed nine lines of usage under the name run.py). ``--version`` is left out:
    its action would answer and exit."""
    from hydra._internal.utils import get_args_parser
    parser = get_args_parser()
    parser.error = refuse
    args = parser.parse_args([word for word in argv if word != "--version"])
    if args.cfg == "hydra" and args.resolve:   # Hydra resolves its node cut from the config it names
        refuse("--cfg hydra --resolve: Hydra's node names its folders from keys outside it (results_dir, "
               "exp_name); --cfg all --resolve --package hydra shows it resolved")


def check_package(argv: list[str], dcfg: Any, refuse: Callable[[str], Any]) -> Any:
    """``--cfg TYPE --package NODE``: NODE must be a node of the config TYPE shows (``dcfg``), neither null
    nor missing (Hydra: exit 1), and a value shown alone must resolve as Hydra's show_cfg resolves it.
    Returns ``dcfg``."""
    from hydra._internal.utils import get_args_parser
    from omegaconf import OmegaConf
    args, absent = get_args_parser().parse_args([word for word in argv if word != "--version"]), object()
    if not args.cfg or args.package in (None, "_global_"):
        return dcfg
    shown = OmegaConf.masked_copy(dcfg, [k for k in dcfg if k != "hydra" or args.cfg == "all"])
    if args.cfg == "hydra":   # without its help texts, as Hydra shows it (Hydra.get_sanitized_hydra_cfg)
        sanitized = [k for k in dcfg.hydra if "help" not in k]
        shown = OmegaConf.create({"hydra": OmegaConf.masked_copy(dcfg.hydra, sanitized)})
    parent, _, last = args.package.rpartition(".")
    node = OmegaConf.select(shown, parent, default=None) if parent else shown
    tree = OmegaConf.to_container(node) if OmegaConf.is_config(node) else {}
    if isinstance(tree, list):   # a list's element by its index (hydra.overrides.task.0)
        tree = dict(enumerate(tree))
        last = int(last) if last.isdigit() else last
    value = tree.get(last, absent)
    if value is absent or value is None or value == "???":   # (???: a job's, e.g. hydra.runtime.output_dir)
        refuse(f"-p/--package {args.package}: " + (f"null in the config --cfg {args.cfg} shows (Hydra cannot show a "
               f"null alone; -p {parent} shows it)" if value is None else "set by Hydra only as a run starts: no "
               "value to show before" if value == "???" else f"not a node of the config --cfg "
               f"{args.cfg} shows (--cfg {args.cfg} without --package shows all of it)"))
    # Hydra resolves a value it shows alone: one naming keys outside the config shown is its KeyError, exit 1
    # (hydra.run.dir names results_dir); ${hydra:...} and ${resolver:...} are no keys
    outside = sorted({key for key in re.findall(r"\$\{(\w[\w.]*)\}", value) if key.split(".")[0] not in shown}
                     if isinstance(value, str) else ())
    if outside:
        refuse(f"-p/--package {args.package}: its value names {', '.join(outside)}, outside the config --cfg "
               f"{args.cfg} shows; --cfg all -p {args.package} shows it")
    if isinstance(value, str) and "${" in value:   # one naming a value a run sets (output_dir): its traceback
        from hydra.core.hydra_config import HydraConfig
        before = HydraConfig.instance().cfg
        try:
            HydraConfig.instance().set_config(copy.deepcopy(dcfg))   # as Hydra's show_cfg: ${hydra:...} resolve
            OmegaConf.select(shown, args.package)
        except Exception as exc:
            refuse(f"-p/--package {args.package}: its value {value} cannot be resolved before a run "
                   f"({str(exc).splitlines()[0]}); --cfg {args.cfg} " + (f"-p {parent}" if parent else
                   "without --package") + " shows it unresolved")
        finally:
            HydraConfig.instance().cfg = before
    return dcfg


def job_return(exited: SystemExit | None = None) -> Any:
    """What Hydra's launcher hands back for a point that never returned: its worker died
    (``exited`` None: an ended job) or it exited (status 0: ended; else failed, and Hydra raises
    the exit once every other point has run)."""
    from hydra.core.utils import JobReturn, JobStatus
    if exited is None or exited.code in (0, None):
        return JobReturn(status=JobStatus.COMPLETED)
    return JobReturn(status=JobStatus.FAILED, _return_value=exited)


def null_node_named(compose: Any, overrides: list[str]) -> Any:
    """``compose(overrides)``; OmegaConf's bare AssertionError for a key set under a null node
    becomes a ValueError naming the override that raises it alone (traceback, exit 1, in a grid)."""
    try:
        return compose(overrides)
    except AssertionError:
        for override in overrides:
            try:
                compose([override])
            except AssertionError:
                raise ValueError(f"'{override.partition('=')[0].lstrip('+~')}' is set under a node that is null "
                                 "here, as hydra.sweeper.params is without an experiment's grid (a grid "
                                 "sweeps KEY=A,B with -m)") from None
            except Exception:   # another override's own error: not this one
                pass
        raise
