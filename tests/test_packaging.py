"""The package as a user gets it from a wheel, not from this checkout.

``pyproject.toml`` installs the top-level ``conf/`` as the package data folder ``repro/conf``
and :mod:`repro.config.loader` finds it there. These tests build a wheel of the working tree and
check that it carries every YAML file (quick), then install it into a fresh virtual environment
and train the smoke run from a folder that is not the checkout (slow).

The wheel is built from a temporary copy of the working tree (tracked and untracked-but-not-
ignored files): setuptools leaves ``build/`` and ``*.egg-info`` in the folder it builds, and a
test must not write into the checkout. The fresh environment borrows this environment's
dependencies through a ``.pth`` line naming its site-packages (no download, torch included);
a ``.pth`` in an added folder is not processed, so this checkout's editable-install finder is
not active there and ``repro`` can only come from the wheel (asserted).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT, tree_files

# What is never part of a build: caches, environments, outputs, earlier build leftovers.
SKIP_PARTS = {".git", ".venv", "__pycache__", "build", "dist", "results", "figures", "outputs",
              "multirun", ".pytest_cache"}


def _pip_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    tmpdir = tmp / "pip-tmp"
    tmpdir.mkdir(exist_ok=True)
    env.update(TMPDIR=str(tmpdir), PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_CACHE_DIR="1", MPLBACKEND="Agg")
    return env


def _build_files() -> list[Path]:
    """The working tree's files as a build sees them: git's tracked and untracked-not-ignored
    files (so a module another change just added is in the wheel); without git, every file but
    :data:`SKIP_PARTS`."""
    return [Path(n) for n in tree_files()
            if not SKIP_PARTS & set(Path(n).parts) and not n.endswith((".pyc", ".egg-info"))
            and not any(part.endswith(".egg-info") for part in Path(n).parts)
            and (ROOT / n).is_file()]      # tracked but deleted in the working tree: not there


def _build_leftovers() -> set[str]:
    """Names in the checkout a build may leave (``build/``, ``*.egg-info``, ``dist/``)."""
    return {p.name for p in ROOT.iterdir()
            if p.name in ("build", "dist") or p.name.endswith(".egg-info")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of the working tree, built from a copy of it (the checkout is left as it was)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for rel in _build_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    before = _build_leftovers()
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", "-q", "-w", str(tmp / "dist"), str(src)],
                          cwd=tmp, env=_pip_env(tmp), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _build_leftovers() == before, "the build wrote into the checkout"
    wheels = list((tmp / "dist").glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_carries_every_config_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"repro/conf/config.yaml", "repro/conf/exp/fig3.yaml", "repro/config/loader.py",
            "repro/run.py"} <= names
    yamls = sorted(p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*.yaml"))
    assert yamls, "no conf/**/*.yaml in the checkout"
    missing = [y for y in yamls if f"repro/conf/{y}" not in names]
    assert not missing, f"conf files not in the wheel: {missing}"
    # repro_bench (the benchmarks and instruments, beside the library) ships too: python -m
    # repro.bench runs its command line
    sources = sorted(p.relative_to(ROOT).as_posix() for package in ("repro", "repro_bench")
                     for p in (ROOT / package).rglob("*.py"))
    shim_and_tools = {"repro/bench/__main__.py", "repro_bench/__main__.py", "repro_bench/instruments/cli.py"}
    assert shim_and_tools <= set(sources)
    assert not [s for s in sources if s not in names], "package modules not in the wheel"


def test_wheel_carries_the_explorers_page(wheel):
    """python -m repro.lab explore serves repro/lab/explore.html: package data, not a module."""
    assert "repro/lab/explore.html" in set(zipfile.ZipFile(wheel).namelist())


def _fresh_venv(tmp: Path, wheel: Path) -> tuple[Path, Path]:
    """(python, site-packages) of a new venv holding the wheel, borrowing our dependencies."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(subprocess.run([str(python), "-c", where], capture_output=True, text=True,
                                  check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    assert purelib.resolve() != ours.resolve()
    # Appended after the venv's own site-packages, so the wheel's repro comes first; the .pth
    # files inside `ours` (the editable install's finder among them) are not processed.
    (purelib / "_borrowed_dependencies.pth").write_text(f"{ours}\n")
    # pip itself is borrowed too; --ignore-installed: the editable install it can see through
    # the .pth is neither "already satisfied" nor uninstalled.
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index",
                           "--ignore-installed", "-q", str(wheel)],
                          cwd=tmp, env=_pip_env(tmp), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python, purelib


@pytest.mark.slow
def test_the_wheel_runs_from_anywhere(wheel, tmp_path):
    python, purelib = _fresh_venv(tmp_path, wheel)
    assert (purelib / "repro" / "conf" / "config.yaml").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _pip_env(tmp_path)

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(python), *args], cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=timeout)

    probe = run("-c", "import json, sys, repro, repro.config.loader as r; "
                      "print(json.dumps({'file': repro.__file__, 'conf': str(r.CONF_DIR), "
                      "'path': sys.path, 'finders': [repr(f) for f in sys.meta_path]}))")
    assert probe.returncode == 0, probe.stderr
    where = json.loads(probe.stdout)
    site = purelib.resolve()
    assert Path(where["file"]).resolve().is_relative_to(site), where["file"]
    assert Path(where["conf"]).resolve() == site / "repro" / "conf", where["conf"]
    assert str(ROOT) not in where["path"], "the checkout is on the new venv's sys.path"
    assert not [f for f in where["finders"] if "editable" in f.lower()], where["finders"]

    usage = run("-m", "repro.run", "--help")
    assert usage.returncode == 0, usage.stderr
    from repro.config.loader import GROUPS
    for group in (*GROUPS, "+exp"):
        assert f"\n  {group} " in usage.stdout, (group, usage.stdout[:2000])
    assert "smoke" in usage.stdout and "fig3" in usage.stdout

    results = tmp_path / "results"
    proc = run("-m", "repro.run", "+exp=smoke", f"results_dir={results}", "progress=false",
               timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summaries = list(results.glob("smoke/*/summary.json"))
    assert len(summaries) == 1, list(results.rglob("*"))
    assert json.loads(summaries[0].read_text())["status"] == "completed"
    assert sorted(p.name for p in elsewhere.iterdir()) == [], "the run wrote into its cwd"
