"""The instruments: what measures the simulator against real runs, kept apart from the library.

The library (``repro.asgd``, ``workload``, ``runs``, ``sim``, ``real``, ``analysis``...)
trains, simulates and draws; this package holds it up against reality, as an experiment's
instruments sit beside the apparatus (torchtitan's ``experiments/``): it imports the library and
the library never imports it, so none of its two-host plumbing, core sampling or re-simulation can
leak into a run, and the analysis stays a package that only reads. Its modules, one line each:
docs/architecture.md, "Layout".

Reached from outside in two places only, both entry points: ``conf/exp/sim_vs_real.yaml`` names
:class:`.simreal.SimVsReal` as its callback, and :mod:`repro_bench.__main__` (``python -m
repro.bench``) mounts :mod:`.cli` as the ``simreal`` subcommand (``tests/test_house.py`` checks
that nothing else imports it).
"""

# the experiment they measure (+exp=sim_vs_real), named here, where the command line's --help
# finds it without importing the experiment's callback (Hydra; pandas through .points)
EXP = "sim_vs_real"
