"""The one place the library names :mod:`repro_bench`: runs its command line, never imported (docs/architecture.md)."""
import sys

from repro_bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
