"""Joining a running real run from a test (issue 20): the run's config with joins served on a
given loopback port (:func:`elastic_cfg`), a joiner process in a session of its own
(:func:`start_joiner`), waiting for a line in a log (:func:`wait_log`), and the join keys still
in a run's store (:func:`join_keys_left`).
"""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time

from repro.config.settings import BackendConfig, to_dict
from tests.helpers.paths import ROOT
from tests.helpers.runs import real_cfg

JOINER = """
import json, sys
from repro.config.checks import from_dict
from repro.real.elastic import join_run
sys.exit(join_run(from_dict(json.loads(sys.argv[1]))))
"""


def elastic_cfg(port: int, **changes):
    backend = BackendConfig(name="real", timeout_s=30.0, client_timeout_s=10.0, client_device="cpu",
                            master_port=port, max_clients=changes.pop("max_clients", None))
    return real_cfg(num_epochs=changes.pop("num_epochs", 6.0), backend=backend, **changes)


def start_joiner(tmp_path, cfg, name="joiner", **backend):
    joiner = cfg.replace(backend=dataclasses.replace(cfg.backend, join=f"127.0.0.1:{cfg.backend.master_port}",
                                                     master_port=0, **backend))
    log = open(tmp_path / f"{name}.log", "w")
    return subprocess.Popen([sys.executable, "-c", JOINER, json.dumps(to_dict(joiner))], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_log(proc, path, pattern, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while not re.search(pattern, path.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, f"no {pattern!r} in {path.name}"
        time.sleep(0.1)


def join_keys_left(port: int, timeout_s: float = 10) -> list[str]:
    """The keys of joins still in the store of the run listening at ``port`` (the ticket counter
    aside), once they are gone or after ``timeout_s`` (they are deleted just after the join)."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=10))
    deadline = time.monotonic() + timeout_s
    while True:
        left = [k for k in store.list_keys() if k.startswith("repro/join/") and k != "repro/join/count"]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
