"""The exercises whose answer is a protocol that decides which pushes count: the gate of stale
synchronous parallel (Ho et al. 2013) and Ringmaster's discard rule (Maranjyan, Tyurin,
Richtarik 2025), both plugged into the package's ``PROTOCOLS`` registry.

Each is graded on a scripted sequence of pushes, decision by decision beside the package's
own protocol (the first decision that differs is named, with the staleness or lead it was made
at), then on a tiny simulated run compared update by update with the reference, and against
the rule's published guarantee (SSP: no client more than s + 1 pushes ahead when it pushes;
Ringmaster: no applied push R or more versions stale).
"""
from __future__ import annotations

from typing import Iterator

import torch

import repro.api as asgd
from repro.lab.harness import Check, exercise, plugged_run, quadratic, same_run_check, student_call, with_protocol

BOUND, THRESHOLD = 2, 4
SSP_HINT = ("Ho et al. (2013): a client waits only when it is MORE than s pushes ahead of the "
            "slowest live client (ahead <= s goes on); a lost client never waits")
RING_HINT = ("Ringmaster discards a push whose staleness reaches the threshold R (staleness >= R); "
             "its client fetches the current parameters and goes on")


def push(client: int, read_version: int) -> asgd.Push:
    """A push that only its client and read version matter for (a protocol's decision)."""
    return asgd.Push(client=client, read_version=read_version, update=torch.zeros(1), num_steps=1,
                     num_samples=1, train_loss=0.0, train_error=0.0, stream_position=(0, 0))


def goes_on(decision: asgd.Decision) -> str:
    return f"client(s) {', '.join(map(str, decision.reply))} go on" if decision.reply else "nobody goes on"


def ssp_script() -> list[tuple[str, int]]:
    """Client 1 runs ahead of clients 2 and 3 (its 2nd push is s = 2 ahead and goes on, its 3rd
    waits), client 3's push releases it, it runs ahead again, and client 3's loss releases it.
    A client pushes only when it has its reply."""
    return [("push", 1)] * 3 + [("push", 2), ("push", 3), ("push", 1), ("push", 2), ("lost", 3)]


def scripted_ssp(cls: type) -> Iterator[Check]:
    cfg = with_protocol(quadratic(3, 10), "ssp", staleness_bound=BOUND)
    ref, mine = asgd.SSP(cfg, [1, 2, 3], 0), student_call(cls, cfg, [1, 2, 3], 0)
    live, version = {1, 2, 3}, 0
    for event, k in ssp_script():
        if event == "lost":
            live.discard(k)
            view = asgd.View(version, frozenset(live))
            want, got = ref.on_lost(k, view), student_call(mine.on_lost, k, view)
            what = f"client {k} is lost; the others' leads shrink"
        else:
            view = asgd.View(version, frozenset(live))
            want, got = ref.on_push(push(k, version), view), student_call(mine.on_push, push(k, version), view)
            version += 1
            ahead = ref.pushes[k] - min(ref.pushes[j] for j in live)
            what = f"client {k} pushes ({ahead} ahead of the slowest live client, bound s = {BOUND})"
        ok = want.reply == got.reply
        yield Check(what, goes_on(want), goes_on(got), ok, SSP_HINT)
        if not ok:   # the two policies' states part here: later decisions would not compare
            return


def largest_lead(updates) -> int:
    """The most pushes a client had applied beyond the client with the fewest, at its push."""
    counts, lead = dict.fromkeys(set(updates.client), 0), 0
    for k in updates.client:
        counts[k] += 1
        lead = max(lead, counts[k] - min(counts.values()))
    return lead


@exercise("ssp_gate", "the gate of stale synchronous parallel (Ho et al. 2013)", BoundedSSP="class")
def grade_ssp_gate(student) -> Iterator[Check]:
    cls = student.BoundedSSP
    yield from scripted_ssp(cls)
    cfg = quadratic(3, 150, straggler_client=1, straggler_factor=4.0)
    use = lambda c, name: with_protocol(c, name, staleness_bound=BOUND)   # noqa: E731
    reference = asgd.run_config(use(cfg, "ssp"))
    mine = plugged_run(asgd.PROTOCOLS, cls, cfg, use, "ssp_gate")
    what = f"3 clients, client 1 four times slower, bound s = {BOUND}"
    yield same_run_check(what, reference, mine, SSP_HINT)
    lead = largest_lead(mine.updates)
    yield Check(what + ": the most pushes a client is ahead when it pushes", f"at most s + 1 = {BOUND + 1}",
                str(lead), lead <= BOUND + 1, SSP_HINT)


def outcome(decision: asgd.Decision) -> str:
    return "applied" if decision.apply is not None else "discarded" if decision.discarded else "neither"


def scripted_ringmaster(cls: type) -> Iterator[Check]:
    cfg = with_protocol(quadratic(4, 10), "ringmaster", staleness_threshold=THRESHOLD)
    for staleness in (0, THRESHOLD - 1, THRESHOLD, THRESHOLD + 1, 3 * THRESHOLD):
        ref, mine = asgd.Ringmaster(cfg, [1, 2, 3, 4], 0), student_call(cls, cfg, [1, 2, 3, 4], 0)
        view = asgd.View(staleness, frozenset({1, 2, 3, 4}))
        want, got = outcome(ref.on_push(push(1, 0), view)), outcome(student_call(mine.on_push, push(1, 0), view))
        hint = RING_HINT
        if staleness == THRESHOLD and got == "applied":
            hint += f"; yours applies it at staleness = R = {THRESHOLD} (discarding only at staleness > R?)"
        yield Check(f"a push {staleness} versions stale, R = {THRESHOLD}", want, got, want == got, hint)


@exercise("ringmaster", "Ringmaster's discard rule (Maranjyan, Tyurin, Richtarik 2025)", Ringmaster="class")
def grade_ringmaster(student) -> Iterator[Check]:
    cls = student.Ringmaster
    yield from scripted_ringmaster(cls)
    cfg = quadratic(4, 300, "jitter_exponential")
    use = lambda c, name: with_protocol(c, name, staleness_threshold=THRESHOLD)   # noqa: E731
    reference = asgd.run_config(use(cfg, "ringmaster"))
    mine = plugged_run(asgd.PROTOCOLS, cls, cfg, use, "ringmaster")
    what = f"4 clients, random step times, R = {THRESHOLD}"
    yield same_run_check(what, reference, mine, RING_HINT)
    stalest = int(mine.updates.staleness.max())
    yield Check(what + ": the stalest push applied", f"at most R - 1 = {THRESHOLD - 1}", str(stalest),
                stalest < THRESHOLD, RING_HINT)
    ref_dropped = len(reference.summary.get("discarded_pushes") or [])
    dropped = len(mine.summary.get("discarded_pushes") or [])
    yield Check(what + ": pushes discarded", str(ref_dropped), str(dropped), dropped == ref_dropped, RING_HINT)
