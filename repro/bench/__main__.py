"""``python -m repro.bench ...`` runs :mod:`repro_bench`'s command line, unchanged.

What measures the library lives beside it, importing it and never imported by it (as PyTorch
keeps ``benchmarks/`` beside ``torch/``), so the benchmarks and the instruments are the package
:mod:`repro_bench`. The command users type (README, docs, tests) stays ``python -m repro.bench``:
this shim is the one place the library names ``repro_bench``, and it is only ever run, never
imported by the library (``tests/test_house.py`` checks both).
"""
import sys

from repro_bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
