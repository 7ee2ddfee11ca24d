"""The one registry idiom: names users type (``model=digits_cnn``, a figure, an exercise) mapped to
what they build. Each kind of name is declared once, in :data:`DECLARED`, with the modules that register
its entries by decorator (docs/contributing.md says how to add one); a user's own entry (the API, the
grader) is added under a name no module declares.
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Any, Callable, Generic, Iterator, TypeVar

from repro.errors import ConfigError

T = TypeVar("T")

# config key (how an unknown name is reported) -> {module that registers: its names, in order}.
# Order matters where a registry is iterated: figures are listed and built in this order.
DECLARED: dict[str, dict[str, tuple[str, ...]]] = {
    "algo.server_rule": {
        "repro.asgd.rules": ("delta", "downpour", "staleness_scaled", "dcasgd", "adagrad", "easgd",
                             "outer_nesterov")},
    "protocol.name": {
        "repro.asgd.protocols": ("async", "ssp", "sync"),
        "repro.asgd.optimal": ("ringmaster", "rennala")},
    "model.name": {
        "repro.workload.models": ("mlp", "digits_cnn", "mnist1d_cnn", "cifar_18pct", "quadratic")},
    "data.name": {
        "repro.workload.data": ("digits", "mnist1d", "synthetic", "quadratic", "cifar10")},
    "figure": {
        "repro.analysis.render": ("fig1", "fig2", "fig3", "fig4", "staleness", "fig3_paper",
                                 "fig4_paper"),
        "repro.analysis.lab.stability": ("stability",),
        "repro.analysis.lab.momentum": ("momentum",),
        "repro.analysis.lab.sync": ("sync_vs_async",),
        "repro.analysis.lab.mitigation": ("mitigation",),
        "repro.analysis.lab.ceiling": ("ceiling",),
        "repro.analysis.lab.partition": ("partition",),
        "repro.analysis.lab.uneven": ("uneven",),
        "repro.analysis.lab.own_data": ("own_data",),
        "repro.analysis.lab.churn": ("churn",)},
    "EXERCISE": {
        "repro.lab.numeric": ("mean_staleness", "stable_lr", "sync_ratio"),
        "repro.lab.plugins": ("staleness_rule", "backup_workers", "ssp_gate", "ringmaster")},
}

_BUILT: dict[str, "Registry"] = {}   # key -> its registry, once the module holding it is imported


def names_of(key: str) -> Callable[[], tuple[str, ...]]:
    """The valid names for config key ``key``, read when a value is checked: its registry's once built,
    before that the declared ones, sorted (``--help`` and a bad value import no registering module)."""
    return lambda: _BUILT[key].names() if key in _BUILT else tuple(sorted(declared(key)))


def declared(key: str) -> dict[str, str]:
    """Declared name -> the module that registers it, in :data:`DECLARED`'s order."""
    return {name: module for module, names in DECLARED.get(key, {}).items() for name in names}


class Registry(Generic[T]):
    """Name -> entry, for the config key ``key`` (e.g. "model.name"), declared in :data:`DECLARED`. With
    ``spec_type`` a decorated function's entry is ``spec_type(fn, **fields)``, else the function itself."""

    def __init__(self, key: str, spec_type: Callable[..., T] | None = None):
        self.key, self.spec_type = key, spec_type
        self._homes = declared(key)   # name -> module, for the package's own entries
        self._entries: dict[str, T] = {}
        _BUILT[key] = self

    def add(self, name: str, entry: T, module: str | None = None) -> T:
        """Register ``entry`` as ``name``. ``module``: the module registering it; a module that
        fills this registry registers exactly the names :data:`DECLARED` lists for it, and a
        declared name only from its own module (a user's entry comes without one)."""
        old = self._entries.get(name)
        # a user's module may register its name again (a notebook's cell run twice): the new entry replaces its own
        if old is not None and (module is None or name in self._homes or getattr(old, "__module__", None) != module):
            raise ValueError(f"{self.key}: {name!r} is registered twice")
        if module is not None and (module in self._homes.values() or name in self._homes) \
                and self._homes.get(name) != module:
            raise ValueError(f"{self.key}: {module} registers {name!r}, which repro.registry.DECLARED "
                             f"does not list for that module: declare it there")
        self._entries[name] = entry
        return entry

    @contextmanager
    def plugged(self, name: str, entry: T) -> Iterator[str]:
        """``name`` -> ``entry`` while the block runs, gone after it however it ends (the grader runs a
        student's class so)."""
        self.add(name, entry)
        try:
            yield name
        finally:
            del self._entries[name]

    def register(self, name: str, **fields: Any) -> Callable[[Callable], Callable]:
        """Decorator: ``@MODELS.register("mlp", ...)`` registers the function itself, or the spec
        ``spec_type(fn, **fields)`` makes of it."""
        if fields and self.spec_type is None:
            raise TypeError(f"{self.key}: this registry takes no fields, got {sorted(fields)}")

        def decorate(fn: Callable) -> Callable:
            entry = fn if self.spec_type is None else self.spec_type(fn, **fields)
            self.add(name, entry, getattr(fn, "__module__", None))
            return fn
        return decorate

    def __getitem__(self, name: str) -> T:
        if not isinstance(name, str) or name not in self:
            raise ConfigError(self.key, name, self.names())
        if name not in self._entries:
            importlib.import_module(self._homes[name])   # its declared module, loaded once
            if name not in self._entries:
                raise LookupError(f"{self.key}: {self._homes[name]} is declared to register {name!r} "
                                  f"in repro.registry.DECLARED but does not")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._homes

    def __iter__(self) -> Iterator[str]:
        """The declared names in their declared order, then the ones users added."""
        return iter({**dict.fromkeys(self._homes), **dict.fromkeys(self._entries)})

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted (so messages and help list them in a stable order)."""
        return tuple(sorted(self))

    def items(self):
        return [(name, self[name]) for name in self]

