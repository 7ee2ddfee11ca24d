"""The run folder: the contract between the drivers (writers) and :mod:`repro.analysis` (reader).

``results/<exp_name>/<job>/`` holds

* ``config.json``  -- the fully resolved configuration (nested dict of the config dataclasses),
  plus measured values such as a calibrated compute time;
* ``updates.csv``  -- one row per push the server applied, columns :data:`UPDATE_COLUMNS`;
* ``evals.csv``    -- one row per evaluation of the server's parameters, :data:`EVAL_COLUMNS`;
* ``summary.json`` -- :data:`SUMMARY_KEYS`; ``status`` is one of :data:`STATUSES`;
* ``checkpoint.pt`` -- the latest server checkpoint (tensors and numbers only), when enabled.

``time_s`` is virtual time for the simulator and wall time for the real driver; the ``clock``
column says which (``virtual`` or ``wall``). Column names are the paper's vocabulary and are the
same in config keys, dataclass fields and plot labels.
"""
from __future__ import annotations

CONFIG_FILE = "config.json"
UPDATES_FILE = "updates.csv"
EVALS_FILE = "evals.csv"
SUMMARY_FILE = "summary.json"
CHECKPOINT_FILE = "checkpoint.pt"

UPDATE_COLUMNS = (
    "version",        # server version after this push was applied (1, 2, 3, ...)
    "time_s",         # when the server applied it (seconds since the run started)
    "clock",          # "virtual" (sim) or "wall" (real)
    "client",         # client id, 1..num_clients (the client's rank in the real driver)
    "read_version",   # server version the client last fetched before computing this push
    "staleness",      # version before apply - read_version: updates the client did not see
    "num_steps",      # local minibatch steps in this push (always nsync; a replay copies the record)
    "num_samples",    # training samples behind this push
    "samples_seen",   # cumulative samples over all applied pushes
    "epoch",          # samples_seen / training-set size
    "train_loss",     # mean minibatch loss over the pushed segment
    "train_error",    # fraction misclassified over the pushed segment
)

EVAL_COLUMNS = (
    "version",
    "time_s",
    "clock",
    "epoch",
    "samples_seen",
    "test_loss",
    "test_error",
    "train_loss",     # on a fixed subset of the training set, server parameters
    "train_error",
)

STATUSES = ("running", "completed", "completed_degraded", "diverged", "interrupted", "failed")
FINISHED_STATUSES = ("completed", "completed_degraded", "diverged")

SUMMARY_KEYS = (
    "status",         # one of STATUSES
    "backend",        # "sim" or "real"
    "clock",
    "version",        # final server version
    "samples_seen",
    "epoch",
    "time_s",         # final time on the run's clock
    "wall_time_s",    # wall time the run took
    "final",          # {"test_loss", "test_error", "train_loss", "train_error"} at the last eval
    "time_to_target", # {"<target_error>": time_s or null}: first eval with train_error <= target
    "events",         # list of {"type": "client_lost"|"resumed"|"diverged", "time_s", "version", ...}
    "message",        # human-readable reason for a non-completed status, else ""
)
