"""Every command in the markdown works when a reader pastes it.

The commands and their tiers come from :mod:`tests.helpers.docs_commands` (its docstring is the
convention: which commands run in the default suite, which with ``-m slow``, which never, and
the ``# test: ...`` / ``<!-- test: skip -->`` / ``# exits N`` markers).

**How a command is run.** As written, through ``bash -c``, one ``&&`` step at a time (set-up steps
skipped: the test environment is that set-up), in order, per file, with the exit status each
step must have (0, or the command's ``# exits N``). Nothing in a command is rewritten. It runs in
a temporary copy of the working tree (git's tracked and untracked-not-ignored files), so
relative paths mean what they mean in the checkout and everything a run writes (``results/``,
``figures/``) lands in the copy, never in the checkout; ``.venv`` in the copy links to the
environment running the tests. Each step runs in a shell that is not activated (the
environment's ``bin`` is off ``PATH``, no ``VIRTUAL_ENV``), after the README's activation command
(:func:`tests.docs_commands.activation`), as a reader who followed the set-up pastes it: a doc
that never says to activate fails here. ``MPLBACKEND=Agg``, as on a machine without a display.
A file whose quick steps are the first ones of a file run before in the session (the same
commands, in the same order, in an identical copy) reads their exit statuses back.

**Checked without running** (default suite, seconds): every ``python -m repro.run`` of the
markdown, fenced or inline, slow and manual ones included (figure grids: every grid point;
multi-node torchrun: its overrides), composes and validates as ``python -m repro.run`` would
before training (:func:`repro.run.check_overrides`, :func:`repro.run.compose`,
:func:`repro.run.parse`, :func:`repro.workload.build.check_components`); every ``cost.path=`` names a run
folder that an earlier command of its block writes (or one in the repository); every fenced
``python -m repro.analysis`` draws from a results tree like the one its experiments leave
(:mod:`tests.helpers.fake_runs`).

**What the prose quotes** (default suite, seconds): the default run's last lines, run (or read
back from the README's quick commands, whose first is that run); the signatures of
``repro.api``; the speedup tables against their CSVs; dotted names of the package, configuration
keys, group options and test names, each against what exists; the relative links of the pages
the site does not build (README.md, exercises/README.md).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import itertools
import os
import re
import shutil
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path

import pytest

from tests.helpers import configs
from tests.helpers import docs_commands as dc
from tests.helpers import fake_runs
from tests.helpers.paths import ROOT, tree_files

# The top-level files and every page of the documentation site (docs/), wherever a command moves.
DOCS = ("README.md", "REPRODUCE.md", "TEACHING.md",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")))
QUICK_TIMEOUT_S, SLOW_TIMEOUT_S = 180, 600


def _doc(name: str) -> Path:
    path = ROOT / name
    if not path.is_file():
        pytest.skip(f"{name} does not exist (yet)")
    return path


def _all_commands(inline: bool = False) -> list[dc.Command]:
    out = []
    for name in DOCS:
        if (ROOT / name).is_file():
            out += dc.extract(ROOT / name)
            if inline:
                out += dc.inline_commands(ROOT / name)
    return out


# ---------------------------------------------------------------------------------------------
# The extraction itself
# ---------------------------------------------------------------------------------------------

SAMPLE = '''# Title

```bash
python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && .venv/bin/python -m repro.run
.venv/bin/python -m pytest
```

```python
print("not a shell block")
```

```sh
# a comment line
python -m repro.run num_clients=2 \\
  nsync=4   # two clients; a '#' in "quotes # here" stays
python -m repro.run num_clients=0   # exits 2: a bad value
python -m repro.run +exp=fig3
python -m repro.analysis fig3 --results results
python -m repro.run +exp=fig3 num_epochs=1   # test: quick
```

<!-- test: skip -->
```bash
python -m repro.run
```

``` console
$ python -m repro.run backend=real num_clients=2
completed: version 45 ...
$ torchrun --nnodes=2 -m repro.run backend=real
$ bash scripts/gpu_check.sh
```

Inline: `python -m repro.run +exp=fig2
algo=sgd` wraps onto a second line.
'''


def test_extraction_follows_the_documented_convention(tmp_path):
    md = tmp_path / "SAMPLE.md"
    md.write_text(SAMPLE)
    cmds = dc.extract(md)
    assert [c.line for c in cmds] == [4, 5, 14, 16, 17, 18, 19, 24, 28, 30, 31]
    setup, tests, two, bad, grid, redraw, marked, skipped, real, nodes, script = cmds
    assert [s.kind for s in setup.steps] == ["install", "install", "run"]
    assert [s.tier for s in setup.steps] == ["setup", "setup", "quick"]
    assert setup.kind == "install" and tests.kind == "pytest" and tests.tier == "manual"
    assert two.text == "python -m repro.run num_clients=2 nsync=4"     # continuation joined
    assert two.steps[0].module_args == ["num_clients=2", "nsync=4"] and two.tier == "quick"
    assert bad.exit_code == 2 and bad.tier == "quick"
    assert grid.kind == "experiment" and grid.tier == "manual"
    assert redraw.kind == "analysis" and redraw.tier == "manual"          # after the grid
    assert marked.tier == "quick" and marked.steps[0].why == "marked test: quick"
    assert skipped.tier == "manual"                                       # <!-- test: skip -->
    assert real.kind == "real" and real.tier == "slow"                    # console: $ lines only
    assert nodes.kind == "torchrun" and nodes.tier == "manual"
    assert script.kind == "script" and script.tier == "manual"
    inline = dc.inline_commands(md)
    assert [(c.line, c.text) for c in inline] == [(34, "python -m repro.run +exp=fig2 algo=sgd")]


def test_comments_and_and_lists_respect_quotes():
    assert dc.split_comment("""echo "a # b" 'c # d' # real""") == ("""echo "a # b" 'c # d'""", "real")
    assert dc.split_comment("echo a#b") == ("echo a#b", "")
    assert dc.split_and("""a && echo "x && y" && c""") == ["a", 'echo "x && y"', "c"]


def test_readme_setup_block_is_found_and_not_run_here():
    readme = dc.extract(_doc("README.md"))
    first = [c for c in readme if c.block == readme[0].block]
    assert len(first) == 2, [c.text for c in first]
    install, suite = first
    assert install.kind == "install" and "pip install" in install.text
    assert install.steps[0].tier == "setup" and any(
        s.kind == "install" and s.tier == "setup" for s in install.steps[1:]), install.steps
    assert suite.kind == "pytest" and suite.tier == "manual" and "pytest" in suite.text


# ---------------------------------------------------------------------------------------------
# Running them
# ---------------------------------------------------------------------------------------------

def _workdir(tmp: Path) -> Path:
    """A copy of the working tree, with ``.venv`` linking to the environment running the tests."""
    work = tmp / "checkout"
    for rel in (n for n in tree_files() if (ROOT / n).is_file()):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, work / rel)
    (work / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return work


def _shell(work: Path) -> tuple[dict[str, str], str]:
    """(environment, prefix) of a docs step: an un-activated shell that runs the README's
    activation first. Without an activation script to run (the tests' Python is no virtual
    environment), the environment's ``bin`` goes first on ``PATH`` instead."""
    activate = dc.activation(ROOT / "README.md")
    if activate and (work / ".venv" / "bin" / "activate").is_file():
        return dc.unactivated_env(), f"{activate} && "
    env = dc.unactivated_env()
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    return env, ""


def _steps(path: Path, tiers: set[str]) -> list[tuple[dc.Command, dc.Step, int]]:
    """(command, step, the exit status it must have) of ``path``'s steps whose tier is in
    ``tiers``, in order."""
    out = []
    for cmd in dc.extract(path):
        last = max((i for i, s in enumerate(cmd.steps) if s.tier != "setup"), default=-1)
        out += [(cmd, step, cmd.exit_code if i == last else 0)
                for i, step in enumerate(cmd.steps) if step.tier in tiers]
    return out


def _run_step(text: str, work: Path, timeout_s: float) -> tuple[int | str, str, float]:
    """(exit status, output, seconds) of one step run in ``work`` as a reader pastes it."""
    env, prefix = _shell(work)
    start = time.monotonic()
    try:
        proc = subprocess.run(["bash", "-c", prefix + text], cwd=work, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
        rc, out = proc.returncode, (proc.stdout + proc.stderr).strip()
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", f"still running after {timeout_s} s: {e.stderr or ''}"
    return rc, out, time.monotonic() - start


# What the quick steps did, by the steps (texts, in order) run up to each in a fresh copy of the
# tree. A file whose quick steps are the first ones of a file run before (getting-started's
# `.venv/bin/python -m repro.run` is the README's first) reads their outcomes back: the same
# steps in an identical copy, run seconds ago in this session, need not run twice.
_QUICK_OUTCOMES: dict[tuple[str, ...], tuple[int | str, str, float]] = {}


def run_commands(path: Path, tiers: set[str], tmp: Path, timeout_s: float,
                 known: dict | None = None) -> tuple[list[str], list[str]]:
    """Run the steps of ``path``'s commands whose tier is in ``tiers``, in order, in a copy of
    the tree made under ``tmp``; with ``known``, read back what the same steps did in an earlier
    copy (every one of them run there, in this order) and record what runs. Returns (failures,
    what ran), each one line (or a few) per step."""
    failures, ran = [], []
    steps = _steps(path, tiers)
    texts = tuple(step.text for _, step, _ in steps)
    read_back = known is not None and all(texts[:n] in known for n in range(1, len(texts) + 1))
    work = None if read_back else _workdir(tmp)
    for n, (cmd, step, expected) in enumerate(steps, 1):
        if read_back:
            rc, out, took = known[texts[:n]]
        else:
            rc, out, took = _run_step(step.text, work, timeout_s)
            if known is not None:
                known[texts[:n]] = rc, out, took
        ran.append(f"{cmd.where()} [{took:.1f} s{', read back' if read_back else ''}] {step.text}")
        if rc != expected:
            tail = "\n      ".join(str(out).splitlines()[-8:])
            failures.append(f"{cmd.where()}: `{step.text}` exited {rc}, expected {expected} "
                            f"({took:.1f} s):\n      {tail}")
    return failures, ran


@pytest.mark.parametrize("name", DOCS)
def test_quick_commands_work_as_written(name, tmp_path):
    path = _doc(name)
    failures, ran = run_commands(path, {"quick"}, tmp_path, QUICK_TIMEOUT_S, _QUICK_OUTCOMES)
    assert not failures, f"{len(failures)} of {len(ran)} quick command(s) of {name} failed:\n" + \
        "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("name", DOCS)
def test_slow_commands_work_as_written(name, tmp_path):
    """Quick and slow steps together, in order: a slow step may need what a quick one wrote."""
    path = _doc(name)
    failures, ran = run_commands(path, {"quick", "slow"}, tmp_path, SLOW_TIMEOUT_S)
    assert not failures, f"{len(failures)} of {len(ran)} quick and slow command(s) of {name} " \
        "failed:\n" + "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# Checked without running
# ---------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _grid(args: tuple[str, ...]):
    """(overrides that are single values, {key: values} of the grid, the config composed from
    the former), as Hydra's basic sweeper makes the grid: the experiment's
    ``hydra.sweeper.params``, then the command line's overrides, a later one replacing an earlier
    one of the same key. No grid: ``{}``. Raises what composing raises.

    Composed once with Hydra's node, which is then dropped as ``hydra.compose`` drops it, and
    kept per command (read-only): both checks without running ask it of the same commands."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict

    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    fixed = [text for text, o in zip(overrides, parsed) if not o.is_sweep_override()]
    base = configs.composed(fixed, hydra=True)
    grid: dict[str, tuple[str, ...]] = {}
    multirun = "-m" in args or "--multirun" in args or str(base.hydra.mode) == "RunMode.MULTIRUN"
    if multirun or any(o.is_sweep_override() for o in parsed):
        for key, value in (base.hydra.sweeper.get("params") or {}).items():
            grid[key] = tuple(parser.parse_overrides([f"{key}={value}"])[0].sweep_string_iterator())
        for o in parsed:
            if o.is_sweep_override():
                grid[o.get_key_element()] = tuple(o.sweep_string_iterator())
            else:
                grid.pop(o.get_key_element(), None)   # the single value (in ``base``) wins
    with open_dict(base):
        del base["hydra"]
    OmegaConf.set_readonly(base, True)
    return tuple(fixed), types.MappingProxyType(grid), base


def compose_errors(args: list[str]) -> list[str]:
    """What ``python -m repro.run ARGS`` would refuse before training, as messages ([] = none).
    A grid (``+exp=`` with a sweep, or a sweep on the command line) is checked at every point."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from repro import run as rr
    from repro.config import loader
    from repro.errors import ConfigError
    from repro.workload.build import check_components

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            rr.check_overrides(args)
    except SystemExit as e:
        return [f"exit {e.code}: {err.getvalue().strip()}"]
    try:
        fixed, grid, base = _grid(tuple(args))
    except Exception as e:   # noqa: BLE001 - Hydra's composition errors have no common base
        return [f"does not compose: {str(e).splitlines()[0]}"]
    parser = OverridesParser.create()
    groups = set(loader.GROUPS) | set(loader.OPTIONAL_GROUPS)
    checked, errors = set(), {}      # message -> the grid points that raise it
    # per choice of the point's groups: composed once, and its plain keys set for each point;
    # every point sets every plain key of the grid, so a point's values replace the last one's
    # (a dict or list value is merged into the last one's instead: those points start afresh)
    composed = {(): OmegaConf.create(OmegaConf.to_container(base, resolve=False))}
    value = {(k, v): parser.parse_overrides([f"{k}={v}"])[0].value()   # per key and value: parsed once
             for k, vs in grid.items() if k.lstrip("+") not in groups for v in vs}
    replaced = not any(isinstance(v, (dict, list)) for v in value.values())
    for values in itertools.product(*grid.values()):
        point = dict(zip(grid, values))
        try:
            chosen = tuple((k, v) for k, v in point.items() if k.lstrip("+") in groups)
            if chosen not in composed:       # a group per point: compose it as Hydra would
                composed[chosen] = OmegaConf.create(configs.container([*fixed, *(f"{k}={v}" for k, v in chosen)]))
            dcfg = composed[chosen] if replaced else OmegaConf.create(OmegaConf.to_container(composed[chosen]))
            for key, text in point.items():   # plain keys: set them on the composed tree
                if key.lstrip("+") not in groups:
                    OmegaConf.update(dcfg, key, copy.deepcopy(value[key, text]), force_add=False)
            cfg = rr.parse(dcfg)
            pair = (cfg.data.name, cfg.model.name)
            if pair not in checked:
                check_components(cfg)
                checked.add(pair)
        except ConfigError as e:
            errors.setdefault(str(e), []).append(", ".join(f"{k}={v}" for k, v in point.items()))
    return [f"{msg} (at {points[0] or 'the run'}" + (f" and {len(points) - 1} more grid points)"
                                                     if len(points) > 1 else ")")
            for msg, points in errors.items()]


def _run_steps(inline: bool = True) -> list[tuple[dc.Command, dc.Step]]:
    seen, out = set(), []
    for cmd in _all_commands(inline):
        for step in cmd.steps:
            if step.module == "repro.run" and "--help" not in step.argv \
                    and not dc.has_placeholder(step.text):
                key = tuple(step.module_args)
                if key not in seen:
                    seen.add(key)
                    out.append((cmd, step))
    return out


def test_every_run_command_composes_and_validates():
    """Fenced and inline, every tier (figure grids at every grid point, torchrun's overrides):
    what python -m repro.run checks before it trains."""
    steps = _run_steps()
    assert steps, "no python -m repro.run command found in the markdown"
    problems = []
    for cmd, step in steps:
        errors = compose_errors(step.module_args)
        if cmd.exit_code == 2:     # documented as refused: it must be
            if not errors:
                problems.append(f"{cmd.where()}: `{step.text}` is documented to exit 2, but composes")
        elif errors:
            problems.append(f"{cmd.where()}: `{step.text}`:\n    " + "\n    ".join(errors[:5]))
    assert not problems, "\n".join(problems)


def _written_folders(step: dc.Step) -> set[Path]:
    """The run folders ``python -m repro.run ARGS`` writes (every grid point's for a grid),
    relative to the directory it is run in."""
    from omegaconf import OmegaConf

    from repro.config.loader import job_name

    try:
        fixed, grid, base = _grid(tuple(step.module_args))
    except Exception:   # noqa: BLE001 - reported by the compose check
        return set()
    tree = OmegaConf.to_container(base, resolve=True)
    root = Path(str(tree["results_dir"])) / str(tree["exp_name"])
    return {root / job_name([*fixed, *(f"{k}={v}" for k, v in zip(grid, values))])
            for values in itertools.product(*grid.values())}


def test_every_replay_path_names_a_run_folder_written_above_it():
    """``cost.path=`` of a replay: a folder an earlier command of its block writes (as Hydra
    names it: repro.config.loader.job_name), or a run folder in the repository."""
    problems, found = [], 0
    for name in DOCS:
        if not (ROOT / name).is_file():
            continue
        written: dict[int, dict[Path, str]] = {}
        for cmd in dc.extract(ROOT / name):
            for step in cmd.steps:
                if step.module != "repro.run":
                    continue
                paths = [a.split("=", 1)[1] for a in step.module_args if a.startswith("cost.path=")]
                for value in paths:
                    found += 1
                    target = Path(value.strip("'\""))
                    above = written.get(cmd.block, {})
                    if target in above or (ROOT / target / "config.json").is_file():
                        continue
                    problems.append(f"{cmd.where()}: cost.path={value} is no run folder: the commands "
                                    "above it in its block write " + (", ".join(
                                        f"{p} ({w})" for p, w in above.items()) or "none"))
                for folder in _written_folders(step):
                    written.setdefault(cmd.block, {})[folder] = f"line {cmd.line}"
    if not found:
        pytest.skip("no cost.path= in the markdown")
    assert not problems, "\n".join(problems)


def test_every_analysis_command_draws_from_a_results_tree(tmp_path, monkeypatch):
    """Fenced ``python -m repro.analysis`` commands for the paper's figures (and compare), whatever
    their tier, in a folder whose ``results/`` holds experiments fig1..fig4 as the figure
    commands write them (fake curves). The lab's figures are redrawn by their own tests
    (tests/test_lab_*.py), from real shrunk runs."""
    from repro.analysis import build_figure
    from repro.analysis.__main__ import main

    paper = {"fig1", "fig2", "fig3", "fig4", "staleness", "all", "compare"}
    steps = [(c, s) for c in _all_commands() for s in c.steps
             if s.module == "repro.analysis" and not dc.has_placeholder(s.text)
             and s.module_args[:1] and s.module_args[0] in paper]
    if not steps:
        pytest.skip("no python -m repro.analysis command in the markdown")
    fake_runs.make_results(tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    problems = []
    for cmd, step in steps:
        if step.module_args[:1] == ["compare"]:   # the trees it compares: as the commands above write them
            for name in step.module_args[1:3]:
                if (tmp_path / name).exists():
                    continue
                if "figures" in name:   # a figures folder, as +exp=... figures_dir=NAME writes it
                    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        build_figure("all", tmp_path / "results", tmp_path / name)
                else:
                    shutil.copytree(tmp_path / "results", tmp_path / name)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(step.module_args)
            except SystemExit as e:   # argparse
                code = e.code
        if code != cmd.exit_code:
            problems.append(f"{cmd.where()}: `{step.text}` exited {code}, expected {cmd.exit_code}: "
                            + (err.getvalue().strip().splitlines() or [""])[-1])
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# What the docs quote of a run or of the API
# ---------------------------------------------------------------------------------------------

def test_the_readme_shows_the_last_lines_the_default_run_prints(tmp_path):
    """The README's (and getting-started's) last lines of ``python -m repro.run`` are the run's,
    but the wall time; its test error only on the build and CPU kernels that recorded the
    golden tables (elsewhere one evaluation sample may flip: docs/paper.md, 'Reproducibility')."""
    from tests.test_golden import RECORDED

    from repro.runtime import environment

    # the README's first quick step is this run as a reader pastes it: when the quick commands'
    # test ran it in this session, its output is read back (the default run again costs seconds)
    first = _steps(_doc("README.md"), {"quick"})[0][1]
    pasted = _QUICK_OUTCOMES.get((first.text,)) if (first.module, first.module_args) == ("repro.run", []) else None
    if pasted and pasted[0] == 0:
        output = pasted[1]
    else:
        done = subprocess.run([sys.executable, "-m", "repro.run"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=QUICK_TIMEOUT_S,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"})
        assert done.returncode == 0, done.stderr[-2000:]
        output = done.stderr + "\n" + done.stdout
    env = environment("cpu")
    same = env["torch"] == RECORDED["torch"] and env["cpu_capability"] == RECORDED["cpu_capability"]

    def masked(text: str) -> str:
        text = re.sub(r"wall [\d.]+ s", "wall T s", text)
        return text if same else re.sub(r"test error [\d.]+%", "test error E%", text)

    # the status line is logged (stderr), the folder printed (stdout)
    lines = output.splitlines()
    printed = masked("\n".join([next(s for s in reversed(lines) if s.startswith("completed: ")),
                                next(s for s in reversed(lines) if s.startswith("run folder: "))]))
    readme, started = _doc("README.md").read_text(), _doc("docs/getting-started.md").read_text()
    shown = {"README.md": re.search(r"```\n(completed: .*\nrun folder: .*)\n```", readme),
             "docs/getting-started.md": re.search(r"\(`(completed: [^`]*)`, then\s+`(run folder: [^`]*)`\)",
                                                  started)}
    for name, m in shown.items():
        assert m, f"{name} shows no last lines of the default run"
        assert masked("\n".join(m.groups()) if m.lastindex == 2 else m.group(1)) == printed, name


def test_every_signature_of_repro_api_the_docs_quote_is_its_own():
    """A signature the markdown quotes of a ``repro.api`` function (```name(a, b=1)```, every
    argument a name, a ``*name`` or ``name=default``) names its parameters in their order and
    their defaults: ``collection_time(taus, S)`` read as a keyword the function does not take."""
    import inspect

    import repro.api as api

    quoted = re.compile(r"`(\w+)\(([^`()]*)\)`")
    arg = re.compile(r"(\*{0,2})([A-Za-z_]\w*)(?:=(.+))?")
    problems, found = [], 0
    for name in (*DOCS, "exercises/README.md"):
        text = (ROOT / name).read_text() if (ROOT / name).is_file() else ""
        for m in quoted.finditer(text):
            func = getattr(api, m.group(1), None)
            args = [a.strip() for a in m.group(2).split(",") if a.strip()]
            if not callable(func) or not all(arg.fullmatch(a) for a in args):
                continue   # not the API's, or a call with values (an example), not a signature
            found += 1
            params = inspect.signature(func).parameters
            names = [arg.fullmatch(a).group(2) for a in args]
            where = f"{name}: `{m.group(1)}({m.group(2)})`"
            if any(n not in params for n in names):
                problems.append(f"{where}: the function takes ({', '.join(params)})")
            elif names != sorted(names, key=list(params).index):
                problems.append(f"{where}: its parameters are in the order ({', '.join(params)})")
            for a in args:
                _, n, default = arg.fullmatch(a).groups()
                if default is not None and default != repr(params[n].default):
                    problems.append(f"{where}: {n} defaults to {params[n].default!r}")
    assert found, "no signature of repro.api quoted in the markdown"
    assert not problems, "\n".join(problems)


def _anchors(path: Path) -> set[str]:
    """The heading anchors of a markdown file, as GitHub and the site's toc spell them."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower().replace("`", "")).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_relative_link_of_the_pages_outside_the_site_resolves():
    """README.md and exercises/README.md are read on a code host, not built by ``mkdocs build
    --strict`` (which checks the site's pages): each relative link names a file of the tree, and
    its ``#anchor`` a heading of that file."""
    problems = []
    for name in ("README.md", "exercises/README.md"):
        page = _doc(name)
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                problems.append(f"{name}: ({target}) names no file")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                problems.append(f"{name}: ({target}) names no heading of {path or name}")
    assert not problems, "\n".join(problems)


def test_every_speedup_table_quotes_its_csv():
    """A table that follows "(`figures/NAME_speedup.csv`):" (one row per nsync, one column per
    client count, cells "mean (min–max)" or "not reached ...") shows that CSV's numbers, rounded
    as written: a regenerated figure whose prose kept the old numbers fails here."""
    import pandas as pd

    cell = re.compile(r"([\d.]+) \(([\d.]+)–([\d.]+)\)")
    problems, tables = [], 0
    for name in DOCS:
        text = _doc(name).read_text()
        for m in re.finditer(r"\(`(figures/\w+_speedup\.csv)`\):\n\n((?:\|.*\n)+)", text):
            tables += 1
            csv = pd.read_csv(ROOT / m.group(1)).set_index(["nsync", "num_clients"])
            header, _, *rows = [[c.strip() for c in r.strip("|").split("|")] for r in m.group(2).splitlines()]
            clients = [int(c.split()[0]) for c in header[1:]]
            for row in rows:
                nsync = int(row[0].split()[0])
                for n, shown in zip(clients, row[1:]):
                    got = csv.loc[(nsync, n)]
                    where = f"{name}, {m.group(1)}, nsync {nsync}, {n} clients: `{shown}`"
                    if shown.startswith("not reached"):
                        if got.n != 0:
                            problems.append(f"{where}: {int(got.n)} runs reached it")
                        continue
                    quoted = cell.match(shown)
                    if not quoted:
                        problems.append(f"{where}: not 'mean (min–max)'")
                        continue
                    values = (got.speedup_mean, got.speedup_min, got.speedup_max)
                    for text_value, value in zip(quoted.groups(), values):
                        decimals = len(text_value.partition(".")[2])
                        if f"{value:.{decimals}f}" != text_value:
                            problems.append(f"{where}: the CSV says {value:.{decimals}f}")
    assert tables, "no speedup table found in the markdown"
    assert not problems, "\n".join(problems)


def test_every_dotted_name_of_the_package_the_docs_quote_exists():
    """``repro.sim.ceiling.ceiling``, ``repro_bench.instruments.hosts.TwoHosts``, ...: each name of
    the package or its benchmarks that the markdown quotes is a module, or an attribute of one."""
    import importlib

    def resolves(name: str) -> bool:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):   # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            return functools.reduce(lambda o, a: getattr(o, a, None), parts[i:], obj) is not None
        return False

    quoted = {}
    for name in (*DOCS, "exercises/README.md"):
        for m in re.findall(r"\b(repro(?:_bench)?(?:\.\w+)+)", _doc(name).read_text()):
            quoted.setdefault(m, name)
    assert quoted, "no dotted name of the package quoted in the markdown"
    missing = [f"{where}: {name}" for name, where in sorted(quoted.items()) if not resolves(name)]
    assert not missing, "names that exist nowhere:\n" + "\n".join(missing)


def test_every_configuration_key_the_docs_quote_is_one_python_m_repro_run_takes():
    """``backend.client_timeout_s``, ``cost.shared.devices_per_host``, ...: each ``GROUP.KEY`` the
    markdown names is a key ``--help`` lists (or a nested group of them, or an old spelling of
    repro/config/renames.py's table), so a renamed or removed key leaves no prose behind."""
    from repro.config.loader import key_docs
    from repro.config.renames import RENAMED

    keys = set(key_docs())
    known = keys | set(RENAMED) | {k.rsplit(".", i)[0] for k in keys for i in range(1, k.count("."))}
    example = {"protocol.patience"}   # docs/configuration.md's example of adding a setting
    quoted = {}
    for name in (*DOCS, "exercises/README.md"):
        for key in re.findall(r"(?<![\w/.])((?:backend|cost|algo|protocol|data|model)(?:\.[A-Za-z_]+)+)",
                              _doc(name).read_text()):
            if not key.endswith((".py", ".yaml", ".md", ".csv", ".json")):
                quoted.setdefault(key, name)
    assert quoted, "no configuration key quoted in the markdown"
    unknown = [f"{where}: {key}" for key, where in sorted(quoted.items()) if key not in known | example]
    assert not unknown, "keys python -m repro.run does not take:\n" + "\n".join(unknown)


def test_every_group_option_the_docs_quote_exists():
    """``cost=paper2013_shared``, ``+mitigation=rennala_s8``, ...: prose names options too, not
    only commands (which the compose check reads); each is a file of its group in conf/."""
    from repro.config import loader

    options = {g: set(loader.group_options(g)) for g in (*loader.GROUPS, *loader.OPTIONAL_GROUPS)}
    choice = re.compile(r"(?<![\w.-])\+?(" + "|".join(options) + r")=([a-z0-9_][\w.-]*?)(\.png)?(?=[^\w.(-]|\.?$)",
                        re.M)
    unknown = []
    for name in (*DOCS, "exercises/README.md"):
        for group, option, png in choice.findall(_doc(name).read_text()):
            if not png and option not in options[group]:
                unknown.append(f"{name}: {group}={option} (options: {', '.join(sorted(options[group]))})")
    assert not unknown, "\n".join(unknown)


def test_every_test_the_docs_name_exists():
    """docs/failures.md and others name the test that keeps each guarantee
    (``test_real.py::test_sigkilled_client_degrades_the_run``): the file, and the test in it."""
    named, problems = 0, []
    for name in (*DOCS, "exercises/README.md"):
        for file, test in re.findall(r"\b(test_\w+\.py)(?:::(\w+))?", _doc(name).read_text()):
            named += 1
            path = ROOT / "tests" / file
            if not path.is_file():
                problems.append(f"{name}: tests/{file} does not exist")
            elif test and not re.search(rf"^\s*(?:async )?def {test}\(", path.read_text(), re.M):
                problems.append(f"{name}: {file} has no {test}")
    assert named, "no test named in the markdown"
    assert not problems, "\n".join(problems)
