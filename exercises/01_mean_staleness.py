"""Exercise 1: the mean staleness of N equally fast clients.

N clients train asynchronously through one parameter server (Downpour): each fetches the
server's parameters, takes one minibatch step (nsync = 1) and pushes its gradient; the server
applies every push as it arrives. A push's staleness is the number of server updates applied
between the client's fetch and its push. Every client's step takes exactly as long.

Question: what is the mean staleness of a push, as a function of N?

Fill in mean_staleness below, then check it:

    python -m repro.lab grade exercises/01_mean_staleness.py

The grader compares your answer with the theory and with the simulator (N = 2, 4, 8).
"""
EXERCISE = "mean_staleness"


def mean_staleness(num_clients: int) -> float:
    """The mean staleness, in server versions, of a push of ``num_clients`` equally fast
    asynchronous clients (nsync = 1)."""
    return None   # your answer: a formula in num_clients
