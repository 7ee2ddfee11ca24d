"""The one registry idiom: names users type (``model=digits_cnn``, ``algo.server_rule=adagrad``,
a figure name) mapped to what they build, plus what validation needs to know about each.

Models, data sets, server rules and figures each keep one :class:`Registry`; validation takes its
valid names from it (``registry.names()``), and an unknown name is a :class:`ConfigError` naming
the config key, the value and the registered choices. Registering is a decorator, so the entry
sits beside the code it names.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Generic, Iterator, TypeVar

from repro.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> entry, for the config key ``key`` (e.g. "model.name")."""

    def __init__(self, key: str):
        self.key = key
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.key}: {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    @contextmanager
    def plugged(self, name: str, entry: T) -> Iterator[str]:
        """``name`` -> ``entry`` while the block runs, gone after it (however it ends): how the
        classroom's grader runs a student's class through the package's own registries, under a
        name no other code uses, without leaving it behind for the rest of the process."""
        self.add(name, entry)
        try:
            yield name
        finally:
            del self._entries[name]

    def register(self, name: str, **fields: Any) -> Callable[[Callable], Callable]:
        """Decorator: ``@MODELS.register("mlp", ...)`` registers ``make(fn, **fields)`` where the
        registry was given an entry factory, else the function itself."""
        def decorate(fn: Callable) -> Callable:
            self.add(name, self.make_entry(fn, **fields))
            return fn
        return decorate

    def make_entry(self, fn: Callable, **fields: Any) -> Any:
        if fields:
            raise TypeError(f"{self.key}: this registry takes no fields, got {sorted(fields)}")
        return fn

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ConfigError(self.key, name, self.names()) from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted (so messages and help list them in a stable order)."""
        return tuple(sorted(self._entries))

    def items(self):
        return self._entries.items()


class SpecRegistry(Registry[T]):
    """A registry whose entries are ``spec_type(fn, **fields)`` (e.g. a model's builder and the
    input shape it accepts)."""

    def __init__(self, key: str, spec_type: Callable[..., T]):
        super().__init__(key)
        self.spec_type = spec_type

    def make_entry(self, fn: Callable, **fields: Any) -> T:
        return self.spec_type(fn, **fields)
