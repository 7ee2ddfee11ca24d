"""Reference solution of exercise 3 (sync's throughput over async's, exponential step times)."""
EXERCISE = "sync_ratio"


def sync_async_ratio(num_clients: int) -> float:
    # async: N steps per mean step time; sync: N steps per round, and a round waits for the
    # slowest of N exponentials, H_N = 1 + 1/2 + ... + 1/N mean step times
    return 1 / sum(1 / k for k in range(1, num_clients + 1))
