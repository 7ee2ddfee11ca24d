"""``python -m repro.lab grade FILE``: load a student's exercise file (its exercise named by its
``EXERCISE = "NAME"`` line, read without running it), grade it in a child process, report one line
per check, and exit 0 (all pass), 1 (one fails) or 2 (the file cannot be loaded, or it ended the
grading itself): exercises/README.md. The exercises: :mod:`repro.lab.numeric`, :mod:`repro.lab.plugins`."""
from __future__ import annotations

import ast
import contextlib
import logging
import os
import signal
import sys
import traceback
import types
from contextlib import contextmanager
from pathlib import Path
from stat import S_ISREG
from typing import IO
from unittest import mock

from repro.gridpoint import proc_stat
from repro.lab import harness
from repro.lab.harness import EXERCISES, Check, Exercise, StudentError, TooLong
from repro.logs import get_logger
from repro.runtime import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, prctl

EXIT_PASSED, EXIT_FAILED, EXIT_UNLOADABLE = 0, 1, 2
GRADE_LIMIT_S = 300   # far beyond a grading's seconds: only an answer that never returns meets it
GRACE_S = 5   # the grader's own limit past the child's: the alarm's report comes first, where the file left it on
LOADED = b"L"   # up the pipe once the file has loaded, before the verdict (a byte 0..130)
MAX_FILE_BYTES = 10**6   # a stub is 1 kB; /dev/zero or a fifo was read without end (stat opens nothing)


class Unloadable(Exception):
    """The file cannot be graded; the message is the one line the student sees."""


def exercise_of(path: Path, tree: ast.Module) -> Exercise:
    """The exercise a file's top-level ``EXERCISE = "NAME"`` line names."""
    names = EXERCISES.names()   # declared in repro.registry: no exercise's module loads for them
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) and node.value else []
        if any(isinstance(t, ast.Name) and t.id == "EXERCISE" for t in targets):
            name = node.value.value if isinstance(node.value, ast.Constant) else None
            if name not in EXERCISES:
                raise Unloadable(f"{path}: line {node.lineno}: unknown exercise {name!r}; "
                                 f"known: {', '.join(names)}")
            return EXERCISES[name]
    raise Unloadable(f"{path}: no line EXERCISE = \"NAME\" saying which exercise this is "
                     f"(one of: {', '.join(names)})")


def load(path: Path) -> tuple[Exercise, types.ModuleType]:
    """The file's exercise and the file run as a fresh module, or :class:`Unloadable`."""
    try:   # bytes: the parser decodes them as python does (a BOM, a coding line; else a syntax error)
        if not S_ISREG((info := path.stat()).st_mode) or info.st_size > MAX_FILE_BYTES:
            raise Unloadable(f"{path}: not an exercise file (expected a Python file of the exercises, a regular "
                             f"file of at most {MAX_FILE_BYTES // 10**6} MB, e.g. exercises/01_mean_staleness.py)")
        source = path.read_bytes()
    except OSError as e:
        raise Unloadable(f"{path}: cannot read it ({e.strerror})") from None
    filename = str(path.resolve())
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        where = f"line {e.lineno}: " if e.lineno else ""   # null bytes: no line
        raise Unloadable(f"{path}: {where}syntax error: {e.msg}") from None
    except (RecursionError, MemoryError) as e:   # the parser's own limits: a traceback, as from python itself
        raise Unloadable(f"{path}: cannot be parsed: an expression nested too deeply ({type(e).__name__})") from None
    ex = exercise_of(path, tree)
    module = types.ModuleType(f"exercise_{ex.name}")
    module.__file__ = filename
    harness.STUDENT_FILES.add(filename)
    # the file's folder first on the path, as python puts a script's: a module beside it imports
    # whatever folder the grading starts in (it did from the file's own alone: python -m's path)
    sys.path.insert(0, str(Path(filename).parent))
    try:
        exec(compile(tree, filename, "exec"), module.__dict__)   # noqa: S102  (the student's own file)
    except BaseException as e:   # noqa: BLE001  (SystemExit too: the file must load to be graded)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise Unloadable(f"{path}: it stops while loading: {harness.describe_error(e)}") from None
    for name, kind in ex.needs:
        value = getattr(module, name, None)
        if not (isinstance(value, type) if kind == "class" else callable(value)):
            raise Unloadable(f"{path}: no {kind} named {name} (the exercise grades {name}; "
                             "keep the stub's name)")
    return ex, module


def report(ex: Exercise, path: Path, module: types.ModuleType, out: IO[str]) -> bool:
    """Grade and print each check to ``out`` as it comes; True when all passed."""
    say(f"exercise {ex.name}: {ex.title}  ({path})", out)
    passed = total = 0
    hinted: set[str] = set()                # each hint once: the lines below say what differs
    runs_log = get_logger()                 # a graded run's own lines ("diverged: ...") are
    level = runs_log.level                  # the checks' business: silent while grading
    runs_log.setLevel(logging.CRITICAL)
    try:
        for check in ex.grade(module):
            total += 1
            passed += check.passed
            print_check(check, hinted, out)
    except (StudentError, TooLong) as e:   # their code failed where a check needs it
        total += 1
        print_check(Check("your code ran", "no exception", str(e), False,
                          "fix the error above and grade again"), hinted, out)
    finally:
        runs_log.setLevel(level)
    say(f"{passed} of {total} checks pass" + ("" if passed == total else "; read the hints above and try again"), out)
    return passed == total


def print_check(check: Check, hinted: set[str], out: IO[str]) -> None:
    say(f"  {'PASS' if check.passed else 'FAIL'}  {check.what}: expected {check.expected}, got {check.got}", out)
    if not check.passed and check.hint and check.hint not in hinted:
        hinted.add(check.hint)
        say(f"        hint: {check.hint}", out)


def say(line: str, out: IO[str]) -> None:
    """A line of the report into ``out``, the grader's own stdout, after the file's own lines (flushed)."""
    flush_stdout()
    print(line, file=out, flush=True)


def flush_stdout() -> None:
    with contextlib.suppress(Exception):   # (None, or closed by the file: nothing of its to flush)
        sys.stdout.flush()


def grade(file: str, loaded=lambda: None, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    """Grade one file, calling ``loaded()`` once it has loaded, its report into ``out`` and its refusal
    into ``err`` (default: ``sys.stdout``, ``sys.stderr`` as it starts); the exit status."""
    path, out, err = Path(file), out or sys.stdout, err or sys.stderr
    # loading runs the file: an endless loop at its top too; it puts the file's folder on the path
    with time_limit(GRADE_LIMIT_S), mock.patch.object(sys, "path", list(sys.path)):
        try:
            ex, module = load(path)
        except Unloadable as e:
            print(f"grade: {e}", file=err, flush=True)
            return EXIT_UNLOADABLE
        loaded()
        return EXIT_PASSED if report(ex, path, module, out) else EXIT_FAILED


def grade_apart(file: str) -> int:
    """:func:`grade` in a forked child, a session of its own that sends its verdict up a pipe and is
    killed whole, with what it started, as the grading ends however it ends (exercises/README.md):
    the file's ``os._exit(0)`` or crash cannot pass for a verdict. The grader holds the time limit too."""
    read, write = os.pipe()
    grader = os.getpid()
    prctl(PR_SET_CHILD_SUBREAPER, 1)   # orphans of the grading come to the grader, not to init, to be ended
    if (pid := os.fork()) == 0:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)   # a SIGKILLed grader runs no finally: the kernel ends the child
        if os.getppid() != grader:   # the grader died before that took effect
            os._exit(EXIT_UNLOADABLE)
        os.setsid()   # not setpgid: a group apart in the terminal's session stops at an input() (SIGTTIN)
        verdict = EXIT_FAILED
        # the grading's own handles on stdout and stderr: the file may replace sys.stdout or
        # sys.stderr, close them, or close fd 1 or 2 (its refusals went to stdout, or nowhere)
        out = open(os.dup(1), "w", encoding=sys.stdout.encoding, errors=sys.stdout.errors)
        err = open(os.dup(2), "w", buffering=1, encoding=sys.stderr.encoding, errors=sys.stderr.errors)
        try:
            verdict = grade(file, loaded=lambda: os.write(write, LOADED), out=out, err=err)
            flush_stdout()   # the file's lines before the verdict: os._exit flushes nothing
        except KeyboardInterrupt as e:   # the file's own (raised, a SIGINT to itself): Ctrl-C reaches the grader alone
            flush_stdout()   # (it was exit 130 without a word, the report cut short)
            print(f"grade: {file}: the grading ended with no verdict: the file interrupted it itself "
                  f"({harness.describe_error(e)}); fix that and grade again", file=err)
            verdict = EXIT_UNLOADABLE
        except BaseException:   # noqa: BLE001  (the grader's own fault: its traceback, as ever)
            traceback.print_exc(file=err)
        finally:
            try:
                os.write(write, bytes([verdict]))
            finally:   # never back into the caller; the file's stray threads end with the child
                os._exit(verdict)
    os.close(write)
    with open(read, "rb", buffering=0) as verdicts:
        stops = {s: signal.signal(s, _stopped) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)}
        signal.alarm(GRADE_LIMIT_S + GRACE_S)   # the child's alarm is the file's to turn off: it looped for ever
        try:
            status = os.waitpid(pid, 0)[1]
        except (KeyboardInterrupt, Stopped) as stop:   # Ctrl-C (it reaches the grader alone), SIGTERM,
            status, signum = None, getattr(stop, "signum", signal.SIGINT)   # SIGHUP: quietly, as python
            os.kill(pid, signal.SIGKILL)   # -m repro.run; the grading with it (else it ran on up to its
            os.waitpid(pid, 0)             # limit), by its pid: it may not be a group of its own yet
        finally:
            signal.alarm(0)
            with contextlib.suppress(ProcessLookupError):   # what the file started (subprocess, os.fork,
                os.killpg(pid, signal.SIGKILL)               # multiprocessing): else it ran on after the grader
            end_descendants()   # and what left the group (os.setsid(), a daemon)
            for s, handler in stops.items():
                signal.signal(s, handler)
        if status is None and signum != signal.SIGALRM:
            return 128 + signum
        os.set_blocking(read, False)   # a process that left the group may still hold the pipe open
        sent = verdicts.read() or b""   # None or b"": the child sent nothing
        if status is None:   # as the child's alarm says it, had the file not turned it off
            print(f"grade: {file}: {TooLong(GRADE_LIMIT_S)}", file=sys.stderr)
            return EXIT_FAILED if LOADED in sent else EXIT_UNLOADABLE
        if verdict := sent.replace(LOADED, b""):
            return verdict[-1]
    code = os.waitstatus_to_exitcode(status)
    if code == -signal.SIGPIPE:   # grade FILE | head: the reader left, not the file; end as the child did
        os.kill(os.getpid(), signal.SIGPIPE)
    how = f"exit status {code}" if code >= 0 else f"signal {-code}, {signal.strsignal(-code)}"
    print(f"grade: {file}: the grading ended with no verdict ({how}): the file ended it itself "
          "(os._exit(), a signal, a crash); fix that and grade again", file=sys.stderr)
    return EXIT_UNLOADABLE


def end_descendants() -> None:
    """SIGKILL and reap every process below this one, found in /proc (Linux; elsewhere none). Each
    round reaps the grader's children, whose own then come to it, its subreaper, for the next."""
    me, spared = os.getpid(), set()
    while below := descendants(me) - spared:
        for p in below:
            try:
                os.kill(p, signal.SIGKILL)
            except PermissionError:   # a setuid program's: not the grader's to end (nor to wait for)
                spared.add(p)
            except ProcessLookupError:
                pass
        for p in below - spared:
            with contextlib.suppress(ChildProcessError):   # not (yet) the grader's child
                os.waitpid(p, 0)


def descendants(root: int) -> set[int]:
    """The pids below ``root``, zombies included, from each /proc/PID/stat's parent pid."""
    stats = {int(p.name): proc_stat(int(p.name)) for p in Path("/proc").glob("[0-9]*")}
    parent = {pid: int(fields[1]) for pid, fields in stats.items() if fields}   # None: ended meanwhile
    below, grew = set(), {root}
    while grew := {p for p, pp in parent.items() if pp in grew} - below:
        below |= grew
    return below


class Stopped(BaseException):
    """SIGTERM, SIGHUP or the grader's own alarm while the child grades."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stopped(signum: int, _frame) -> None:
    raise Stopped(signum)


@contextmanager
def time_limit(seconds: int):
    """A grading stopped after ``seconds`` fails (where there is SIGALRM and this is the main thread)."""
    def too_long(signum, frame):
        raise TooLong(seconds)
    try:
        previous = signal.signal(signal.SIGALRM, too_long)
    except (AttributeError, ValueError):   # no SIGALRM, or not the main thread
        yield
        return
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
