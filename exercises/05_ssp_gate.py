"""Exercise 5: the gate of stale synchronous parallel (SSP).

SSP (Ho et al., NIPS 2013) runs asynchronously, but bounds how far a client may run ahead: a
client that has pushed more than s times more than the slowest live client (s: the staleness
bound) is not sent its reply until the slowest catches up. s = 0 gives rounds; a large s is
plain async.

The package's SSP protocol keeps, for each client, how many pushes it has made (``self.pushes``)
and the clients that pushed and wait for their reply (``self.held``). After each push (and when
a client is lost) it calls release(): complete the gate in it. A lost client (not in ``live``)
never waits. The grader registers your class in the package's protocol registry (PROTOCOLS) for
one run, then checks it:

    python -m repro.lab grade exercises/05_ssp_gate.py
"""
from repro.api import SSP

EXERCISE = "ssp_gate"


class BoundedSSP(SSP):
    def release(self, live):
        """The held clients that may go on now (removed from ``self.held``), as a tuple.
        ``self.bound`` is s; ``live`` the clients still in the run."""
        slowest = min((self.pushes[k] for k in live), default=0)   # the slowest live client's pushes
        go, wait = [], []
        for k in self.held:
            ahead = self.pushes[k] - slowest   # how many pushes client k is ahead of the slowest
            may_go = True                      # your gate here
            (go if may_go else wait).append(k)
        self.held = wait
        return tuple(go)
