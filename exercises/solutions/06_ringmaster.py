"""Reference solution of exercise 6: Ringmaster's discard rule.

Ringmaster ASGD (Maranjyan, Tyurin, Richtarik, ICML 2025) is asynchronous SGD that refuses
gradients that are too stale: a push whose staleness (their "delay") reaches a threshold R is
not applied; its client fetches the current parameters and goes on. With equally fast clients
(staleness about N - 1) nothing is lost at R = N; a very slow client's pushes are dropped.

Complete on_push() below: decide whether the push is discarded. The grader registers your
class in the package's protocol registry (PROTOCOLS) for one run, then checks it:

    python -m repro.lab grade exercises/06_ringmaster.py
"""
from repro.api import Decision, Policy

EXERCISE = "ringmaster"


class Ringmaster(Policy):
    discards = True   # the run's summary lists the discarded pushes

    def __init__(self, cfg, clients, version):
        self.threshold = cfg.protocol.resolved_staleness_threshold(cfg.num_clients)   # R

    def on_push(self, push, view):
        """Apply ``push`` or discard it; either way its client fetches and goes on.
        ``view.version`` is the server's version now; ``push.read_version`` the version the
        client computed from."""
        staleness = view.version - push.read_version
        discard = staleness >= self.threshold   # the delay reached R
        if discard:
            return Decision(reply=(push.client,), discarded=((push.read_version, push.client),))
        return Decision(apply=push, reply=(push.client,))
