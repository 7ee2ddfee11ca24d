"""Errors users see: every check that rejects user input raises :class:`ConfigError`, naming the key,
the bad value and what would be valid; the entry point makes it one paragraph and exit code 2.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable


class ConfigError(ValueError):
    """A configuration value (or an input file a value points to) is unusable."""

    def __init__(self, key: str, value: Any, expected: str | Iterable[Any]):
        if not isinstance(expected, str):
            expected = "one of: " + ", ".join(repr(c) for c in expected)
        self.key, self.value, self.expected = key, value, expected
        super().__init__(f"invalid value for '{key}': {value!r}; expected {expected}")


class DataError(ConfigError):
    """A data set's files are missing, truncated or malformed."""


EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130   # 128 + SIGINT, as a shell reports a Ctrl-C'd command

# the grid points refused as bad input, named in the process that launches the grid: the points
# it runs itself (repro.run.job) and a worker's, which exits 2 with ``point`` set (repro.launcher)
BAD_POINTS: list[str] = []


def numbers(name: str, value: Any, accepted: str, ok: Callable, scalar: bool = False, integer: bool = False):
    """``value`` as a numpy array of real numbers (a bool or a text is none), at least one, each finite
    and ``ok`` (``ok(array)`` -> booleans; ``scalar``: one number); else a ConfigError naming ``name``
    and what is ``accepted``. The check for numbers a Python caller hands a function."""
    import numpy as np   # here: the command line's --help and config errors load no numpy
    with contextlib.suppress(ValueError, TypeError):   # a ragged list, a tensor on a GPU: refused
        array = np.asarray(value)
        if array.dtype.kind in ("iu" if integer else "iuf") and array.size and not (scalar and array.ndim) \
                and np.all(np.isfinite(array) & ok(array)):
            return array
    raise ConfigError(name, value, accepted)
