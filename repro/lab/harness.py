"""What every exercise's grading shares: a check's verdict, the catalogue of exercises (each a
function yielding :class:`Check` verdicts, registered with :func:`exercise` under the name a stub's
``EXERCISE = "..."`` line gives), calling a student's code safely, and tiny simulator runs on the
lab's quadratic, a student's class plugged into the package's registries (:func:`plugged_run`)."""
from __future__ import annotations

import dataclasses
import traceback
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Iterator

import numpy as np

import repro.api as asgd
from repro.registry import Registry


@dataclass(frozen=True)
class Check:
    """One verdict: what was checked, what was expected, what came out, and a hint if it failed."""
    what: str
    expected: str
    got: str
    passed: bool
    hint: str = ""


@dataclass(frozen=True)
class Exercise:
    name: str
    title: str
    needs: tuple[tuple[str, str], ...]   # (name the student's file defines, "function" or "class")
    grade: Callable[[ModuleType], Iterator[Check]]


EXERCISES: Registry[Exercise] = Registry("EXERCISE")


def exercise(name: str, title: str, **needs: str) -> Callable:
    """Decorator: register a grading function as exercise ``name``."""
    def decorate(grade: Callable[[ModuleType], Iterator[Check]]) -> Callable:
        EXERCISES.add(name, Exercise(name, title, tuple(needs.items()), grade), grade.__module__)
        return grade
    return decorate


STUDENT_FILES: set[str] = set()   # the files the grader loaded: their frames are the student's


class StudentError(Exception):
    """The student's code raised: the message says what and on which line of their file."""


class TooLong(BaseException):
    """The grading's time is up. Not an Exception: neither the student's ``except Exception`` nor
    :func:`student_call` may take it for an answer and call on (the alarm rings once)."""

    def __init__(self, seconds: int):
        super().__init__(f"grading ran over {seconds} s: does your code ever return?")


def student_call(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args)``, an exception turned into a :class:`StudentError` naming their file's line."""
    try:
        return fn(*args, **kwargs)
    except (KeyboardInterrupt, TooLong):   # Ctrl-C and the time limit end the grading: no answer
        raise
    except BaseException as e:   # noqa: BLE001  (exit(), GeneratorExit, a BaseException of theirs: was a traceback)
        raise StudentError(describe_error(e)) from None


def describe_error(e: BaseException) -> str:
    """``ValueError: bad (line 12 of exercises/x.py)``: the innermost frame in a student file."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename in STUDENT_FILES]
    where = f" (line {frames[-1].lineno} of {frames[-1].filename})" if frames else ""
    try:
        message = str(e)
    except Exception as inner:   # noqa: BLE001  (their exception's __str__ raised in turn: it was a traceback)
        message = f"(its message cannot be shown: {type(inner).__name__} in its __str__)"
    return f"{type(e).__name__}: {message}{where}"


class Raised(str):
    """What came out when the student's function raised: shown as it is, never a number."""


def shown(value: Any) -> str:
    """A student's answer as the report shows it (text quoted, to tell "3" from 3)."""
    if isinstance(value, Raised):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return repr(value) if value is None or isinstance(value, str) else str(value)


def as_number(got: Any) -> float | None:
    """A student's answer as a float; None for what is not a number (text, a bool, None, a huge int)."""
    if isinstance(got, (str, bytes, bool, np.bool_)):   # float("1") and float(True) passed for 1
        return None
    try:
        return float(got)
    except (TypeError, ValueError, OverflowError):
        return None


def number_check(what: str, got: Any, expected: float, tolerance: str, hint: str, rel: float = 0.0,
                 abs_tol: float = 0.0) -> Check:
    """A student's number against an expected one: it passes within ``max(rel * |expected|, abs_tol)``."""
    value = as_number(got)
    passed = value is not None and abs(value - expected) <= max(rel * abs(expected), abs_tol)
    return Check(what, f"{expected:.4g} ({tolerance})", shown(got), passed, hint)


def quadratic(num_clients: int, steps: int, cost: str = "uniform", lr: float = 0.01, **cost_fields) -> Any:
    """A run config of the lab's quadratic (nsync 1) with ``num_clients`` clients for ``steps`` server
    updates' worth of samples, evaluated 20 times; cost fields (``straggler_factor=4.0``) change the profile."""
    cfg = asgd.configure("+problem=quadratic", f"cost={cost}", "nsync=1")
    cfg = cfg.replace(num_clients=num_clients, num_epochs=float(steps), eval_every=steps / 20)
    return cfg.replace(algo=dataclasses.replace(cfg.algo, lr=lr), cost=dataclasses.replace(cfg.cost, **cost_fields))


def with_protocol(cfg: Any, name: str, **fields: Any) -> Any:
    return cfg.replace(protocol=dataclasses.replace(cfg.protocol, name=name, **fields))


def with_rule(cfg: Any, name: str, lr_server: float) -> Any:
    return cfg.replace(algo=dataclasses.replace(cfg.algo, server_rule=name, lr_server=lr_server))


def plugged_run(registry: Registry, cls: type, cfg: Any, reference: str, tag: str, **fields: Any) -> tuple:
    """The runs of ``cfg`` with the ``reference`` entry of ``registry`` (``fields`` set beside its
    name) and with the student's ``cls`` in its place, under a temporary name for that run alone."""
    use = with_rule if registry is asgd.RULES else with_protocol
    reference_run = asgd.run_config(use(cfg, reference, **fields))
    with registry.plugged(f"student_{tag}", cls) as name:
        return reference_run, student_call(lambda: asgd.run_config(use(cfg, name, **fields)))


def first_difference(reference: Any, student: Any) -> str | None:
    """Where two runs' update sequences (client, staleness) part, or None."""
    ref, got = (list(zip(run.updates.client, run.updates.staleness)) for run in (reference, student))
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            return (f"update {i + 1}: the reference applied client {a[0]}'s push (staleness {a[1]}), "
                    f"yours client {b[0]}'s (staleness {b[1]})")
    if len(ref) != len(got):
        return f"the reference applied {len(ref)} updates, yours {len(got)}"
    return None


def same_run_check(what: str, reference: Any, student: Any, hint: str) -> Check:
    """The student's run applies the same pushes in the same order, and ends as the reference."""
    diff = first_difference(reference, student)
    ref_status, status = reference.summary["status"], student.summary["status"]
    if status != ref_status:   # e.g. a protocol that never replies: the run says why it failed
        why = student.summary.get("message") or ""
        ended = f"your run ended {status}" + (f": {why}" if why else "")
        diff = f"{diff}; {ended}" if diff else ended
    expected = f"the reference's {len(reference.updates)} updates, in order, status {ref_status}"
    return Check(what, expected, diff or "the same", diff is None, hint)


def losses_check(what: str, reference: Any, student: Any, hint: str, rel: float = 1e-4) -> Check:
    """The student's run's evaluated losses equal the reference's within ``rel``."""
    ref, got = reference.evals.train_loss.to_numpy(), student.evals.train_loss.to_numpy()
    if len(ref) != len(got):
        return Check(what, f"{len(ref)} evaluations", f"{len(got)} (status {student.summary['status']})",
                     False, hint)
    gap = max(abs(g - r) / max(abs(r), 1e-30) for r, g in zip(ref, got))
    return Check(what, f"final loss {ref[-1]:.4g} (each evaluation within {rel:g} relative)",
                 f"final loss {got[-1]:.4g} (largest relative gap {gap:.2g})", bool(gap <= rel), hint)
