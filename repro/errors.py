"""Errors users see: bad configuration or bad input data.

Every check that rejects user input raises :class:`ConfigError`, which names the key, the bad value
and what would have been valid. The entry point turns it into a one-paragraph message and exit
code 2 before any process starts or any run folder is marked complete.
"""
from __future__ import annotations

from typing import Any, Iterable


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

# the grid points refused as bad input, named in the process that launches the grid: the points
# it runs itself (repro.run.job) and a worker's, which exits 2 with ``point`` set (repro.launcher)
BAD_POINTS: list[str] = []


