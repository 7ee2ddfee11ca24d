"""Exercise 2: the largest stable learning rate at staleness tau.

The lab's quadratic is f(w) = 1/2 sum_i l_i w_i^2 with curvatures l_i from 0.01 to 1 (so
l_max = 1) and exact gradients. Gradient descent whose every gradient is tau updates old,

    w[t+1] = w[t] - lr * grad f(w[t - tau]),

is what N = tau + 1 equally fast asynchronous clients do (nsync = 1). With tau = 0 (one
client) it converges for every lr below 2 / l_max = 2.

Question: what is the largest stable learning rate as a function of the staleness tau? (The
class asks about tau = 3: four clients.)

Fill in largest_stable_lr below, then check it:

    python -m repro.lab grade exercises/02_stable_lr.py

The grader compares your answer with the published bound at tau = 0, 1, 3 and trains the
quadratic with 4 clients just below and just above your answer.
"""
EXERCISE = "stable_lr"


def largest_stable_lr(staleness: int) -> float:
    """The largest learning rate at which gradient descent with ``staleness``-step-old gradients
    still converges on the lab's quadratic (l_max = 1)."""
    return None   # your answer
