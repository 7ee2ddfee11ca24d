"""The classroom: ``python -m repro.lab explore`` (sliders in a browser, :mod:`repro.lab.explore`)."""
