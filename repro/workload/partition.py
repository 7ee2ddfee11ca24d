"""Which training samples each client holds (``data.partition``, ``data.slow_client_classes``; the
schemes in docs/configuration.md): a pure function of the labels, the settings and ``seed``, so
client ``k`` holds the same samples in both drivers. ``by_class`` with more clients than classes
shares a class equally among its holders; ``dirichlet`` is drawn again while a client holds less
than a minibatch (Hsu, Qi & Brown 2019, "Measuring the effects of non-identical data distribution
for federated visual classification")."""
from __future__ import annotations

import numpy as np

from repro.config.settings import RunConfig, slow_client
from repro.errors import ConfigError

DIRICHLET_TRIES = 100
_STREAM = 0x9A27   # the partition's own generator stream, apart from the clients' data orders


def split(cfg: RunConfig, labels: np.ndarray) -> list[np.ndarray] | None:
    """The sorted training-set indices of clients 1..N (item k - 1: client k); None when all read the whole set."""
    data, n = cfg.data, cfg.num_clients
    labels = np.asarray(labels)
    if data.partition == "iid" and data.slow_client_classes is None:
        return None
    rng = np.random.default_rng([cfg.seed, _STREAM])
    everyone = np.arange(len(labels))
    if data.slow_client_classes is None:
        return _checked(cfg, _split(data.partition, everyone, labels, n, data.alpha, rng, cfg.algo.batch_size))
    slow = slow_client(cfg)
    mine = np.isin(labels, data.slow_client_classes)
    if mine.all():   # nothing left for the others: the slow client's classes are at fault, not the split
        raise ConfigError("data.slow_client_classes", list(data.slow_client_classes),
                          f"some of the training set's classes, not all of them ({len(np.unique(labels))}): "
                          f"the other {n - 1} clients need classes the slow client does not hold")
    others = _split(data.partition, everyone[~mine], labels, n - 1, data.alpha, rng, cfg.algo.batch_size)
    return _checked(cfg, others[:slow - 1] + [everyone[mine]] + others[slow - 1:], slow)


def class_counts(cfg: RunConfig, labels: np.ndarray, num_classes: int) -> list[list[int]] | None:
    """Samples of each class (columns) each client holds (rows); None when all read the whole set."""
    if (parts := split(cfg, labels)) is None:
        return None
    labels = np.asarray(labels)
    return [np.bincount(labels[p], minlength=num_classes).astype(int).tolist() for p in parts]


def _split(scheme: str, idx: np.ndarray, labels: np.ndarray, n: int, alpha: float,
           rng: np.random.Generator, min_size: int) -> list[np.ndarray]:
    """``idx`` split over ``n`` clients by ``scheme`` (``iid``: each of them all of ``idx``); by_class and
    dirichlet deal each class's shuffled samples out, dirichlet drawn again while a client holds too few."""
    if scheme == "iid":
        return [idx] * n
    if scheme == "shards":
        return [np.sort(p) for p in np.array_split(rng.permutation(idx), n)]
    classes = np.unique(labels[idx])
    for _ in range(DIRICHLET_TRIES if scheme == "dirichlet" else 1):
        parts: list[list[np.ndarray]] = [[] for _ in range(n)]
        for j, c in enumerate(classes):
            members = rng.permutation(idx[labels[idx] == c])
            if scheme == "by_class":   # more clients than classes: class j shared by clients j, j + C, ...
                holders = list(range(j % n, n, len(classes))) if n > len(classes) else [j % n]
                pieces = zip(holders, np.array_split(members, len(holders)))
            else:   # dirichlet (Hsu et al. 2019): cut at the cumulative q ~ Dir(alpha 1_n)
                q = rng.dirichlet(np.full(n, alpha))
                pieces = enumerate(np.split(members, (np.cumsum(q)[:-1] * len(members)).astype(int)))
            for holder, piece in pieces:
                parts[holder].append(piece)
        out = [np.sort(np.concatenate(p)) if p else np.empty(0, dtype=idx.dtype) for p in parts]
        if min(map(len, out)) >= min_size:   # dirichlet: drawn again while a client holds less
            return out
    return out   # by_class, or dirichlet still short: _checked names the client and the key


def _checked(cfg: RunConfig, parts: list[np.ndarray], slow: int | None = None) -> list[np.ndarray]:
    """Every client holds at least one minibatch, or bad input naming the key to change."""
    need = cfg.algo.batch_size
    for k, part in enumerate(parts, start=1):
        if len(part) >= need:
            continue
        data = cfg.data
        if k == slow:
            raise ConfigError("data.slow_client_classes", list(data.slow_client_classes),
                              f"classes holding at least algo.batch_size={need} training samples together "
                              f"(the slow client {k} would hold {len(part)})")
        if slow is not None and data.partition == "iid":   # each other client holds every other class
            raise ConfigError("data.slow_client_classes", list(data.slow_client_classes),
                              f"classes that leave the other clients at least algo.batch_size={need} training "
                              f"samples (client {k} would hold {len(part)}): name fewer classes")
        key, value = ("data.alpha", data.alpha) if data.partition == "dirichlet" else ("data.partition", data.partition)
        tries = f" in {DIRICHLET_TRIES} draws" if data.partition == "dirichlet" else ""
        raise ConfigError(key, value, f"a split that leaves each of the {cfg.num_clients} clients at least "
                          f"algo.batch_size={need} training samples (client {k} would hold {len(part)}{tries}): "
                          "use fewer clients, a smaller algo.batch_size"
                          + (", or a larger data.alpha" if data.partition == "dirichlet" else
                             ", or another data.partition")
                          + (", or fewer data.slow_client_classes" if slow is not None else ""))
    return parts
