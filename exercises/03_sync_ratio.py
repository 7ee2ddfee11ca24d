"""Exercise 3: what a barrier costs.

N clients each take one minibatch step at a time (nsync = 1); a step's time is random,
exponentially distributed with the same mean for every client; communication is free.

* async: the server applies each push as it arrives; the client starts its next step at once.
* sync: each round, every client takes one step from the same parameters; the server waits for
  all N pushes and applies their mean; then the next round starts.

Question: the ratio of the samples applied per second, sync / async, as a function of N.

Fill in sync_async_ratio below, then check it:

    python -m repro.lab grade exercises/03_sync_ratio.py

The grader compares your answer with the theory (N = 2, 4, 8) and with the simulator.
"""
EXERCISE = "sync_ratio"


def sync_async_ratio(num_clients: int) -> float:
    """Sync's applied samples per second over async's, ``num_clients`` clients with exponential
    step times (nsync = 1, free communication)."""
    return None   # your answer
