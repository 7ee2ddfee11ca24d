"""``python -m repro.bench``: the benchmarks' command; the benchmarks live in :mod:`repro_bench`."""
