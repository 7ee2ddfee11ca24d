"""The classroom's exercises (``python -m repro.lab grade FILE``, issue 35): every reference
solution passes, every untouched stub fails with its hint, the typical wrong answers fail naming
the difference, and a file that cannot be loaded exits 2 with one line, never a traceback.

Gradings run in this process (``grader.grade``: what the command runs in a child process of its
own); a few tests run the command itself. Each grading is a few tiny simulator runs of the lab's quadratic.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import repro.api as asgd
from repro.lab import grader
from repro.lab.__main__ import EXERCISES_HELP
from tests.helpers.paths import ROOT

EXERCISES = ROOT / "exercises"
STUBS = sorted(EXERCISES.glob("[0-9]*.py"))
SOLUTIONS = sorted((EXERCISES / "solutions").glob("[0-9]*.py"))
# A grading composes the lab's quadratic for each of its runs (repro.lab.harness.quadratic calls
# asgd.configure, which composes anew on every call): a hundred compositions of two override lists
# in this file, ~0.07 s each. The same overrides give the same frozen RunConfig, so the gradings in
# this process share one of each; a grader process of its own composes as ever.
_CONFIGURE_ONCE = functools.cache(asgd.configure)


@pytest.fixture(autouse=True)
def _configured_once(monkeypatch):
    monkeypatch.setattr(asgd, "configure", _CONFIGURE_ONCE)


def graded(path: Path, capsys) -> tuple[int, str, str]:
    code = grader.grade(str(path))
    out, err = capsys.readouterr()
    return code, out, err


def edited(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """The reference solution ``name`` with ``old`` replaced by ``new`` (a typical mistake)."""
    text = (EXERCISES / "solutions" / name).read_text()
    assert old in text, (name, old)
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


def failing(tmp_path: Path, capsys, name: str, old: str, new: str) -> str:
    """The report on the reference ``name`` with ``old`` made ``new``, which must fail."""
    code, out, err = graded(edited(tmp_path, name, old, new), capsys)
    assert code == grader.EXIT_FAILED, out + err
    assert "Traceback" not in out + err
    return out


def test_every_exercise_has_a_stub_a_solution_and_a_line_in_the_help():
    names = grader.EXERCISES.names()
    assert len(names) >= 6
    assert [p.name for p in STUBS] == [p.name for p in SOLUTIONS]
    for stub in STUBS:
        name = stub.read_text().split('EXERCISE = "', 1)[1].split('"', 1)[0]
        assert name in names, stub
        assert f'EXERCISE = "{name}"' in (EXERCISES / "solutions" / stub.name).read_text()
    assert {line.split()[0] for line in EXERCISES_HELP.splitlines()[1:8]} == set(names)
    assert (EXERCISES / "README.md").is_file()


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_reference_solution_passes(path, capsys):
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_PASSED, out + err
    assert "FAIL" not in out and "checks pass" in out


@pytest.mark.parametrize("path", STUBS, ids=lambda p: p.stem)
def test_every_untouched_stub_fails_with_its_hint(path, capsys):
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_FAILED, out + err
    assert "  FAIL  " in out and "hint: " in out and "expected" in out
    assert "Traceback" not in out + err


def test_dividing_by_staleness_plus_one_fails_naming_the_divisor(tmp_path, capsys):
    out = failing(tmp_path, capsys, "04_staleness_rule.py", "max(1, staleness)", "(staleness + 1)")
    assert "FAIL  staleness 1, one apply of update 1: expected lr_server / 1, got lr_server / 2" in out
    assert "yours divides by staleness + 1" in out
    assert "PASS  staleness 0" in out   # the same step where the two agree


def test_an_off_by_one_ssp_gate_fails_at_a_client_exactly_s_ahead(tmp_path, capsys):
    out = failing(tmp_path, capsys, "05_ssp_gate.py", "ahead <= self.bound", "ahead < self.bound")
    assert ("FAIL  client 1 pushes (2 ahead of the slowest live client, bound s = 2): "
            "expected client(s) 1 go on, got nobody goes on") in out
    assert "MORE than s pushes ahead" in out
    assert "FAIL  3 clients, client 1 four times slower, bound s = 2: expected the reference's" in out


def test_a_ringmaster_that_discards_every_push_fails_saying_none_was_applied(tmp_path, capsys):
    # the stalest applied push of no push was NaN, and int(NaN) the grader's traceback
    out = failing(tmp_path, capsys, "06_ringmaster.py", "discard = staleness >= self.threshold", "discard = True")
    assert "the stalest push applied: expected at most R - 1 = 3, got none applied" in out


def test_discarding_above_r_instead_of_at_r_fails_at_staleness_r(tmp_path, capsys):
    out = failing(tmp_path, capsys, "06_ringmaster.py", "staleness >= self.threshold", "staleness > self.threshold")
    assert "FAIL  a push 4 versions stale, R = 4: expected discarded, got applied" in out
    assert "discarding only at staleness > R?" in out
    assert "PASS  a push 5 versions stale" in out


def test_an_answer_one_off_and_backups_without_a_floor_are_named(tmp_path, capsys):
    out = failing(tmp_path, capsys, "01_mean_staleness.py", "return num_clients - 1", "return num_clients")
    assert "off by one" in out and "expected 3 (exactly N - 1), got 4" in out
    out = failing(tmp_path, capsys, "07_backup_workers.py", "max(1, len(counted) - self.backups)",
                  "len(counted) - self.backups")
    assert "FAIL  1 backup(s), 1 live client(s): expected a round closes at 1 push(es), got 0" in out


def test_an_exception_in_the_answer_fails_naming_its_line(tmp_path, capsys):
    path = edited(tmp_path, "03_sync_ratio.py", "    return 1 / sum(", "    return 1 / 0 * sum(")
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_FAILED
    line = path.read_text().splitlines().index("    return 1 / 0 * sum(1 / k for k in range(1, num_clients + 1))") + 1
    assert f"got an error: ZeroDivisionError: division by zero (line {line} of {path.resolve()})" in out
    assert "Traceback" not in out + err


def test_a_class_that_raises_inside_a_run_fails_and_leaves_the_registry_as_it_was(tmp_path, capsys):
    rules, protocols = asgd.RULES.names(), asgd.PROTOCOLS.names()
    path = edited(tmp_path, "04_staleness_rule.py", "    def fetched(self, client: int, params) -> None:\n        pass",
                  "    def fetched(self, client: int, params) -> None:\n        raise RuntimeError('no fetch')")
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_FAILED and "RuntimeError: no fetch (line" in out, out
    for solution in SOLUTIONS[3:]:
        graded(solution, capsys)
    assert (asgd.RULES.names(), asgd.PROTOCOLS.names()) == (rules, protocols)


@pytest.mark.parametrize("raised", ["BaseException('boom')", "GeneratorExit('closed')", "Oops('mine')"])
def test_a_base_exception_in_the_answer_fails_naming_its_line(raised, tmp_path, capsys):
    """Neither an Exception nor SystemExit: it went past the answer's check and the report, the
    grader's traceback."""
    path = tmp_path / "answer.py"
    path.write_text('EXERCISE = "mean_staleness"\nclass Oops(BaseException):\n    pass\n\n\n'
                    f"def mean_staleness(n):\n    raise {raised}\n")
    code, out, err = graded(path, capsys)
    shown = raised.replace("('", ": ").removesuffix("')")
    assert code == grader.EXIT_FAILED and f"got an error: {shown} (line 7 of {path.resolve()})" in out, out + err
    assert "Traceback" not in out + err


def test_a_base_exception_inside_a_run_fails_naming_its_line(tmp_path, capsys):
    path = edited(tmp_path, "04_staleness_rule.py", "    def fetched(self, client: int, params) -> None:\n        pass",
                  "    def fetched(self, client: int, params) -> None:\n        raise BaseException('no fetch')")
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_FAILED and "got BaseException: no fetch (line" in out, out + err


@pytest.mark.parametrize("where", ["answer", "top"])
def test_an_exception_whose_message_raises_is_named_by_its_class(where, tmp_path, capsys):
    """Its __str__ (a field never set) raised again as the grader described it: a traceback."""
    path = tmp_path / "answer.py"
    path.write_text('EXERCISE = "mean_staleness"\n\n\nclass Wrong(Exception):\n    def __str__(self):\n'
                    "        return self.why\n\n\ndef mean_staleness(n):\n    raise Wrong()\n"
                    + ("\n\nmean_staleness(2)\n" if where == "top" else ""))
    code, out, err = graded(path, capsys)
    said = f"Wrong: (its message cannot be shown: AttributeError in its __str__) (line 10 of {path.resolve()})"
    assert code == (grader.EXIT_FAILED if where == "answer" else grader.EXIT_UNLOADABLE), out + err
    assert said in (out if where == "answer" else err) and "Traceback" not in out + err, out + err


UNLOADABLE = {
    "syntax": ("def mean_staleness(n):\n    return n -\n", "line 2: syntax error"),
    "no_exercise": ("def mean_staleness(n):\n    return n - 1\n", 'no line EXERCISE = "NAME"'),
    "unknown": ('EXERCISE = "mean_stalenes"\n', "unknown exercise 'mean_stalenes'; known: backup_workers"),
    "renamed": ('EXERCISE = "staleness_rule"\nclass MyRule:\n    pass\n', "no class named StalenessRule"),
    "raises": ('EXERCISE = "mean_staleness"\nimport no_such_module_here\n',
               "it stops while loading: ModuleNotFoundError: No module named 'no_such_module_here' (line 2"),
    "null_byte": ('EXERCISE = "mean_staleness"\x00\n', "answer.py: syntax error: source code string cannot"),
    "deep_unary": ('EXERCISE = "mean_staleness"\nx = ' + "-" * 200000 + "1\n", "an expression nested too deeply"),
    "deep_sum": ('EXERCISE = "mean_staleness"\nx = 1' + " + 1" * 150000 + "\n", "an expression nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(UNLOADABLE))
def test_a_file_that_cannot_be_loaded_exits_2_with_one_line(case, tmp_path, capsys):
    source, reason = UNLOADABLE[case]
    path = tmp_path / "answer.py"
    path.write_text(source)
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_UNLOADABLE
    assert out == "" and err.count("\n") == 1 and reason in err and str(path) in err, err


def test_a_module_beside_the_file_imports_from_any_folder(tmp_path, capsys, monkeypatch):
    """``python answer.py`` finds it (a script's folder is on the path), and so did a grading
    started in that folder; one started elsewhere stopped: "No module named 'beside_answer'"."""
    (tmp_path / "beside_answer.py").write_text("def staleness(n):\n    return n - 1\n")
    path = tmp_path / "answer.py"
    path.write_text('EXERCISE = "mean_staleness"\nfrom beside_answer import staleness as mean_staleness\n')
    monkeypatch.chdir(ROOT)
    path_before = list(sys.path)
    try:
        code, out, err = graded(path, capsys)
    finally:
        sys.modules.pop("beside_answer", None)
    assert code == grader.EXIT_PASSED, out + err
    assert sys.path == path_before   # the grading's path was its own


def test_a_missing_file_exits_2_with_one_line(tmp_path, capsys):
    code, out, err = graded(tmp_path / "nowhere.py", capsys)
    assert code == grader.EXIT_UNLOADABLE and out == ""
    assert err.count("\n") == 1 and "nowhere.py: cannot read it" in err


def test_a_fifo_a_folder_or_a_huge_file_is_refused_at_once_without_reading_it(tmp_path, capsys):
    # a fifo (or /dev/zero) was read without end: only the 300 s alarm stopped it, with a traceback
    fifo, huge = tmp_path / "answer.py", tmp_path / "huge.py"
    os.mkfifo(fifo)
    graded_fifo = subprocess.run([sys.executable, "-m", "repro.lab", "grade", str(fifo)], capture_output=True,
                                 text=True, cwd=ROOT, timeout=90)
    with huge.open("wb") as f:
        f.truncate(grader.MAX_FILE_BYTES + 1)
    refusals = [(graded_fifo.returncode, graded_fifo.stdout, graded_fifo.stderr, fifo),
                *((*graded(path, capsys), path) for path in (tmp_path, huge))]
    for code, out, err, path in refusals:
        assert code == grader.EXIT_UNLOADABLE and out == "" and err.count("\n") == 1, err
        assert f"{path}: not an exercise file (expected a Python file of the exercises" in err, err


def test_the_help_lists_every_exercise_without_importing_torch():
    helped = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.argv = ['lab', 'grade', '--help']\n"
                             "try:\n    runpy.run_module('repro.lab', run_name='__main__')\n"
                             "except SystemExit:\n    print('torch' in sys.modules)"],
                            capture_output=True, text=True, cwd=ROOT)
    assert helped.returncode == 0 and helped.stdout.endswith("False\n")
    assert all(name in helped.stdout for name in grader.EXERCISES.names())


@pytest.mark.slow
def test_the_command_grades_a_stub_and_refuses_a_broken_file(tmp_path):
    run = [sys.executable, "-m", "repro.lab", "grade"]
    stub = subprocess.run([*run, "exercises/01_mean_staleness.py"], capture_output=True, text=True, cwd=ROOT)
    assert stub.returncode == 1 and "hint:" in stub.stdout and stub.stderr == ""
    broken = tmp_path / "broken.py"
    broken.write_text('EXERCISE = "ssp_gate"\nclass BoundedSSP(:\n')
    refused = subprocess.run([*run, str(broken)], capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 2 and refused.stdout == "" and refused.stderr.count("\n") == 1
    assert "line 2: syntax error" in refused.stderr and "Traceback" not in refused.stderr


def test_a_plugged_entry_is_gone_after_its_block_even_when_it_raises():
    with pytest.raises(RuntimeError):
        with asgd.RULES.plugged("student_test", asgd.StalenessScaledRule) as name:
            assert name in asgd.RULES and asgd.RULES[name] is asgd.StalenessScaledRule
            raise RuntimeError("the run failed")
    assert "student_test" not in asgd.RULES


def test_the_classroom_api_runs_a_lab_point_and_states_the_predictions(tmp_path, capsys):
    assert asgd.critical_lr(3) == pytest.approx(0.4450419, rel=1e-6)
    assert asgd.harmonic(4) == pytest.approx(25 / 12)
    result = asgd.run_point("+problem=quadratic", "cost=uniform", "nsync=1", "num_clients=3", "num_epochs=30")
    assert result.run_dir is None and result.summary["status"] == "completed"
    assert set(result.updates.staleness.iloc[3:]) == {2}   # N - 1, every push after the first round
    assert asgd.configure("+problem=quadratic").progress is False
    # an annotated EXERCISE line names the exercise too
    path = tmp_path / "answer.py"
    path.write_text('EXERCISE: str = "mean_staleness"\n\ndef mean_staleness(n):\n    return n - 1\n')
    assert graded(path, capsys)[0] == grader.EXIT_PASSED


def test_a_protocol_that_never_closes_a_round_fails_with_the_runs_own_reason(tmp_path, capsys):
    out = failing(tmp_path, capsys, "07_backup_workers.py", "max(1, len(counted) - self.backups)", "len(counted) + 1")
    assert "your run ended failed: protocol 'student_backup_workers' holds every live client" in out
    assert "got no rounds (none applied)" in out


def test_an_answer_that_calls_exit_fails_instead_of_passing(tmp_path, capsys):
    path = tmp_path / "answer.py"
    path.write_text('EXERCISE = "mean_staleness"\n\ndef mean_staleness(n):\n    exit()\n')
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_FAILED and "got an error: SystemExit:" in out, out + err


@pytest.mark.parametrize("where", ["answer", "top"])
def test_an_endless_loop_is_stopped_once_for_the_whole_grading(where, tmp_path, monkeypatch, capsys):
    """The alarm rings once: an endless answer, or an endless file, must end the grading there."""
    monkeypatch.setattr(grader, "GRADE_LIMIT_S", 1)
    loop = "while True:\n    try:\n        pass\n    except Exception:\n        pass\n"
    body = ("def mean_staleness(n):\n" + "".join("    " + line + "\n" for line in loop.splitlines())
            if where == "answer" else loop)
    path = tmp_path / "answer.py"
    path.write_text('EXERCISE = "mean_staleness"\n' + body)
    code, out, err = graded(path, capsys)
    assert code == (grader.EXIT_FAILED if where == "answer" else grader.EXIT_UNLOADABLE), out + err
    assert "grading ran over 1 s" in out + err and "Traceback" not in out + err


def test_a_method_that_returns_no_decision_fails_saying_so(tmp_path, capsys):
    out = failing(tmp_path, capsys, "06_ringmaster.py", "        return Decision(apply=push",
                  "        Decision(apply=push")   # a forgotten return
    assert "on_push returned None, not a Decision" in out


def test_a_gate_that_returns_a_list_is_judged_by_whom_it_releases(tmp_path, capsys):
    path = edited(tmp_path, "05_ssp_gate.py", "return tuple(go)", "return go")
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_PASSED, out + err


@pytest.mark.parametrize("returned", ["Odd()", "Decision(reply=Odd())"])
def test_a_gate_that_returns_what_cannot_be_shown_fails_naming_its_line(returned, tmp_path, capsys):
    """Its repr raised as the grader said what came back (not a Decision, no tuple): a traceback."""
    odd = ("from repro.api import SSP, Decision\n\n\nclass Odd:\n    def __iter__(self):\n"
           "        raise TypeError('no iter')\n\n    def __repr__(self):\n        raise ValueError('no repr')\n")
    path = edited(tmp_path, "05_ssp_gate.py", "        return tuple(go)",
                  f"        return tuple(go)\n\n    def on_push(self, push, view):\n        return {returned}")
    path.write_text(path.read_text().replace("from repro.api import SSP\n", odd))
    line = path.read_text().splitlines().index("        raise ValueError('no repr')") + 1
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_FAILED and "Traceback" not in out + err, out + err
    assert f"got ValueError: no repr (line {line} of {path.resolve()})" in out, out


def test_a_gate_whose_clients_are_no_tuple_fails_saying_so_or_is_judged_by_whom_it_names(tmp_path, capsys):
    # an int (or an array's truth test) in reply or discarded was the grader's traceback
    out = failing(tmp_path, capsys, "05_ssp_gate.py", "return tuple(go)", "return len(go)")
    assert "on_push returned a Decision with reply=1, discarded=(): each a tuple" in out
    path = edited(tmp_path, "06_ringmaster.py", "discarded=((push.read_version, push.client),)",
                  "discarded=__import__('numpy').array([(push.read_version, push.client)])")
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_PASSED, out + err


COUNT = "max(1, len(counted) - self.backups)"


@pytest.mark.parametrize("odd, got", [(f"__import__('numpy').array([{COUNT}] * 2)", "array([4, 4])"),
                                      ("True", "True"), (f"str({COUNT})", "'4'"), (f"float({COUNT})", "4.0")])
def test_a_needed_that_returns_no_count_fails_saying_what_came(odd, got, tmp_path, capsys):
    # an array was the grader's traceback (its == "is ambiguous"), True passed for 1, '4' showed as 4
    out = failing(tmp_path, capsys, "07_backup_workers.py", COUNT, odd)
    assert f"FAIL  0 backup(s), 4 live client(s): expected a round closes at 4 push(es), got {got}, not a count" in out
    assert out.count("not a count (an int)") == 5, out


@pytest.mark.parametrize("odd", ["str(num_clients - 1)", "num_clients == 2"])
def test_a_text_or_a_bool_is_no_number(odd, tmp_path, capsys):
    # float("1") and float(True) read them as numbers: every check passed for '1', two for True
    out = failing(tmp_path, capsys, "01_mean_staleness.py", "return num_clients - 1", f"return {odd}")
    assert "PASS" not in out, out


@pytest.mark.parametrize("exercise, function", [("mean_staleness", "mean_staleness"),
                                                ("stable_lr", "largest_stable_lr")])
def test_an_int_beyond_floats_fails_as_an_answer(exercise, function, tmp_path, capsys):
    path = tmp_path / "answer.py"
    path.write_text(f'EXERCISE = "{exercise}"\n\ndef {function}(n):\n    return 10 ** 400\n')
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_FAILED and "Traceback" not in out + err, out + err


@pytest.mark.parametrize("exercise, function", [("mean_staleness", "mean_staleness"),
                                                ("stable_lr", "largest_stable_lr")])
def test_an_answer_that_raises_when_read_as_a_number_fails_naming_its_line(exercise, function, tmp_path, capsys):
    path = tmp_path / "answer.py"   # was the grader's traceback, exit 1 without a report's last line
    path.write_text(f'EXERCISE = "{exercise}"\n\nclass Lazy:\n    def __float__(self):\n'
                    f'        raise ZeroDivisionError("later")\n\ndef {function}(n):\n    return Lazy()\n')
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_FAILED and "Traceback" not in out + err, out + err
    assert f"ZeroDivisionError: later (line 5 of {path})" in out


@pytest.mark.parametrize("start", [b"\xef\xbb\xbf", b"# -*- coding: latin-1 -*-\n# \xe9\n"])
def test_a_file_python_runs_is_graded_with_a_bom_or_a_coding_line(start, tmp_path, capsys):
    path = tmp_path / "answer.py"   # Windows Notepad saves UTF-8 with a BOM
    path.write_bytes(start + (EXERCISES / "solutions" / "01_mean_staleness.py").read_bytes())
    assert graded(path, capsys)[0] == grader.EXIT_PASSED


def test_a_rate_too_large_to_try_is_named_so(tmp_path, capsys):
    path = tmp_path / "answer.py"
    path.write_text('EXERCISE = "stable_lr"\n\ndef largest_stable_lr(tau):\n    return 150.0\n')
    code, out, err = graded(path, capsys)
    assert code == grader.EXIT_FAILED and "expected a learning rate between 0 and 100, got 150.0" in out, out


def test_a_report_piped_into_head_ends_without_a_traceback():
    graded = subprocess.Popen([sys.executable, "-m", "repro.lab", "grade", "exercises/01_mean_staleness.py"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert graded.stdout.readline().startswith("exercise mean_staleness")
    graded.stdout.close()   # as head -1 does
    assert "Traceback" not in graded.stderr.read()
    graded.wait(timeout=120)


@contextlib.contextmanager
def command(path: Path, limit_s: int | None = None) -> Iterator[subprocess.Popen]:
    """``python -m repro.lab grade path`` in a process group of its own (the grader; its child is a
    session of its own), with Ctrl-C as a terminal delivers it and the grading's limit ``limit_s``
    with no grace where given; the group killed when its ``with`` block ends unwaited (a test that
    fails leaves no grader behind)."""
    run = ["-m", "repro.lab"] if limit_s is None else [
        "-c", f"import sys; from repro.lab import __main__, grader; grader.GRADE_LIMIT_S = {limit_s}; "
              "grader.GRACE_S = 0; sys.exit(__main__.main())"]
    proc = subprocess.Popen([sys.executable, *run, "grade", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    with proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def gone(pids: Path) -> bool:
    """Whether every process named in the file ``pids`` has ended (killing those left after a minute)."""
    left = [int(pid) for pid in pids.read_text().split()] if pids.exists() else []
    for _ in range(600):   # a SIGKILL is no end at once: init reaps each at its own pace
        if not (left := [pid for pid in left if alive(pid)]):
            return True
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return False


# slow (a grader process each, ~2 s): the answer's os._exit(0) covers the same path by default
@pytest.mark.parametrize("where, ending", [pytest.param("top", "os._exit(0)", marks=pytest.mark.slow),
                                           ("answer", "os._exit(0)"),
                                           pytest.param("top", "os.kill(os.getpid(), signal.SIGKILL)",
                                                        marks=pytest.mark.slow)])
def test_a_file_that_ends_the_grading_itself_exits_2_saying_so(where, ending, tmp_path):
    # os._exit(0) was the command's exit 0 with no report: a pass for a file that passed nothing
    path = tmp_path / "answer.py"
    body = f"def mean_staleness(n):\n    {ending}\n" if where == "answer" else ending + "\n"
    path.write_text('EXERCISE = "mean_staleness"\nimport os, signal\n' + body)
    with command(path) as proc:
        out, err = proc.communicate(timeout=120)
    how = "signal 9" if "SIGKILL" in ending else "exit status 0"
    assert proc.returncode == grader.EXIT_UNLOADABLE and err.count("\n") == 1, out + err
    assert err.startswith(f"grade: {path}: the grading ended with no verdict ({how}") and "Traceback" not in err
    assert out.count("\n") == (where == "answer") and "checks pass" not in out   # the report's first line alone


@pytest.mark.parametrize("ending", ["raise KeyboardInterrupt('mine')",   # slow: a grader process, the same path
                                    pytest.param("os.kill(os.getpid(), signal.SIGINT)", marks=pytest.mark.slow)])
def test_an_interrupt_the_file_raises_itself_exits_2_saying_so(ending, tmp_path):
    # the grading process, a session apart, gets no Ctrl-C: its KeyboardInterrupt is the file's own.
    # It was exit 130 without a word, as the grader's Ctrl-C, the report cut short
    path = tmp_path / "answer.py"
    path.write_text(f'EXERCISE = "mean_staleness"\nimport os, signal\n\n\ndef mean_staleness(n):\n    {ending}\n')
    with command(path) as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == grader.EXIT_UNLOADABLE and err.count("\n") == 1, out + err
    assert err.startswith(f"grade: {path}: the grading ended with no verdict: the file interrupted it itself "
                          "(KeyboardInterrupt: ") and f"(line 6 of {path.resolve()})); fix that" in err, err
    assert out.count("\n") == 1 and "checks pass" not in out   # the report's first line alone


@pytest.mark.parametrize("path", [SOLUTIONS[0], pytest.param(STUBS[0], marks=pytest.mark.slow)],
                         ids=["solution", "stub"])   # slow: the solution covers the same path by default
def test_a_thread_the_file_leaves_running_holds_no_grading_nor_changes_its_report(path, tmp_path, capsys):
    # a non-daemon thread kept the command alive after its report, forever
    threaded = tmp_path / path.name
    threaded.write_text(path.read_text() + "\nimport threading, time\n"
                        "threading.Thread(target=time.sleep, args=(1e6,)).start()\n")
    with command(threaded) as proc:
        out, err = proc.communicate(timeout=120)
    code, report, _ = graded(path, capsys)   # the same file without the thread, in this process
    assert (proc.returncode, out, err) == (code, report.replace(str(path), str(threaded)), "")


@pytest.mark.parametrize("taken", ["sys.stdout = None", "sys.stdout = io.StringIO()"])
def test_a_file_that_takes_sys_stdout_away_still_gets_its_report(taken, tmp_path, capsys):
    # the report went to whatever the file left in sys.stdout: nowhere, and the command's exit 0
    # (or a traceback and exit 1 where it could not flush None) told a passing student nothing more
    path = tmp_path / SOLUTIONS[0].name
    path.write_text(SOLUTIONS[0].read_text() + f"\nimport io, sys\n{taken}\n")
    code, report, _ = graded(SOLUTIONS[0], capsys)
    assert graded(path, capsys) == (code, report.replace(str(SOLUTIONS[0]), str(path)), "")


# slow (a grader process, ~2 s): sys.stdout.close() covers the command's own handle by default
@pytest.mark.parametrize("closed", ["sys.stdout.close()", pytest.param("os.close(1)", marks=pytest.mark.slow)])
def test_a_file_that_closes_stdout_still_gets_its_report_from_the_command(closed, tmp_path, capsys):
    # it was a traceback ("I/O operation on closed file", "Bad file descriptor"), exit 1, no report
    path = tmp_path / SOLUTIONS[0].name
    path.write_text(SOLUTIONS[0].read_text() + f"\nimport os, sys\n{closed}\n")
    with command(path) as proc:
        out, err = proc.communicate(timeout=120)
    code, report, _ = graded(SOLUTIONS[0], capsys)   # the same file, in this process
    assert (proc.returncode, out, err) == (code, report.replace(str(SOLUTIONS[0]), str(path)), "")


REFUSAL = "grade: {}: no function named mean_staleness (the exercise grades mean_staleness; keep the stub's name)\n"


def test_a_file_that_sets_sys_stderr_to_none_gets_the_graders_refusal_on_stderr(tmp_path, capsys):
    # the refusal went to print(file=None): stdout, where a script reading the report took it for one
    path = tmp_path / "answer.py"
    path.write_text('EXERCISE = "mean_staleness"\nimport sys\nsys.stderr = None\n')
    assert graded(path, capsys) == (grader.EXIT_UNLOADABLE, "", REFUSAL.format(path))


# slow (a grader process): sys.stderr.close() covers the command's own handle by default
@pytest.mark.parametrize("closed", ["sys.stderr.close()", pytest.param("os.close(2)", marks=pytest.mark.slow)])
def test_a_file_that_closes_stderr_still_gets_the_graders_refusal_from_the_command(closed, tmp_path):
    # the refusal raised "I/O operation on closed file" in the grading, whose traceback went nowhere: exit 1, silent
    path = tmp_path / "answer.py"
    path.write_text(f'EXERCISE = "mean_staleness"\nimport os, sys\n{closed}\n')
    with command(path) as proc:
        out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (grader.EXIT_UNLOADABLE, "", REFUSAL.format(path))


def test_a_process_the_file_leaves_running_ends_with_its_grading(tmp_path):
    # os._exit skipped multiprocessing's exit, which ended the file's daemonic process: it ran on
    # after the grader, holding the command's stdout open (a pipe's reader waited, here 1e6 s)
    path = tmp_path / SOLUTIONS[0].name
    path.write_text(SOLUTIONS[0].read_text() + "\nimport multiprocessing, time\n"
                    "multiprocessing.Process(target=time.sleep, args=(1e6,), daemon=True).start()\n")
    with command(path) as proc:
        try:
            out, err = proc.communicate(timeout=120)
        finally:   # what is left of the grader's group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and "checks pass" in out and "FAIL" not in out and err == "", out + err


@contextlib.contextmanager
def asleep_in_its_answer(tmp_path: Path):
    """The grader, its answer asleep once it has written its pid (the grading's: a session of its
    own) to the file ``pids``: (the grader's process, pids)."""
    path, pids = tmp_path / "answer.py", tmp_path / "pids"
    path.write_text(f'EXERCISE = "mean_staleness"\nimport os, time\n\ndef mean_staleness(n):\n'
                    f'    open({str(pids)!r}, "w").write(str(os.getpid()))\n    print("slept", flush=True)\n'
                    '    time.sleep(60)\n')
    with command(path) as proc:
        assert proc.stdout.readline().startswith("exercise mean_staleness")
        assert proc.stdout.readline() == "slept\n"   # its pid written: else gone() would check nothing
        yield proc, pids


@pytest.mark.slow   # a grader process (~2 s); test_a_stopped_grader_ends_its_grading_with_it[SIGTERM] covers the path
def test_ctrl_c_ends_the_grading_with_130_and_no_traceback(tmp_path):
    # was KeyboardInterrupt's traceback from the answer's line
    with asleep_in_its_answer(tmp_path) as (proc, pids):
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and out == err == "", out + err
    assert gone(pids)


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
def test_a_stopped_grader_ends_its_grading_with_it(signum, tmp_path):
    # SIGTERM to the grader alone (timeout(1), a batch system) left the grading child running its
    # answer, up to the grading's 300 s limit
    with asleep_in_its_answer(tmp_path) as (proc, pids):
        os.kill(proc.pid, signum)
        out, err = proc.communicate(timeout=60)
        with pytest.raises(ProcessLookupError):   # no process left in the grader's group
            os.killpg(proc.pid, 0)
    assert proc.returncode == 128 + signum and out == err == "", out + err
    assert gone(pids)


def test_a_sigkilled_grader_takes_its_grading_along(tmp_path):
    # a SIGKILL runs none of the grader's code: its grading child ran on, orphaned, its answer to the end
    with asleep_in_its_answer(tmp_path) as (proc, pids):
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    assert gone(pids)


def test_a_process_that_leaves_the_grading_session_ends_with_it_all_the_same(tmp_path):
    # a daemon (os.fork, os.setsid, its parent gone) was out of reach of the session's kill and ran on (600 s)
    path, pids = tmp_path / "answer.py", tmp_path / "pids"   # no answer: the grading ends as it loads
    path.write_text('EXERCISE = "mean_staleness"\nimport os, time\nread, write = os.pipe()\n'
                    "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                    f"        open({str(pids)!r}, 'w').write(str(os.getpid()))\n"
                    "        os.write(write, b'.')\n        time.sleep(600)\n    os._exit(0)\n"
                    "os.read(read, 1)\n")
    try:
        with command(path) as proc:
            out, err = proc.communicate(timeout=120)
        assert proc.returncode == grader.EXIT_UNLOADABLE and "no function named mean_staleness" in err, out + err
    finally:
        assert pids.exists() and gone(pids)


@pytest.mark.parametrize("where", ["answer", pytest.param("top", marks=pytest.mark.slow)])   # slow: the same path
def test_a_file_that_turns_the_alarm_off_is_stopped_at_the_limit_all_the_same(where, tmp_path):
    # the limit was the child's SIGALRM alone: a file that turned it off and looped hung the grader for ever
    path = tmp_path / "answer.py"
    path.write_text('EXERCISE = "mean_staleness"\nimport signal\n' + (
        "def mean_staleness(n):\n    signal.alarm(0)\n    while True:\n        pass\n" if where == "answer"
        else "signal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n"))
    with command(path, limit_s=2) as proc:
        out, err = proc.communicate(timeout=60)
    # as the child's alarm says it: a check failed (the answer's), or the file cannot be loaded (its top)
    assert proc.returncode == (grader.EXIT_FAILED if where == "answer" else grader.EXIT_UNLOADABLE), out + err
    assert err == f"grade: {path}: grading ran over 2 s: does your code ever return?\n", out + err
    assert out.count("\n") == (where == "answer") and "checks pass" not in out   # the report's first line alone


@pytest.mark.slow   # a grader process (~2-4 s); test_a_process_the_file_leaves_running_ends_with_its_grading
def test_the_processes_a_file_starts_end_with_its_grading(tmp_path):   # covers the path: the session's kill
    # a subprocess or a raw fork of the answer ran on after the grader (here 600 s), holding its stdout open
    path, pids = tmp_path / "answer.py", tmp_path / "pids"
    path.write_text('EXERCISE = "mean_staleness"\nimport os, subprocess, sys, time\n\n'
                    "def mean_staleness(n):\n"
                    '    started = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid\n'
                    "    if (forked := os.fork()) == 0:\n        time.sleep(600)\n        os._exit(0)\n"
                    f"    with open({str(pids)!r}, 'a') as f:\n        f.write(f'{{started}} {{forked}} ')\n"
                    "    return n - 1\n")
    try:
        with command(path) as proc:
            out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "checks pass" in out and "FAIL" not in out and err == "", out + err
    finally:
        assert gone(pids)
