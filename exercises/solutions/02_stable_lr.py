"""Reference solution of exercise 2 (the largest stable learning rate at staleness tau)."""
import math

EXERCISE = "stable_lr"


def largest_stable_lr(staleness: int) -> float:
    # Levin & May (1976): x[t+1] = x[t] - a x[t - tau] is stable iff a < 2 sin(pi / (4 tau + 2));
    # a = lr * l, and the largest curvature l_max = 1 decides
    return 2 * math.sin(math.pi / (4 * staleness + 2))
