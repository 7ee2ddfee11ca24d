"""Guarantee 5, full disk: every ending is terminal. A disk that fills up mid-run (rows,
checkpoints, everything) fails the run cleanly, and with room again it resumes.
(Signals, the other endings of guarantee 5: tests/test_faults_signals.py.)

Part of the fault-injection suite (tests/test_faults_*.py; the map of guarantees to files is
in :mod:`tests.helpers.invariants`): each case states its fault and guarantee and ends with
:func:`~tests.helpers.invariants.check_run_folder`.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.sim.driver import simulate
from tests.helpers.disk import FullDisk, dev_full_temp, read_only_possible, run_read_only
from tests.helpers.grids import cli_run
from tests.helpers.invariants import check_run_folder
from tests.helpers.paths import ROOT
from tests.helpers.runs import CLI_ARGS, SIM, cli_cfg, sim_killed_at
from tests.helpers.tables import changed, snapshot, summary_of, table_bytes


DISK_FULL = [
    # found by this suite: the push was counted before its row was written
    pytest.param(("row", 13), {"rows"}, id="row-write-fails"),
    pytest.param(("checkpoint", 3), {"checkpoints"}, id="checkpoint-write-fails"),
    pytest.param(("checkpoint", 3), {"rows", "checkpoints", "json"}, id="everything-fails"),
]


@pytest.mark.parametrize("at,fails", DISK_FULL)
def test_5_full_disk_fails_the_run_cleanly(tmp_path, monkeypatch, reference, at, fails):
    """Fault: the disk fills up mid-run (a row write, or a checkpoint write at version 15, or
    every write from then on but the summary the .reserve file makes room for). Guarantee 5:
    the run ends ``failed`` with a message naming the error, no temp file remains, the last good
    checkpoint (version 10) still loads with weights_only=True; with room again it resumes to
    the uninterrupted run's tables."""
    run_dir = tmp_path / "run"
    disk = FullDisk(monkeypatch, at, fails)
    try:
        summary = simulate(SIM, run_dir)
    except OSError:
        summary = summary_of(run_dir)
    assert disk.full
    assert summary["status"] == "failed", summary
    assert re.search(r"OSError|No space left|disk", summary["message"]), summary["message"]
    assert not list(run_dir.rglob("*.tmp"))
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["server"]["version"] == 10
    check_run_folder(run_dir, "failed")
    monkeypatch.undo()   # room again
    assert simulate(SIM.replace(resume=True), run_dir)["status"] == "completed"
    assert table_bytes(run_dir) == reference
    check_run_folder(run_dir, "completed")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("name,written", [("checkpoint.pt.tmp", "checkpoint.pt"), ("timings.csv", "timings.csv")])
def test_5_a_full_disk_is_named_with_its_folder_and_file(tmp_path, monkeypatch, name, written):
    """issue 32 item 16. Fault: the kernel's own ENOSPC (the file is /dev/full), under torch's
    zip writer for a checkpoint, which said only "unexpected pos 308288 vs 308216". Guarantee:
    the run ends ``failed`` with a message naming the cause, the folder and the file."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if name.endswith(".tmp"):   # a temporary file of the write's own, never a link found there
        dev_full_temp(monkeypatch, written)
    else:
        (run_dir / name).symlink_to("/dev/full")
    why = f"no space left on the device holding {run_dir} while writing {written}"
    with pytest.raises(OSError, match=re.escape(why)):
        simulate(SIM, run_dir)
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and why in summary["message"], summary["message"]
    assert "unexpected pos" not in summary["message"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_5_the_command_line_says_a_full_disk_in_one_line(tmp_path, monkeypatch, capsys):
    """issue 32 item 16, on the command line: the cause in one line, not a traceback; exit 1."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dev_full_temp(monkeypatch, "checkpoint.pt")
    # in the test's process (what it says and its exit status: tests/helpers/grids.cli_run)
    done = cli_run(monkeypatch, capsys, *CLI_ARGS, f"hydra.run.dir={run_dir}")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"failed: no space left on the device holding {run_dir} while writing checkpoint.pt\n" in done.stderr


def finished_for_the_cli(tmp_path: Path) -> Path:
    """A finished run in the folder the command line's CLI_ARGS run writes (hydra.run.dir)."""
    run_dir = tmp_path / "results" / "run"
    assert simulate(cli_cfg(), run_dir)["status"] == "completed"
    return run_dir


def read_only_cli(tmp_path: Path, run_dir: Path, *args: str):
    """The command line on CLI_ARGS writing ``run_dir``, with its parent read-only (and a temp
    folder of its own)."""
    if not read_only_possible(tmp_path):
        pytest.skip("this machine cannot make a folder read-only (unshare, user namespaces)")
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    return run_read_only(run_dir.parent, sys.executable, "-m", "repro.run", *CLI_ARGS,
                         f"hydra.run.dir={run_dir}", *args, cwd=ROOT, env=env, timeout=120)


def test_two_writers_of_one_file_never_share_its_temporary_file(tmp_path):
    """Fault: every write of NAME went through NAME.tmp: a second writer meanwhile (two analyses
    drawing into one folder) truncated the first's, wrote through it and renamed it, and the first
    wrote on into the renamed file, then failed (FileNotFoundError). Guarantee: each write has a
    temporary file of its own; the last rename wins, whole."""
    from repro.files.storage import atomic_write

    path = tmp_path / "fig1.csv"

    def first(f):
        f.write(b"first ")
        atomic_write(path, lambda g: g.write(b"second"))   # another writer, meanwhile
        f.write(b"whole")

    atomic_write(path, first)
    assert path.read_bytes() == b"first whole" and os.listdir(tmp_path) == ["fig1.csv"]


def test_a_file_in_the_way_of_a_temporary_name_is_neither_written_through_nor_taken(tmp_path):
    """Fault: a NAME.tmp already there (a SIGKILLed write's, or a link) was opened as it was: a
    link was written through, into the file it names, and then renamed into place as NAME."""
    from repro.files.storage import write_json

    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("untouched")
    (tmp_path / "summary.json.tmp").symlink_to(elsewhere)
    write_json(tmp_path / "summary.json", {"status": "completed"})
    assert elsewhere.read_text() == "untouched" and not (tmp_path / "summary.json").is_symlink()
    assert json.loads((tmp_path / "summary.json").read_text()) == {"status": "completed"}


def test_the_temporary_files_a_sigkill_left_in_a_run_folder_go_when_the_run_resumes(tmp_path):
    """A SIGKILL mid-write leaves that write's NAME.RANDOM.tmp (no code runs to remove it): the run
    folder's next run, its one writer, removes its own files' (and an older version's NAME.tmp)."""
    run_dir = tmp_path / "run"
    sim_killed_at(SIM, run_dir, 12)
    strays = ["checkpoint.pt.0123456789abcdef.tmp", "summary.json.tmp", "updates.csv.fedcba9876543210.tmp"]
    for name in [*strays, "notes.tmp"]:   # the last is not the run's: kept
        (run_dir / name).write_bytes(b"half")
    assert simulate(SIM.replace(resume=True), run_dir)["status"] == "completed"
    assert sorted(p.name for p in run_dir.glob("*.tmp")) == ["notes.tmp"]
    (run_dir / "notes.tmp").unlink()
    check_run_folder(run_dir, "completed")


def test_a_finished_run_in_a_read_only_folder_is_skipped_without_writing(tmp_path):
    """issue 32 item 16. Fault: the results folder is read-only (a real read-only mount) and
    the run is finished: it said "Read-only file system", exit 1. Guarantee: skipped as anywhere
    else (exit 0), nothing written, no logging error, no Hydra record left in the temp folder."""
    run_dir = finished_for_the_cli(tmp_path)
    before = snapshot(run_dir)
    done = read_only_cli(tmp_path, run_dir)
    assert done.returncode == 0, done.stderr
    assert "skip" in done.stderr and "Traceback" not in done.stderr and "Logging error" not in done.stderr
    assert changed(before, snapshot(run_dir)) == []
    assert not list((tmp_path / "tmp").iterdir())


@pytest.mark.parametrize("resume", [False, True])
def test_an_unfinished_run_in_a_read_only_folder_is_refused_naming_it(tmp_path, resume):
    """issue 32 item 16. Fault: the read-only folder holds an interrupted run. Guarantee: exit 2
    with one line saying the folder is read-only (what resume=true or force=true would do cannot
    be done there), nothing written."""
    run_dir = finished_for_the_cli(tmp_path)
    summary_path = run_dir / "summary.json"
    summary_path.write_text(json.dumps({**json.loads(summary_path.read_text()), "status": "interrupted"}))
    before = snapshot(run_dir)
    refused = read_only_cli(tmp_path, run_dir, *(["resume=true"] if resume else []))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "read-only" in refused.stderr, refused.stderr
    assert str(run_dir) in refused.stderr
    assert changed(before, snapshot(run_dir)) == []


def test_an_experiments_grid_in_a_read_only_folder_is_refused_naming_it(tmp_path):
    """An experiment's grid whose folder exists (an earlier launch) on read-only storage: Hydra
    writes multirun.yaml into it and died with a raw "Read-only file system". Guarantee: exit 2
    with one line naming the folder, before any work."""
    if not read_only_possible(tmp_path):
        pytest.skip("this machine cannot make a folder read-only (unshare, user namespaces)")
    (tmp_path / "results" / "fig1").mkdir(parents=True)
    (tmp_path / "tmp").mkdir()
    refused = run_read_only(tmp_path / "results", sys.executable, "-m", "repro.run", "+exp=fig1",
                            f"results_dir={tmp_path / 'results'}", cwd=ROOT, timeout=120,
                            env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "read-only" in refused.stderr, refused.stderr
    assert str(tmp_path / "results" / "fig1") in refused.stderr and "Traceback" not in refused.stderr
    assert list((tmp_path / "results" / "fig1").iterdir()) == []


def test_a_new_run_in_a_read_only_folder_is_refused_naming_it(tmp_path):
    """issue 32 item 16. Fault: the results folder is read-only and holds no run yet: Hydra died
    making the run folder with a raw "Read-only file system" (exit 1). Guarantee: exit 2 with
    one line naming the folder, before any work."""
    if not read_only_possible(tmp_path):
        pytest.skip("this machine cannot make a folder read-only (unshare, user namespaces)")
    (tmp_path / "results").mkdir()
    (tmp_path / "tmp").mkdir()
    run_dir = tmp_path / "results" / "new" / "run"
    refused = run_read_only(tmp_path / "results", sys.executable, "-m", "repro.run", *CLI_ARGS,
                            f"hydra.run.dir={run_dir}", cwd=ROOT, timeout=120,
                            env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "read-only" in refused.stderr, refused.stderr
    assert str(run_dir) in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "results" / "new").exists()


def test_a_read_only_folder_is_told_by_storage_alone(tmp_path):
    """Issue 31: what makes a folder read-only (an errno a write raised, or no write access
    asked beforehand) was tested in six places of the run folder and the entry point; now
    repro/files/storage.py says it, ``write_denied`` (an errno a write raised) and
    ``is_read_only`` (asked beforehand), and those modules test nothing of their own."""
    import errno
    import inspect

    from repro import run
    from repro.files.storage import is_read_only, write_denied
    from repro.runs import folder

    assert all(write_denied(OSError(code, "x")) for code in (errno.EROFS, errno.EACCES, errno.EPERM))
    assert not write_denied(OSError(errno.ENOSPC, "x")) and not is_read_only(tmp_path)
    for module in (run, folder):
        source = inspect.getsource(module)
        assert "os.access" not in source and "READ_ONLY" not in source, module.__name__


def test_5_a_full_disk_under_the_real_server_is_said_in_one_line_not_a_traceback(tmp_path, monkeypatch, capfd):
    """Fault: the disk fills as the real server writes after a push (a 450 KB tmpfs filled at
    version 1578 of a real run). Its receiver printed a traceback, as for a bug, before the
    one line that names the disk. Guarantee 5: the run fails naming the device, the folder and
    the file, and nothing prints a traceback."""
    import errno

    from repro.config.settings import BackendConfig
    from repro.files.storage import disk_error
    from repro.real.frames import Header, Kind
    from repro.real.server import Dispatcher
    from repro.runs.core import RunCore
    from repro.runs.folder import run_folder
    from repro.runtime import StopRequest
    from repro.workload.start import build_problem

    class Channel:
        def send(self, header, frame):
            pass

        def post(self, frame):
            pass

    full = disk_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "updates.csv")
    cfg = SIM.replace(backend=BackendConfig(name="real"))
    with run_folder(cfg, tmp_path) as run:
        run.core = core = RunCore(cfg, build_problem(cfg, torch.device("cpu")), tmp_path, clock="wall", backend="real")
        loop = Dispatcher(cfg, core, {k: Channel() for k in (1, 2, 3)}, StopRequest())
        core.begin([1, 2, 3])
        loop.sent_version = {1: 0, 2: 0, 3: 0}
        monkeypatch.setattr(core, "settle", lambda now, **hooks: (_ for _ in ()).throw(full))
        numel = core.server.params.numel()
        header = Header(Kind.PUSH, 1, 0, numel, dict(num_steps=2, num_samples=64, train_loss=1.0, train_error=0.5,
                                                     stream_position=(0, 0)))
        assert loop.on_message(1, header, torch.zeros(numel)) is False and loop.closed
        summary = core.finish(*core.final_status(interrupted=False), clean=False)
    assert summary["status"] == "failed" and str(full) in summary["message"], summary["message"]
    assert "no space left on the device holding" in summary["message"]
    assert "Traceback" not in capfd.readouterr().err


def test_a_write_a_read_only_file_system_refuses_names_the_folder_and_the_file(tmp_path):
    """Fault: a write into a folder on a read-only file system (a real read-only mount) said
    "[Errno 30] Read-only file system: '.../summary.json.tmp'": the clean-up of the temp file
    is refused there too, and its raw error replaced the one that names the folder and the
    file. Guarantee: the error says the folder is on a read-only file system, and which file."""
    if not read_only_possible(tmp_path):
        pytest.skip("this machine cannot make a folder read-only (unshare, user namespaces)")
    write = "import sys; from pathlib import Path; from repro.files.storage import write_json; " \
            "write_json(Path(sys.argv[1]) / 'summary.json', {})"
    done = run_read_only(tmp_path, sys.executable, "-c", write, str(tmp_path), cwd=ROOT, timeout=60)
    said = done.stderr.strip().splitlines()[-1]   # (the traceback's last line: what was raised)
    assert said == f"OSError: [Errno 30] {tmp_path} is on a read-only file system while writing summary.json", said


# A simulator run whose folder turns read-only under it, at its first checkpoint (a remount, in
# namespaces of its own: run with unshare -rm, as run_read_only does)
TURNS_READ_ONLY = """
import subprocess, sys
from pathlib import Path
from repro.runs.core import RunCore
from repro.sim.driver import simulate
from tests.helpers.runs import SIM
run_dir, save = Path(sys.argv[1]), RunCore.save_checkpoint

def turned_read_only(core):
    subprocess.run(["sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0"', str(run_dir)], check=True)
    RunCore.save_checkpoint = save
    save(core)

RunCore.save_checkpoint = turned_read_only
simulate(SIM, run_dir)
"""


def test_a_folder_that_turns_read_only_mid_run_is_named_for_the_summary_too(tmp_path):
    """Fault: the results folder turns read-only under a running run (a real remount). The run
    failed at its checkpoint, naming it; the summary it could then not write was said as the
    raw error of deleting the room kept for it ('Read-only file system: .../.reserve'): that
    room is for a full disk, and a read-only one refuses the delete too; and said twice (the
    ending was tried again as if the driver had returned without a status). Guarantee: the
    checkpoint's error is the run's, and the summary's names the folder as read-only, once."""
    if not read_only_possible(tmp_path):
        pytest.skip("this machine cannot make a folder read-only (unshare, user namespaces)")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    done = subprocess.run(["unshare", "-rm", sys.executable, "-c", TURNS_READ_ONLY, str(run_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    read_only = f"[Errno 30] {run_dir} is on a read-only file system while writing"
    assert done.stderr.strip().splitlines()[-1] == f"OSError: {read_only} checkpoint.pt", done.stderr
    assert f"could not record the end of {run_dir}: {read_only} summary.json\n" in done.stderr, done.stderr
    assert ".reserve" not in done.stderr
    assert done.stderr.count("could not record the end") == 1, done.stderr   # (the ending was tried twice)


# A command-line run whose folder turns read-only after the run took it, before its first line
# into run.log (Hydra's handler opens the file at that line): a remount as the run core is made
TURNS_READ_ONLY_AT_START = """
import subprocess, sys
from pathlib import Path
import repro.run
from repro.runs.core import RunCore
run_dir, made = Path(sys.argv[1]), RunCore.__init__

def turned_read_only(*args, **kwargs):
    subprocess.run(["sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0"', str(run_dir)], check=True)
    made(*args, **kwargs)

RunCore.__init__ = turned_read_only
sys.argv = ["repro.run", *sys.argv[2:], f"hydra.run.dir={run_dir}"]
repro.run.cli()
"""


@pytest.mark.parametrize("backend", ["sim", pytest.param("real", marks=pytest.mark.slow)])
def test_a_folder_that_turns_read_only_before_the_first_log_line_is_named(tmp_path, backend):
    """Fault: the run folder turns read-only (a real remount) after the run took it and before
    its first log line; the raw error of opening run.log (Hydra's handler opens it lazily) was
    the run's last word: "failed: Read-only file system", naming neither folder nor file; then
    it was named, but as run.log's, whose first line (could not record the end) raised over the
    write that failed first, .reserve's. Guarantee: exit 1, the failure in one line naming the
    folder (as a full disk is named) and the first write it refused."""
    if not read_only_possible(tmp_path):
        pytest.skip("this machine cannot make a folder read-only (unshare, user namespaces)")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    done = subprocess.run(["unshare", "-rm", sys.executable, "-c", TURNS_READ_ONLY_AT_START, str(run_dir),
                           *CLI_ARGS, f"backend={backend}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert re.search(rf"^failed: {re.escape(str(run_dir))} is on a read-only file system while writing \.reserve\n",
                     done.stderr, re.M), done.stderr
    assert "Read-only file system" not in done.stderr and "Traceback" not in done.stderr, done.stderr
