"""The one place where repro uses Hydra beyond its public interface: which code, and why.

A grid is Hydra's own: its sweep (``hydra.sweeper.params``, the command line's ``a,b``), its
launcher plugins (``basic``, ``joblib``, ``submitit``) and its callbacks, all public. Two of the
grid's guarantees need two things Hydra keeps for its plugins (``hydra.core``), imported here only:

* **The job list, before any point runs** (:func:`sweep_jobs`): the progress line counts the
  points not yet started, the figure is drawn from this grid's own points, and the sim-vs-real
  experiment names each point's folders. Hydra's basic sweeper hands that list to the launcher
  alone, so it is expanded here as that sweeper expands it (each override's values, the product
  in their order, a later override of a key in its earlier place), with Hydra's own override
  parser (``hydra.core.override_parser``), so that every sweep syntax Hydra takes is read alike.
* **A point whose worker died still returns** (:func:`job_return`): Hydra's launchers hand back
  one ``hydra.core.utils.JobReturn`` per point, and a missing one ends the whole grid. A point
  killed by the out-of-memory killer costs only itself (:mod:`repro.launcher`): it is reported
  as a job that ended, and ``resume=auto`` continues it.
"""
from __future__ import annotations

import itertools
from typing import Any


def sweep_jobs(config: Any) -> list[list[str]] | None:
    """Each job's overrides, in launch order, for a config composed with its Hydra node (the
    experiment's ``hydra.sweeper.params`` first, then the command line's overrides); None when a
    sweeper other than Hydra's basic one decides the jobs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not str(config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    axes: dict[str, list[str]] = {}
    for override in OverridesParser.create().parse_overrides(arguments):
        key = override.get_key_element()
        values = (override.sweep_string_iterator() if override.is_sweep_override()
                  else [override.get_value_element_as_str()])
        axes[key] = [f"{key}={value}" for value in values]
    return [list(job) for job in itertools.product(*axes.values())]


def job_return(exited: SystemExit | None = None) -> Any:
    """What Hydra's launcher hands back for a point that never returned: its worker died
    (``exited`` None: an ended job) or it exited (status 0: ended; else failed, and Hydra raises
    the exit once every other point has run)."""
    from hydra.core.utils import JobReturn, JobStatus

    if exited is None or exited.code in (0, None):
        return JobReturn(status=JobStatus.COMPLETED)
    return JobReturn(status=JobStatus.FAILED, _return_value=exited)


__all__ = ["job_return", "sweep_jobs"]
