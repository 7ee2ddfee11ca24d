"""What the test modules share; no test lives here. Import as ``from tests.helpers.NAME import ...``.

* :mod:`~tests.helpers.paths`: ``ROOT``, the repository's root folder.
* :mod:`~tests.helpers.runs`: runs a test starts: the short simulator run of the fault cases, the
  command line, a real run launched in a session of its own, a live holder of a folder's lock.
* :mod:`~tests.helpers.tables`: reading a run folder's files (``table_bytes`` for exact
  comparison, ``table_frames`` as DataFrames), snapshots of a folder, and line-level damage.
* :mod:`~tests.helpers.processes`: process trees and sessions under ``/proc``, free ports,
  the TCP sockets of a set of processes (``/proc/net/tcp``).
* :mod:`~tests.helpers.disk`: a fake full disk.
* :mod:`~tests.helpers.grids`: a figure's Hydra sweep expanded into its runs.
* :mod:`~tests.helpers.invariants`: the run-folder invariant every fault case ends with.
* :mod:`~tests.helpers.fake_runs`: a synthetic results tree for the analysis tests.
* :mod:`~tests.helpers.docs_commands`: the shell commands of the markdown, by tier.

Fixtures live in ``tests/conftest.py``.
"""
