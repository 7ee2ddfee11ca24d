"""The instruments: what measures the simulator against real runs, kept apart from the library.

The library (``repro.asgd``, ``workload``, ``runs``, ``sim``, ``real``, ``analysis``...)
trains, simulates and draws; this package holds it up against reality, as an experiment's
instruments sit beside the apparatus (torchtitan's ``experiments/``): it imports the library and
the library never imports it, so none of its two-host plumbing, core sampling or re-simulation can
leak into a run, and the analysis stays a package that only reads.

* :mod:`.hosts`     -- two hosts on one machine: network namespaces, a tbf-limited veth pair;
* :mod:`.two_hosts` -- the real driver across them (``torchrun --nnodes=2``), its stop and end;
* :mod:`.simreal`   -- ``+exp=sim_vs_real``'s pipeline after its grid (the Hydra callback);
* :mod:`.points`    -- the experiment's tree read into runs and grid points, its figure;
* :mod:`.accuracy`  -- the five numbers: MAPE, worst point, bias, Kendall's tau, time to target;
* :mod:`.spread`    -- the staleness spread, by re-simulating points (``--spread``);
* :mod:`.cores`     -- where a real run's cores go (``--cores``);
* :mod:`.cli`       -- ``python -m repro.bench simreal``'s options and report.

Reached from outside in two places only, both entry points: ``conf/exp/sim_vs_real.yaml`` names
:class:`.simreal.SimVsReal` as its callback, and :mod:`repro_bench.__main__` (``python -m repro.bench``) mounts :mod:`.cli`
as the ``simreal`` subcommand (``tests/test_house.py`` checks that nothing else imports it).
"""
