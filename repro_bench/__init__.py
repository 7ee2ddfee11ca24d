"""What measures the library, beside it: the benchmarks (``python -m repro.bench
{sim,real,grid,simreal,startup}``, or ``python -m repro_bench``: :mod:`repro_bench.__main__`), each
printing ratios measured in one run, and the sim-vs-real instruments (:mod:`.instruments`), which
the command line alone reaches. This package imports ``repro``; ``repro`` never imports it (its
one shim, :mod:`repro.bench.__main__`, only runs the command line)."""
