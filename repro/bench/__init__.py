"""``python -m repro.bench``: the benchmarks' command, kept where users type it; the benchmarks
themselves live beside the library, in :mod:`repro_bench` (see :mod:`repro.bench.__main__`)."""
