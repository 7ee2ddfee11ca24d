"""``python -m repro.bench ...`` runs :mod:`repro_bench`'s command line: the one place the library names
``repro_bench``, only ever run, never imported (why: docs/architecture.md)."""
import sys

from repro_bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
