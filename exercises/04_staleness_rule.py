"""Exercise 4: a staleness-scaled server rule.

The server applies each push with a *server rule*. Downpour's rule (the paper's) takes a fixed
step along the client's accrued gradient:  w <- w - lr_server * update.  A push that is tau
versions stale was computed on old parameters, so Zhang, Gupta, Lian and Liu (IJCAI 2016) take
a smaller step for it: the step divided by its staleness. A fresh push (staleness 0) takes the
full step, like staleness 1.

Write apply() below: change ``params`` in place (e.g. ``params.add_(update, alpha=-step)``).
The grader registers your class in the package's server-rule registry (RULES) for one run, as
the package's own rules are, then checks it:

    python -m repro.lab grade exercises/04_staleness_rule.py

It calls apply() at several staleness values beside the package's rule, then trains the lab's
quadratic with 4 clients and random step times with your rule and with the package's.
"""
EXERCISE = "staleness_rule"


class StalenessRule:
    push_kind = "gradient"   # clients push their accrued gradient (as for Downpour's rule)

    def __init__(self, lr_server: float, **_):
        self.lr_server = lr_server

    def apply(self, params, update, staleness: int = 0, client: int = 0) -> None:
        """Apply one push: ``params`` (the server's parameters, a flat tensor) takes a step along
        ``update`` (the client's accrued gradient); ``staleness`` is the push's staleness."""
        params.add_(update, alpha=-self.lr_server)   # Downpour's step: make it staleness-aware

    # what every server rule has; this one keeps nothing between pushes
    def fetched(self, client: int, params) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
