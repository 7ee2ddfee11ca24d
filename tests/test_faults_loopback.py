"""Guarantee 9: loopback means loopback. A single-node real run listens on, and connects from,
loopback only, even when GLOO_SOCKET_IFNAME names another interface.

Part of the fault-injection suite (tests/test_faults_*.py; the map of guarantees to files is
in :mod:`tests.helpers.invariants`): each case states its fault and guarantee and ends with
:func:`~tests.helpers.invariants.check_run_folder`.
"""
from __future__ import annotations

import signal

import pytest

from tests.helpers.invariants import check_run_folder
from tests.helpers.processes import (
    assert_no_leftovers,
    non_loopback_interface,
    proc_net_address,
    session_processes,
    tcp_sockets,
)
from tests.helpers.runs import launch_real, real_cfg, wait_rows


@pytest.mark.slow
@pytest.mark.skipif(non_loopback_interface() is None, reason="no network interface besides loopback")
def test_9_single_node_run_listens_on_loopback_only(tmp_path, monkeypatch):
    """Fault: GLOO_SOCKET_IFNAME names the machine's network interface (exported for multi-node
    torchrun) while a single-node real run starts. Guarantee 9: the server and its clients
    listen on, and connect from, loopback only (their sockets in /proc/net/tcp{,6} while they
    train); the run then ends normally on SIGINT."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", non_loopback_interface())
    proc, run_dir = launch_real(tmp_path, real_cfg(num_epochs=500.0, checkpoint_every=5))
    try:
        wait_rows(proc, run_dir, 10)
        pids = session_processes(proc.pid)
        sockets = tcp_sockets(pids)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        assert_no_leftovers(proc)
    assert len(pids) >= 3 and any(state == "0A" for _, _, state in sockets), (pids, sockets)
    exposed = [(pid, str(proc_net_address(a.split(":")[0])), state) for pid, a, state in sockets
               if not proc_net_address(a.split(":")[0]).is_loopback]
    assert not exposed, f"sockets on a non-loopback address: {exposed}"
    check_run_folder(run_dir, "interrupted")
