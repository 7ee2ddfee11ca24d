"""Reference solution of exercise 7: backup workers for a sync round.

A sync round waits for every client's push, so one slow client slows every round. Chen, Pan,
Monga, Bengio and Jozefowicz (2016) add b *backup workers*: a round closes at the first N - b
pushes; the b late clients are sent the new parameters and start the next round with everyone
(their work is dropped).

The package's Sync protocol asks needed() how many pushes close a round. Complete it: b is
``self.backups``; clients that joined during this round (``self.joining``) count only from the
next. A round needs at least one push. The grader registers your class in the package's
protocol registry (PROTOCOLS) for one run, then checks it:

    python -m repro.lab grade exercises/07_backup_workers.py
"""
from repro.api import Sync

EXERCISE = "backup_workers"


class BackupSync(Sync):
    def needed(self, live):
        """How many pushes close this round; ``live``: the clients still in the run."""
        counted = set(live) - self.joining   # the clients live at the round's start
        return max(1, len(counted) - self.backups)   # the first N - b pushes, at least one
