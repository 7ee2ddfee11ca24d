"""The exercises whose answer is a class plugged into the package's registries: the
staleness-scaled server rule (``RULES``); backup workers, the SSP gate and Ringmaster's discard
rule (``PROTOCOLS``). Each is graded by unit checks on chosen inputs (the gates: a scripted sequence
of pushes), then by a tiny run of the lab's quadratic compared update by update with the reference's
and with the published prediction where there is one (exercises/README.md)."""
from __future__ import annotations

import dataclasses
import numbers
from types import SimpleNamespace
from typing import Iterator

import pandas as pd
import torch

import repro.api as asgd
from repro.lab.harness import (Check, Raised, StudentError, exercise, losses_check, plugged_run, quadratic,
                               same_run_check, student_call, with_protocol)

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
    reference, mine = plugged_run(asgd.RULES, cls, quadratic(4, 200, "jitter_exponential", lr=0.3),
                                  "staleness_scaled", "staleness_rule", lr_server=0.3)
    yield losses_check("4 clients, random step times, 200 updates of the quadratic", reference, mine, RULE_HINT)


BACKUP_HINT = ("a round closes at the first N - b pushes of the N clients live at its start (those "
               "that joined during it count from the next): b backup workers, but at least one push")


def needed_of(cls: type, backups: int, live: set[int], joining: set[int]) -> int | Raised:
    # all a Sync policy reads when built
    cfg = SimpleNamespace(num_clients=len(live), protocol=SimpleNamespace(backup_workers=backups))
    policy = student_call(cls, cfg, sorted(live | joining), 0)
    policy.joining = set(joining)
    got = student_call(policy.needed, frozenset(live))
    # an array made the check's == ambiguous (a traceback), True passed for 1, "3" showed as 3
    return int(got) if isinstance(got, numbers.Integral) and not isinstance(got, bool) else \
        Raised(f"{student_call(repr, got)}, not a count (an int)")


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
    reference, mine = plugged_run(asgd.PROTOCOLS, cls, cfg, "sync", "backup_workers", backup_workers=1)
    yield same_run_check("4 clients, client 1 four times slower, 1 backup worker", reference, mine, BACKUP_HINT)
    # the published prediction: a round lasts the (N - b)-th fastest segment, here a fast
    # client's step (10 ms); waiting for the straggler too would take 40 ms
    compute_s = cfg.cost.compute_s
    rounds = mine.updates.time_s.diff().iloc[len(mine.updates) // 2:]   # steady rounds
    got = f"{1000 * rounds.mean():.1f} ms" if len(rounds.dropna()) else "no rounds (none applied)"
    yield Check("4 clients, 1 backup worker: time per round (the 3rd fastest client's step)",
                f"{1000 * compute_s:.1f} ms", got, abs(rounds.mean() - compute_s) < 0.05 * compute_s, BACKUP_HINT)


BOUND, THRESHOLD = 2, 4
SSP_HINT = ("Ho et al. (2013): a client waits only when it is MORE than s pushes ahead of the "
            "slowest live client (ahead <= s goes on); a lost client never waits")
# client 1 runs ahead of clients 2 and 3 (its 2nd push is s = 2 ahead and goes on, its 3rd waits),
# client 3's push releases it, it runs ahead again, and client 3's loss releases it
SSP_SCRIPT = [("push", 1)] * 3 + [("push", 2), ("push", 3), ("push", 1), ("push", 2), ("lost", 3)]
RING_HINT = ("Ringmaster discards a push whose staleness reaches the threshold R (staleness >= R); "
             "its client fetches the current parameters and goes on")


def push(client: int, read_version: int) -> asgd.Push:
    """A push that only its client and read version matter for (a protocol's decision)."""
    return asgd.Push(client=client, read_version=read_version, update=torch.zeros(1), num_steps=1,
                     num_samples=1, train_loss=0.0, train_error=0.0, stream_position=(0, 0))


def decided(method, *args) -> asgd.Decision:
    """The Decision the student's ``method`` returns, its clients as tuples (a list or an array is
    judged by whom it names); anything else (a forgotten ``return``, ``reply=3``) is their error."""
    got = student_call(method, *args)
    if not isinstance(got, asgd.Decision):
        raise StudentError(f"{method.__name__} returned {student_call(repr, got)}, not a Decision")
    try:   # an array's truth test or an int's join was a traceback in goes_on and outcome
        return dataclasses.replace(got, reply=tuple(got.reply), discarded=tuple(got.discarded))
    except TypeError:
        reply, discarded = student_call(repr, got.reply), student_call(repr, got.discarded)
        raise StudentError(f"{method.__name__} returned a Decision with reply={reply}, discarded={discarded}: "
                           "each a tuple, e.g. reply=(client,)") from None


def goes_on(decision: asgd.Decision) -> str:
    return f"client(s) {', '.join(map(str, decision.reply))} go on" if decision.reply else "nobody goes on"


def scripted_ssp(cls: type) -> Iterator[Check]:
    cfg = with_protocol(quadratic(3, 10), "ssp", staleness_bound=BOUND)
    ref, mine = asgd.SSP(cfg, [1, 2, 3], 0), student_call(cls, cfg, [1, 2, 3], 0)
    live, version = {1, 2, 3}, 0
    for event, k in SSP_SCRIPT:
        if event == "lost":
            live.discard(k)
            view = asgd.View(version, frozenset(live))
            want, got = ref.on_lost(k, view), decided(mine.on_lost, k, view)
            what = f"client {k} is lost; the others' leads shrink"
        else:
            view = asgd.View(version, frozenset(live))
            want, got = ref.on_push(push(k, version), view), decided(mine.on_push, push(k, version), view)
            version += 1
            ahead = ref.pushes[k] - min(ref.pushes[j] for j in live)
            what = f"client {k} pushes ({ahead} ahead of the slowest live client, bound s = {BOUND})"
        ok = goes_on(want) == goes_on(got)   # what the report shows: a list [1] goes on as (1,) does
        yield Check(what, goes_on(want), goes_on(got), ok, SSP_HINT)
        if not ok:   # the two policies' states part here: later decisions would not compare
            return


@exercise("ssp_gate", "the gate of stale synchronous parallel (Ho et al. 2013)", BoundedSSP="class")
def grade_ssp_gate(student) -> Iterator[Check]:
    cls = student.BoundedSSP
    yield from scripted_ssp(cls)
    cfg = quadratic(3, 150, straggler_client=1, straggler_factor=4.0)
    reference, mine = plugged_run(asgd.PROTOCOLS, cls, cfg, "ssp", "ssp_gate", staleness_bound=BOUND)
    what = f"3 clients, client 1 four times slower, bound s = {BOUND}"
    yield same_run_check(what, reference, mine, SSP_HINT)
    # the most pushes a client had applied beyond the one with the fewest, at its push
    counts, lead = dict.fromkeys(set(mine.updates.client), 0), 0
    for k in mine.updates.client:
        counts[k] += 1
        lead = max(lead, counts[k] - min(counts.values()))
    yield Check(what + ": the most pushes a client is ahead when it pushes", f"at most s + 1 = {BOUND + 1}",
                str(lead), lead <= BOUND + 1, SSP_HINT)


def outcome(decision: asgd.Decision) -> str:
    return "applied" if decision.apply is not None else "discarded" if decision.discarded else "neither"


def scripted_ringmaster(cls: type) -> Iterator[Check]:
    cfg = with_protocol(quadratic(4, 10), "ringmaster", staleness_threshold=THRESHOLD)
    for staleness in (0, THRESHOLD - 1, THRESHOLD, THRESHOLD + 1, 3 * THRESHOLD):
        ref, mine = asgd.Ringmaster(cfg, [1, 2, 3, 4], 0), student_call(cls, cfg, [1, 2, 3, 4], 0)
        view = asgd.View(staleness, frozenset({1, 2, 3, 4}))
        want, got = outcome(ref.on_push(push(1, 0), view)), outcome(decided(mine.on_push, push(1, 0), view))
        hint = RING_HINT
        if staleness == THRESHOLD and got == "applied":
            hint += f"; yours applies it at staleness = R = {THRESHOLD} (discarding only at staleness > R?)"
        yield Check(f"a push {staleness} versions stale, R = {THRESHOLD}", want, got, want == got, hint)


@exercise("ringmaster", "Ringmaster's discard rule (Maranjyan, Tyurin, Richtarik 2025)", Ringmaster="class")
def grade_ringmaster(student) -> Iterator[Check]:
    cls = student.Ringmaster
    yield from scripted_ringmaster(cls)
    cfg = quadratic(4, 300, "jitter_exponential")
    reference, mine = plugged_run(asgd.PROTOCOLS, cls, cfg, "ringmaster", "ringmaster",
                                  staleness_threshold=THRESHOLD)
    what = f"4 clients, random step times, R = {THRESHOLD}"
    yield same_run_check(what, reference, mine, RING_HINT)
    stalest = mine.updates.staleness.max()   # NaN when every push was discarded
    yield Check(what + ": the stalest push applied", f"at most R - 1 = {THRESHOLD - 1}",
                "none applied" if pd.isna(stalest) else str(int(stalest)), stalest < THRESHOLD, RING_HINT)
    ref_dropped, dropped = (len(run.summary.get("discarded_pushes") or []) for run in (reference, mine))
    yield Check(what + ": pushes discarded", str(ref_dropped), str(dropped), dropped == ref_dropped, RING_HINT)
