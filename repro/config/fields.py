"""How a config field is declared (:func:`knob`): its default, its valid values, and whether it
shapes training. Each validator both checks a value (a :class:`ConfigError` naming key, value and
what is valid) and describes it for ``--help``; every number is finite, so none can hang a run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from repro.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """A finite numeric range; ``words`` are extra string values allowed (e.g. 'calibrate')."""
    lo: float
    hi: float
    lo_open: bool = False
    integer: bool = False
    nullable: bool = False
    words: tuple[str, ...] = ()
    hi_open: bool = False

    def check(self, key: str, value: Any) -> None:
        if not self.holds(value):
            raise ConfigError(key, value, self.describe())

    def holds(self, value: Any) -> bool:
        if value is None and self.nullable or value in self.words:
            return True
        bad = not isinstance(value, int if self.integer else (int, float)) or isinstance(value, bool) \
            or not math.isfinite(value)   # int: a cfg.replace(nsync=2.5) reaches here unconverted
        return not (bad or value < self.lo or value > self.hi or (self.lo_open and value == self.lo)
                    or (self.hi_open and value == self.hi))

    def describe(self) -> str:
        lo, hi = (f"{int(v)}" if self.integer else f"{v:g}" for v in (self.lo, self.hi))
        text = f"an integer in {lo}..{hi}" if self.integer else \
            f"a number in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        extra = [f"'{w}'" for w in self.words] + (["null"] if self.nullable else [])
        return " or ".join([text, *extra])


@dataclass(frozen=True)
class Numbers(Range):
    """A non-empty list of numbers, each in the range (``nullable``: or null). How many there
    must be is a relation between keys (e.g. one per client), checked by the settings."""

    def holds(self, value: Any) -> bool:
        each = Range(self.lo, self.hi, self.lo_open, self.integer)
        return value is None and self.nullable or isinstance(value, (list, tuple)) and len(value) > 0 \
            and all(map(each.holds, value))

    def describe(self) -> str:
        each = Range(self.lo, self.hi, self.lo_open, self.integer).describe()
        return f"a non-empty list, each {each}" + (", or null" if self.nullable else "")


@dataclass(frozen=True)
class Choice:
    """One of a fixed tuple, or of a registry's names (a callable, resolved when checked).
    ``custom``: also 'custom' or 'custom:<name>', what the Python API records for a user's own
    data or module (repro.api.simulate), which no registry knows."""
    choices: tuple | Callable[[], tuple]
    custom: bool = False

    def names(self) -> tuple:
        return self.choices() if callable(self.choices) else self.choices

    def check(self, key: str, value: Any) -> None:
        custom = self.custom and isinstance(value, str) and (value == "custom" or value.startswith("custom:"))
        if value not in self.names() and not custom:
            raise ConfigError(key, value, self.names())

    def describe(self) -> str:
        return ", ".join(str(n).lower() if isinstance(n, bool) else str(n) for n in self.names())


@dataclass(frozen=True)
class Text:
    """Free text (a name or a path)."""
    what: str = "a string"
    nullable: bool = False

    def check(self, key: str, value: Any) -> None:
        if value is None and not self.nullable:
            raise ConfigError(key, value, self.what)

    def describe(self) -> str:
        return self.what + (" or null" if self.nullable else "")


def knob(default: Any, valid: Any, shapes: bool = True) -> Any:
    """A config field: its default, its valid values, and whether it shapes training (numbers in
    the tables change with it); ``shapes=False`` for where files go, timeouts, ports, progress."""
    kw = {"default_factory": default} if callable(default) else {"default": default}
    return field(metadata={"valid": valid, "shapes": shapes}, **kw)


SECONDS = Range(0.0, 1e6)   # a million seconds: finite, far beyond any sensible run
WAIT_S = Range(0.0, 7 * 86400.0, lo_open=True)   # timeouts: positive, at most a week
COUNT = Range(1, 10**8, integer=True, nullable=True)
FLAG = Choice((True, False))


def check_known(tree: dict, cls: type, keys: tuple[str, ...], prefix: str = "") -> set[str]:
    """``cls``'s field names; a ConfigError naming the first key of ``tree`` not among them, with
    its full spelling among ``keys`` (every dotted key) where it is a group's (``lr``: algo.lr)."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(tree) - names, key=str)   # key=str: the API's dicts may hold a key 1
    if unknown:
        full = " or ".join(k for k in keys if k.startswith(prefix) and k.endswith(f".{unknown[0]}"))
        raise ConfigError(f"{prefix}{unknown[0]}", tree[unknown[0]], (f"{full} (a group's key) or " if full else "")
                          + "a known key: " + ", ".join(sorted(names)))
    return names
