"""The exercises that ask for a number (mean staleness, the stable learning rate, sync's throughput
ratio), each graded against the theory's prediction and against what the simulator measures on
fixed seeds (TEACHING.md, steps 1, 2 and 4; exercises/README.md)."""
from __future__ import annotations

from typing import Iterator

import repro.api as asgd
from repro.lab.harness import (Check, Raised, StudentError, as_number, exercise, number_check, quadratic, student_call,
                               with_protocol)

STALENESS_HINT = ("between a client's fetch and its push every other client pushes once (they "
                  "are all equally fast): count those pushes, not the client's own")
LR_HINT = ("each coordinate follows w[t+1] = w[t] - lr * l * w[t - tau]; tau = 0 gives lr < 2/l; "
           "a delay shrinks the bound (Levin & May 1976), or find it by iterating the recursion")
RATIO_HINT = ("async applies every push as it comes; a sync round waits for the slowest of N "
              "exponential steps, whose mean is 1 + 1/2 + ... + 1/N mean steps")


def answer(fn, *args) -> object:
    """The student's answer, or (as what came out) the error their function raised, or that their
    answer raised when read as a number or as text."""
    try:
        got = student_call(fn, *args)
        student_call(lambda: (as_number(got), str(got)))
        return got
    except StudentError as e:
        return Raised(f"an error: {e}")


def off_by_one(got: object, expected: float) -> str:
    """A hint's addition when an answer is exactly one off."""
    value = as_number(got)
    if value is None:
        return ""
    gap = value - expected
    return f" (yours is {gap:+g}: off by one)" if abs(abs(gap) - 1) < 1e-9 else ""


def steady_staleness(num_clients: int, cost: str) -> float:
    """The simulator's mean staleness after the first round (every client's first push)."""
    updates = asgd.run_config(quadratic(num_clients, 60 * num_clients, cost)).updates
    return float(updates.staleness.iloc[num_clients:].mean())


@exercise("mean_staleness", "the mean staleness of N equally fast clients", mean_staleness="function")
def grade_mean_staleness(student) -> Iterator[Check]:
    for n in (2, 4, 8):
        got = answer(student.mean_staleness, n)
        yield number_check(f"N = {n}, theory", got, n - 1, "exactly N - 1", STALENESS_HINT + off_by_one(got, n - 1),
                           abs_tol=1e-6)
        measured = steady_staleness(n, "uniform")
        yield number_check(f"N = {n}, simulator (equal step times, {60 * n} pushes, nsync 1)", got, measured,
                           "within 0.05", STALENESS_HINT, abs_tol=0.05)
    measured = steady_staleness(4, "jitter_exponential")
    got = answer(student.mean_staleness, 4)
    yield number_check("N = 4, simulator with random (exponential) step times: the mean does not change",
                       got, measured, "within 5%", "the mean counts every other client's pushes during "
                       "a segment, whatever the step times: the same answer", rel=0.05)


def stability_run(num_clients: int, lr: float) -> str:
    """'stable' (the loss fell) or 'unstable' (diverged, or no progress) at ``lr``."""
    result = asgd.run_config(quadratic(num_clients, 300, lr=lr))
    losses = result.evals.train_loss
    stable = result.summary["status"] == "completed" and losses.iloc[-1] < 0.5 * losses.iloc[0]
    return "stable" if stable else f"unstable ({result.summary['status']})"


@exercise("stable_lr", "the largest stable learning rate at staleness tau (the lab's quadratic)",
          largest_stable_lr="function")
def grade_stable_lr(student) -> Iterator[Check]:
    for tau in (0, 1, 3):
        got = answer(student.largest_stable_lr, tau)
        yield number_check(f"staleness {tau}, theory", got, float(asgd.critical_lr(tau)), "within 2%", LR_HINT,
                           rel=0.02)
    got = answer(student.largest_stable_lr, 3)
    lr = as_number(got)
    if lr is None or not 0 < lr < 100:
        yield Check("staleness 3, simulator (4 equally fast clients)",
                    "a number to try" if lr is None else "a learning rate between 0 and 100", str(got), False, LR_HINT)
        return
    for factor, want, hint in ((0.85, "stable", "your rate is above the boundary: a little below it "
                                "already fails"), (1.2, "unstable", "your rate is below the boundary: "
                                "a little above it still converges")):
        came = stability_run(4, factor * lr)
        yield Check(f"staleness 3, simulator at {factor:g} x your answer = {factor * lr:.3g}, 300 steps",
                    want, came, came.startswith(want), hint)


@exercise("sync_ratio", "sync's throughput over async's under exponential step times",
          sync_async_ratio="function")
def grade_sync_ratio(student) -> Iterator[Check]:
    for n in (2, 4, 8):
        got = answer(student.sync_async_ratio, n)
        yield number_check(f"N = {n}, theory", got, 1 / asgd.harmonic(n), "within 1%", RATIO_HINT, rel=0.01)
    for n in (2, 4):
        got = answer(student.sync_async_ratio, n)
        rates = {}
        for protocol in ("async", "sync"):
            updates = asgd.run_config(with_protocol(quadratic(n, 100 * n, "jitter_exponential"), protocol)).updates
            rates[protocol] = updates.samples_seen.iloc[-1] / updates.time_s.iloc[-1]
        yield number_check(f"N = {n}, simulator (100 rounds, samples per virtual second)", got,
                           rates["sync"] / rates["async"], "within 8%: a finite run's spread", RATIO_HINT, rel=0.08)
