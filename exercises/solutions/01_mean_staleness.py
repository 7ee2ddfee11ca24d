"""Reference solution of exercise 1 (the mean staleness of N equally fast clients)."""
EXERCISE = "mean_staleness"


def mean_staleness(num_clients: int) -> float:
    # between a client's fetch and its push each of the other N - 1 clients pushes once
    return num_clients - 1
