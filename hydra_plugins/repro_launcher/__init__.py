"""Hydra loads a launcher only from the ``hydra_plugins`` package: this is where
``hydra/launcher=parallel`` (conf/hydra/launcher/parallel.yaml) finds repro's grid launcher,
whose code lives in :mod:`repro.launcher`."""
from repro.launcher import PointsLauncher


class JoblibLauncher(PointsLauncher):
    """Hydra's joblib launcher, except that a worker that dies costs only its grid point
    (:mod:`repro.launcher`)."""
