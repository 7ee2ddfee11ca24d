"""The exercises whose answer is a class plugged into the package's registries, beside a
reference: the staleness-scaled server rule (``RULES``) and backup workers for sync rounds
(``PROTOCOLS``). (Ringmaster and the SSP gate: :mod:`repro.lab.gates`.)

Each is graded twice: unit checks that call the student's class on chosen inputs and name the
first difference from the reference's answer, then a tiny run of the lab's quadratic with the
student's class in the registry, compared update by update with the same run of the
reference, and with the published prediction where there is one.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Iterator

import torch

import repro.api as asgd
from repro.lab.harness import (Check, exercise, losses_check, plugged_run, quadratic,
                               same_run_check, student_call, with_protocol, with_rule)

LR_SERVER = 0.1
RULE_HINT = ("Zhang et al. (2016) divide the step by the staleness tau: w <- w - (lr_server / tau) "
             "* update, where a fresh push (tau = 0) takes the full step like tau = 1")


def step_divisor(rule_cls: type, staleness: int) -> float:
    """By what the rule divides lr_server at ``staleness``, measured on a one-coordinate apply."""
    rule = student_call(rule_cls, LR_SERVER)
    params, update = torch.zeros(1), torch.ones(1)
    student_call(rule.apply, params, update, staleness, 1)
    change = -float(params[0])
    return float("inf") if change == 0 else LR_SERVER / change


def divisor_text(d: float) -> str:
    return "no step at all (params unchanged: change them in place)" if d == float("inf") else \
        f"lr_server / {d:.4g}"


@exercise("staleness_rule", "a staleness-scaled server rule (Zhang et al. 2016)", StalenessRule="class")
def grade_staleness_rule(student) -> Iterator[Check]:
    cls = student.StalenessRule
    got = {tau: step_divisor(cls, tau) for tau in (0, 1, 2, 3, 8)}
    want = {tau: step_divisor(asgd.StalenessScaledRule, tau) for tau in got}
    plus_one = all(abs(got[t] - (t + 1)) < 1e-6 for t in got)
    for tau in got:
        hint = RULE_HINT + ("; yours divides by staleness + 1" if plus_one else "")
        yield Check(f"staleness {tau}, one apply of update 1", divisor_text(want[tau]), divisor_text(got[tau]),
                    abs(got[tau] - want[tau]) < 1e-6 * want[tau], hint)
    cfg = with_rule(quadratic(4, 200, "jitter_exponential", lr=0.3), "staleness_scaled", 0.3)
    reference = asgd.run_config(cfg)
    mine = plugged_run(asgd.RULES, cls, cfg, lambda c, name: with_rule(c, name, 0.3), "staleness_rule")
    yield losses_check("4 clients, random step times, 200 updates of the quadratic", reference, mine,
                       RULE_HINT)


BACKUP_HINT = ("a round closes at the first N - b pushes of the N clients live at its start (those "
               "that joined during it count from the next): b backup workers, but at least one push")


def needed_of(cls: type, backups: int, live: set[int], joining: set[int]) -> int:
    cfg = SimpleNamespace(protocol=SimpleNamespace(backup_workers=backups))   # all a Sync policy reads when built
    policy = student_call(cls, cfg, sorted(live | joining), 0)
    policy.joining = set(joining)
    return student_call(policy.needed, frozenset(live))


@exercise("backup_workers", "backup workers for a sync round (Chen et al. 2016)", BackupSync="class")
def grade_backup_workers(student) -> Iterator[Check]:
    cls = student.BackupSync
    cases = [(0, {1, 2, 3, 4}, set()), (1, {1, 2, 3, 4}, set()), (2, {1, 2, 3, 4}, set()),
             (1, {1, 2, 3, 4}, {4}), (1, {1}, set())]
    for backups, live, joining in cases:
        want, got = needed_of(asgd.Sync, backups, live, joining), needed_of(cls, backups, live, joining)
        what = f"{backups} backup(s), {len(live)} live client(s)" + (f", {len(joining)} joined this round"
                                                                      if joining else "")
        yield Check(what, f"a round closes at {want} push(es)", f"{got}", got == want, BACKUP_HINT)
    cfg = quadratic(4, 200, straggler_client=1, straggler_factor=4.0)
    use = lambda c, name: with_protocol(c, name, backup_workers=1)   # noqa: E731
    reference = asgd.run_config(use(cfg, "sync"))
    mine = plugged_run(asgd.PROTOCOLS, cls, cfg, use, "backup_workers")
    yield same_run_check("4 clients, client 1 four times slower, 1 backup worker", reference, mine, BACKUP_HINT)
    # the published prediction: a round lasts the (N - b)-th fastest segment, here a fast
    # client's step (10 ms); waiting for the straggler too would take 40 ms
    compute_s = cfg.cost.compute_s
    rounds = mine.updates.time_s.diff().iloc[len(mine.updates) // 2:]   # steady rounds
    got = f"{1000 * rounds.mean():.1f} ms" if len(rounds.dropna()) else "no rounds (none applied)"
    yield Check("4 clients, 1 backup worker: time per round (the 3rd fastest client's step)",
                f"{1000 * compute_s:.1f} ms", got, abs(rounds.mean() - compute_s) < 0.05 * compute_s, BACKUP_HINT)

