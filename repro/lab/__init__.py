"""The staleness classroom: exercises that grade themselves (``python -m repro.lab grade FILE``).

Built on the public API (:mod:`repro.api`) alone: a student's class runs in the package's own
registries, plugged in under a temporary name for the length of one graded run.
"""
