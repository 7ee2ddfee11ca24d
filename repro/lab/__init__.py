"""The staleness classroom: exercises that grade themselves (``python -m repro.lab grade FILE``)
and an explorer with sliders in the browser (``python -m repro.lab explore``, :mod:`repro.lab.explore`).

Built on the public API (:mod:`repro.api`) alone: a student's class runs in the package's own
registries, plugged in under a temporary name for the length of one graded run.
"""
