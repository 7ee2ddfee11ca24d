"""The shell commands of a markdown file, as a reader would paste them, sorted by what running
them costs. Used by ``tests/test_docs.py``; no test lives here.

**What is a command.** Every line of a fenced code block whose info string is ``bash``, ``sh``,
``shell``, ``console`` or ``shell-session`` (``` or ~~~ fences, indented ones too). Lines ending
in ``\\`` are joined with the next (as bash does); blank lines and whole-line comments are
dropped; a trailing ``# comment`` is split off (quote-aware). In ``console`` /
``shell-session`` blocks only lines starting with ``$ `` are commands (the rest is output). A
command is split at ``&&`` into *steps*, each classified on its own. :func:`inline_commands`
also finds inline code spans that start with ``python -m repro.`` (tables, prose): those are
checked, never run.

**Tiers** (:data:`TIERS`, cheapest first), per step:

* ``setup``: creates a virtual environment or installs packages (``python -m venv``,
  ``pip install``). The environment the tests run in is that set-up already (``.ci/run`` makes
  it exactly so), so a setup step is never run and never holds back the steps after it.
* ``quick``: run by the default test suite: a single ``python -m repro.run`` on the simulator
  (an ``+exp=`` that is not a grid, e.g. ``smoke``), any ``python -m repro.analysis``, any
  ``--help``.
* ``slow``: run by ``pytest -m slow``: ``python -m repro.run backend=real`` (real processes, 10-30
  s each on 2 cores), command-line sweeps (``-m``, ``a=1,2``), ``python -m repro.bench``
  (benchmarks), ``torchrun --standalone``, and any command not recognised.
* ``manual``: no test runs it: figure grids (an ``+exp=`` whose file sets ``hydra.mode:
  MULTIRUN``: minutes each; their overrides are composed and validated instead), ``pytest``
  (the suite itself), multi-node ``torchrun`` (needs the other node), scripts (``bash
  scripts/gpu_check.sh``: needs a GPU), ``cd`` / ``export`` / ``source`` (each command runs in
  its own shell), and commands with a ``<placeholder>``.

**One block is one sequence.** A later command may use what an earlier one wrote (``cost.path=``
of a replay names the run folder of the command above it; ``python -m repro.analysis`` redraws
from the grid above it), so a step never runs in a cheaper tier than any earlier non-setup step
of its block: it inherits the block's most expensive tier so far. Commands that do not depend on
each other belong in separate blocks.

**An activated shell.** The docs' commands are written for a shell in which the README's
set-up activated the virtual environment once (:func:`activation` finds that command;
:func:`unactivated_env` is a shell before it); ``tests/test_docs.py`` runs each step after it.

**Markers**, for when the rules above are wrong for a command:

* a trailing comment holding ``test: quick``, ``test: slow`` or ``test: skip`` (= ``manual``)
  sets the tier of every non-setup step of that command, inheritance included (``test: quick``
  declares the command cheap *and* independent of the lines above it), e.g.
  ``python -m repro.run +exp=fig3 num_epochs=1   # test: quick``; a whole-line comment
  ``# test: TIER`` does the same for the command after it; ``# slow`` alone means ``test: slow``;
* ``<!-- test: skip -->`` (or ``quick`` / ``slow``) on the last non-blank line before a fence
  sets the tier of the whole block;
* ``# exits N`` in a trailing comment: the command's expected exit status (default 0), e.g.
  ``python -m repro.run num_clients=0   # exits 2: a bad value``.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

TIERS = ("setup", "quick", "slow", "manual")
SHELL_FENCES = {"bash", "sh", "shell", "console", "shell-session", "shellsession"}
PROMPT_FENCES = {"console", "shell-session", "shellsession"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_MARKER = re.compile(r"\btest:\s*(quick|slow|skip|manual)\b")
_HTML_MARKER = re.compile(r"<!--\s*test:\s*(quick|slow|skip|manual)\s*-->")
_EXITS = re.compile(r"\bexits?\s+(\d+)\b")
_PLACEHOLDER = re.compile(r"<[A-Za-z][\w .-]*>")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Step:
    """One ``&&``-separated part of a command."""

    text: str
    kind: str    # install, pytest, run, experiment, real, sweep, analysis, bench, help, torchrun,
                 # script, shell, other
    tier: str    # one of TIERS, after markers and the block's inheritance
    why: str     # why that tier (for reports)
    argv: tuple[str, ...] = ()   # shlex-split words (environment assignments dropped)

    @property
    def module(self) -> str | None:
        """``repro.run`` for ``python -m repro.run ...`` (also under torchrun), else None."""
        args = list(self.argv)
        if "-m" in args and args.index("-m") + 1 < len(args):
            return args[args.index("-m") + 1]
        return None

    @property
    def module_args(self) -> list[str]:
        """The words after ``-m MODULE``."""
        args = list(self.argv)
        return args[args.index("-m") + 2:] if self.module else []


@dataclass(frozen=True)
class Command:
    """One command line as bash reads it, with where it stands in the markdown."""

    file: str
    line: int        # 1-based line of its first line in the markdown
    block: int       # index of its fenced block in the file (-1: an inline code span)
    text: str        # continuations joined, trailing comment removed
    comment: str     # the trailing comment, '' if none
    steps: tuple[Step, ...] = field(default_factory=tuple)
    exit_code: int = 0

    @property
    def kind(self) -> str:
        return self.steps[0].kind if self.steps else "other"

    @property
    def tier(self) -> str:
        """The most expensive tier among its steps (``setup`` only if every step is)."""
        return max((s.tier for s in self.steps), key=TIERS.index, default="manual")

    def where(self) -> str:
        return f"{self.file}:{self.line}"


# ---------------------------------------------------------------------------------------------
# Lexing: comments and && outside quotes
# ---------------------------------------------------------------------------------------------

def _unquoted(text: str):
    """Indices of the characters outside quotes, as bash reads them: a backslash escapes the next
    character (not inside '...'), and the quote characters themselves are not yielded."""
    quote, i = None, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'":
            i += 2
            continue
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        else:
            yield i
        i += 1


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment): a ``#`` that starts a word outside quotes starts a comment, as in bash."""
    for i in _unquoted(line):
        if line[i] == "#" and (i == 0 or line[i - 1] in " \t;&|("):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def split_and(text: str) -> list[str]:
    """The parts of ``a && b && c`` (``&&`` outside quotes); other operators stay inside."""
    parts, start = [], 0
    for i in _unquoted(text):
        if i >= start and text.startswith("&&", i):   # i < start: the second '&' of the last '&&'
            parts.append(text[start:i].strip())
            start = i + 2
    parts.append(text[start:].strip())
    return [p for p in parts if p]


# ---------------------------------------------------------------------------------------------
# Classification
# ---------------------------------------------------------------------------------------------

def is_grid(exp: str, conf_dir: Path | None = None) -> bool:
    """True when ``+exp=EXP`` is a Hydra grid (its file sets ``hydra.mode: MULTIRUN``)."""
    if conf_dir is None:
        from repro.config.loader import CONF_DIR as conf_dir
    path = Path(conf_dir) / "exp" / f"{exp}.yaml"
    try:
        text = path.read_text()
    except OSError:
        return False   # an unknown experiment: the compose check reports it
    return bool(re.search(r"^\s*mode:\s*MULTIRUN\b", text, re.M)
                or re.search(r"^\s*sweeper:\s*$", text, re.M))


def has_placeholder(text: str) -> bool:
    """True when ``text`` holds a ``<placeholder>`` for the reader to fill in."""
    return bool(_PLACEHOLDER.search(text))


def _is_python(word: str) -> bool:
    return bool(re.fullmatch(r"python(3(\.\d+)?)?", Path(word).name))


def _is_sweep(args: list[str]) -> bool:
    """A Hydra sweep: ``-m``, or a value with a comma or a sweep function outside quotes
    (``cost.path='a/b=1,c=2'`` is one value)."""
    unquoted = (re.sub(r"'[^']*'|\"[^\"]*\"", "''", a) for a in args if not a.startswith(("hydra", "-")))
    return any(a in ("-m", "--multirun") for a in args) or any(
        "=" in a and re.search(r"=(.*,|(range|choice|interval|glob)\()", a) for a in unquoted)


def classify(text: str, conf_dir: Path | None = None) -> tuple[str, str, str, tuple[str, ...]]:
    """(kind, tier, why, argv) of one step, before markers and inheritance."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        return "other", "slow", f"does not split as shell words ({e})", ()
    while words and _ENV_ASSIGN.match(words[0]):
        words = words[1:]
    argv = tuple(words)
    if not words:
        return "shell", "manual", "only environment assignments", argv
    if has_placeholder(text):
        return "other", "manual", "holds a <placeholder> to fill in", argv
    prog, args = Path(words[0]).name, words[1:]
    help_asked = "--help" in args or "-h" in args
    if _is_python(words[0]) and args[:1] == ["-m"] and len(args) > 1:
        module, rest = args[1], args[2:]
        if module in ("venv", "virtualenv"):
            return "install", "setup", "creates a virtual environment", argv
        if module == "pip":
            if rest[:1] == ["install"]:
                return "install", "setup", "installs packages", argv
            return "other", "slow", "a pip command", argv
        if module == "pytest":
            return "pytest", "manual", "runs the test suite (this test is part of it)", argv
        if help_asked:
            return "help", "quick", "--help", argv
        if module == "repro.run":
            return _classify_run(rest, argv, conf_dir)
        if module == "repro.analysis":
            return "analysis", "quick", "draws from run folders", argv
        if module == "repro.bench":
            return "bench", "slow", "a benchmark (minutes)", argv
        return "other", "slow", f"python -m {module}: not recognised", argv
    if prog in ("pip", "pip3"):
        if args[:1] == ["install"]:
            return "install", "setup", "installs packages", argv
        return "other", "slow", "a pip command", argv
    if prog == "pytest":
        return "pytest", "manual", "runs the test suite (this test is part of it)", argv
    if prog in ("virtualenv",) or (prog == "uv" and args[:1] in (["venv"], ["pip"])):
        return "install", "setup", "creates or fills a virtual environment", argv
    if prog == "torchrun":
        if help_asked:
            return "help", "quick", "--help", argv
        nnodes = next((a.split("=", 1)[1] for a in args if a.startswith("--nnodes=")), None)
        if nnodes is None and "--nnodes" in args:
            nnodes = args[args.index("--nnodes") + 1] if args.index("--nnodes") + 1 < len(args) else None
        if "--standalone" in args or nnodes in (None, "1", "1:1"):
            return "torchrun", "slow", "torchrun on one node: real processes", argv
        return "torchrun", "manual", f"torchrun over {nnodes} nodes: needs the other nodes", argv
    if prog in ("bash", "sh", "zsh") or prog.endswith(".sh") \
            or words[0].startswith(("./", "scripts/", ".ci/")):
        return "script", "manual", "a script (may need a GPU, may install or delete)", argv
    if prog in ("cd", "export", "source", ".", "set", "unset", "alias"):
        return "shell", "manual", f"'{prog}' changes the shell, and each command runs in its own", argv
    return "other", "slow", f"'{prog}': not recognised", argv


def _classify_run(rest: list[str], argv: tuple[str, ...], conf_dir) -> tuple[str, str, str, tuple]:
    exps = [a.split("=", 1)[1] for a in rest if a.startswith("+exp=")]
    grids = [e for e in exps if any(is_grid(x, conf_dir) for x in e.split(","))]
    if grids:
        return "experiment", "manual", f"+exp={grids[0]} is a figure grid (minutes; composed only)", argv
    if _is_sweep(rest):
        return "sweep", "slow", "a sweep: one run per grid point", argv
    if any(a in ("backend=real", "backend=real,") for a in rest):
        return "real", "slow", "backend=real: num_clients + 1 processes (10-30 s)", argv
    return "run", "quick", "one simulated run", argv


# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------

def _marker(comment: str) -> str | None:
    m = _MARKER.search(comment)
    if m:
        return "manual" if m.group(1) == "skip" else m.group(1)
    if re.fullmatch(r"slow\b.*", comment.strip()):
        return "slow"
    return None


def _blocks(lines: list[str]) -> list[tuple[int, str, str | None, list[tuple[int, str]]]]:
    """(index, info word, HTML marker tier, [(lineno, text), ...]) of every fenced block."""
    out, i, last_text = [], 0, ""
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                last_text = lines[i]
            i += 1
            continue
        indent, fence = m.group("indent"), m.group("fence")
        info = (m.group("info").strip().split() or [""])[0].lower()
        hm = _HTML_MARKER.search(last_text)
        marker = ("manual" if hm.group(1) == "skip" else hm.group(1)) if hm else None
        body, j = [], i + 1
        while j < len(lines):
            close = _FENCE.match(lines[j])
            if close and close.group("fence")[0] == fence[0] \
                    and len(close.group("fence")) >= len(fence) and not close.group("info").strip():
                break
            text = lines[j]
            if text.startswith(indent):
                text = text[len(indent):]
            body.append((j + 1, text))
            j += 1
        out.append((len(out), info, marker, body))
        last_text, i = "", j + 1
    return out


def extract(path: str | Path, conf_dir: Path | None = None) -> list[Command]:
    """Every command of the shell blocks of the markdown file ``path``, in order."""
    path = Path(path)
    lines = path.read_text().splitlines()
    commands: list[Command] = []
    for index, info, block_marker, body in _blocks(lines):
        if info not in SHELL_FENCES:
            continue
        prompt = info in PROMPT_FENCES
        pending_marker, block_tier = None, "setup"
        k = 0
        while k < len(body):
            lineno, raw = body[k]
            k += 1
            if prompt:
                if not raw.lstrip().startswith("$ "):
                    continue
                raw = raw.lstrip()[2:]
            stripped = raw.strip()
            if not stripped:
                continue
            if stripped.startswith("#"):
                pending_marker = _marker(stripped[1:]) or pending_marker
                continue
            code_lines, comments = [], []
            code, comment = split_comment(raw)
            while code.endswith("\\") and k < len(body):   # a continuation: bash joins the lines
                code_lines.append(code[:-1].rstrip())
                comments.append(comment)
                code, comment = split_comment(body[k][1])
                k += 1
            code_lines.append(code.strip())
            comments.append(comment)
            text = " ".join(c.strip() for c in code_lines if c.strip())
            comment = " ".join(c for c in comments if c)
            marker = _marker(comment) or pending_marker or block_marker
            pending_marker = None
            exits = _EXITS.search(comment)
            steps = []
            for part in split_and(text):
                kind, tier, why, argv = classify(part, conf_dir)
                if marker and tier != "setup":
                    tier, why = marker, f"marked test: {marker}"
                elif tier != "setup" and TIERS.index(block_tier) > TIERS.index(tier):
                    tier, why = block_tier, f"after a {block_tier} command of its block ({why})"
                if tier != "setup" and not (marker == "quick"):
                    block_tier = max(block_tier, tier, key=TIERS.index)
                elif tier != "setup":
                    block_tier = max(block_tier, "quick", key=TIERS.index)
                steps.append(Step(part, kind, tier, why, argv))
            commands.append(Command(str(path.name), lineno, index, text, comment, tuple(steps),
                                    int(exits.group(1)) if exits else 0))
    return commands


def activation(path: str | Path) -> str | None:
    """The command of the markdown file ``path`` that activates the virtual environment
    (``. .venv/bin/activate`` or ``source .venv/bin/activate``), as written; None if it has none.
    Every later command of the docs is meant for a shell in which it ran."""
    for cmd in extract(path):
        for step in cmd.steps:
            args = list(step.argv)
            if len(args) == 2 and args[0] in (".", "source") and args[1].endswith("bin/activate"):
                return step.text
    return None


def unactivated_env() -> dict[str, str]:
    """The environment of a fresh shell on this machine: the virtual environment running the
    tests off ``PATH``, no ``VIRTUAL_ENV`` (nor ``PYTHONPATH``); ``MPLBACKEND=Agg``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv_bins = {str(Path(sys.prefix) / "bin"), str(Path(sys.executable).parent)}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and p not in venv_bins)
    env["MPLBACKEND"] = "Agg"
    return env


def inline_commands(path: str | Path, prefix: str = "python -m repro.", conf_dir: Path | None = None
                    ) -> list[Command]:
    """Inline code spans (outside fenced blocks) that start with ``prefix``; a span may wrap
    onto the next line, as in a paragraph. Classified like fenced commands (block -1)."""
    path = Path(path)
    lines = path.read_text().splitlines()
    fenced = set()
    for _, _, _, body in _blocks(lines):
        if body:
            fenced.update(range(body[0][0] - 1, body[-1][0] + 2))
    # paragraphs: runs of non-blank lines outside fences, joined with spaces (as markdown does)
    out, para, start = [], [], 0
    for i, line in enumerate(lines + [""]):
        if i in fenced or not line.strip() or _FENCE.match(line):
            if para:
                out.extend(_spans(path.name, para, start, prefix, conf_dir))
            para = []
            continue
        if not para:
            start = i
        para.append(line.strip())
    return out


def _spans(file: str, para: list[str], start: int, prefix: str, conf_dir) -> list[Command]:
    text = " ".join(para)
    breaks, pos = [], 0          # offsets in ``text`` where each next line starts
    for line in para[:-1]:
        pos += len(line) + 1
        breaks.append(pos)
    out = []
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        span = m.group(1).strip()
        if span.startswith(prefix):
            lineno = start + 1 + sum(b <= m.start() for b in breaks)
            kind, tier, why, argv = classify(span, conf_dir)
            out.append(Command(file, lineno, -1, span, "", (Step(span, kind, tier, why, argv),)))
    return out
