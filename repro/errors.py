"""Errors users see: bad configuration or bad input data.

Every check that rejects user input raises :class:`ConfigError`, which names the key, the bad value
and what would have been valid. The entry point turns it into a one-paragraph message and exit
code 2 before any process starts or any run folder is marked complete.
"""
from __future__ import annotations

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


def positive(kind: type, allow_zero: bool = False) -> Callable[[str], Any]:
    """An argparse type: ``kind`` (int or float) > 0 (or >= 0 with ``allow_zero``; never nan), so
    a bad value is a usage error (exit 2), not a traceback minutes into a run. Here, below every
    command line, because the benchmarks and the instruments (:mod:`repro_bench.instruments`) both use it
    and neither may import the other's package."""
    import argparse

    def parse(text: str):
        value = kind(text)
        if not (value > 0 or (allow_zero and value == 0)):
            raise argparse.ArgumentTypeError(f"{text!r} is not {'>=' if allow_zero else '>'} 0")
        return value
    parse.__name__ = kind.__name__   # argparse names the type in its "invalid ... value" message
    return parse
