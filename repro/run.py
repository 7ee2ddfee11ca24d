"""Entry point: ``python -m repro.run [overrides]`` and ``python -m repro.run +exp=figN``.

This module does the Hydra work and nothing else: it checks the command line, composes the config,
parses it once into a :class:`~repro.config.RunConfig` (nothing below sees a ``DictConfig``), and
calls :func:`run`, a plain function ``run(config, run_dir) -> summary``. Bad input exits with
code 2 and a message naming the key, the bad value and the valid choices, before any work.

Under ``torchrun`` every rank enters here; only rank 0 goes through ``@hydra.main`` (and so makes
the run folder), the other ranks compose the same config without any output folder.
"""
from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from repro.config import RunConfig, from_dict
from repro.errors import EXIT_BAD_INPUT, ConfigError
from repro.runlog import is_finished, read_summary

log = logging.getLogger("repro")
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("data", "model", "algo", "cost", "backend", "exp")

# Run folders are named from the overrides; no overrides gives "base", not an empty name.
if not OmegaConf.has_resolver("job_name"):
    OmegaConf.register_new_resolver("job_name", lambda dirname: dirname or "base")


def parse(dcfg: DictConfig) -> RunConfig:
    """Resolve and validate the composed config (raises ConfigError)."""
    tree = OmegaConf.to_container(dcfg, resolve=True)
    tree.pop("hydra", None)
    return from_dict(tree)


def run(cfg: RunConfig, run_dir: str | Path) -> dict:
    """Train as configured, writing ``run_dir``; return the summary. Skips a finished run unless
    ``force``; ``resume`` continues one from its checkpoint."""
    run_dir = Path(run_dir)
    if is_finished(run_dir) and not cfg.force and not cfg.resume:
        summary = read_summary(run_dir)
        log.info("skip %s: already %s (force=true re-runs it)", run_dir, summary["status"])
        return summary
    if cfg.backend.name == "real":
        from repro.real import run_real

        return run_real(cfg, run_dir)
    from repro.sim import simulate

    return simulate(cfg, run_dir)


def _exit_bad_input(err: ConfigError, run_dir: Path | None = None) -> None:
    print(f"error: {err}", file=sys.stderr)
    # Hydra made the folder before we could check: leave nothing that looks like a run.
    if run_dir is not None and run_dir.exists() and not (run_dir / "config.json").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
    sys.exit(EXIT_BAD_INPUT)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(dcfg: DictConfig) -> float | None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        cfg = parse(dcfg)
        summary = run(cfg, run_dir)
    except ConfigError as err:
        _exit_bad_input(err, run_dir)
    final = summary.get("final", {})
    err = final.get("test_error")
    print(f"{summary['status']}: {run_dir}  version {summary['version']}  epoch {summary['epoch']:.2f}  "
          f"test error {'n/a' if err is None else f'{100 * err:.2f}%'}  "
          f"{summary['clock']} time {summary['time_s']:.2f}s  wall {summary['wall_time_s']:.1f}s",
          flush=True)
    if summary["status"] not in ("completed", "completed_degraded") and not HydraConfig.get().mode.name == "MULTIRUN":
        sys.exit(1)
    return err


def check_group_choices(argv: list[str]) -> None:
    """Hydra reports an unknown ``group=name`` with exit code 1; we want our message and 2."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in GROUPS:
            continue
        choices = sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml"))
        for v in value.split(","):
            if v not in choices:
                _exit_bad_input(ConfigError(key, v, choices))


def _torchrun_rank() -> int | None:
    """This process's rank when started by torchrun, else None (one definition: the driver's)."""
    from repro.real.launch import torchrun_env

    env = torchrun_env()
    return None if env is None else env.rank


def compose(overrides: list[str]) -> DictConfig:
    """The config as ``python -m repro.run OVERRIDES`` would compose it, without output folders."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def cli() -> None:
    argv = sys.argv[1:]
    check_group_choices(argv)
    rank = _torchrun_rank()
    if rank is not None and rank > 0:
        from repro.real import run_torchrun_worker

        try:
            cfg = parse(compose([a for a in argv if not a.startswith("hydra")]))
        except ConfigError as err:
            _exit_bad_input(err)
        sys.exit(run_torchrun_worker(cfg))
    main()


if __name__ == "__main__":
    cli()
