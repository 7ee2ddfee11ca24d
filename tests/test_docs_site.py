"""The documentation as a newcomer meets it (issue 33): a README that is a landing page, a site
under docs/ that builds strictly with every page in its navigation, Python examples that run as
pasted, and a CI script that leaves the checkout's environment alone.

The commands of every page are tested by tests/test_docs.py; this file checks the rest.
"""
from __future__ import annotations

import importlib.util
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

DOCS_EXTRA = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", path.read_text(), re.M | re.S)


def _nav_pages() -> set[str]:
    return set(re.findall(r":\s*([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))


def test_the_readme_is_a_landing_page_with_a_committed_figure():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the reference belongs in docs/"
    figures = re.findall(r"!\[[^\]]*\]\((figures/[\w.-]+\.png)\)", "\n".join(lines))
    assert figures and all((ROOT / f).is_file() for f in figures), figures
    for heading in ("## Set-up", "## Quick start", "## Where a run's files go", "## Layout",
                    "## Documentation"):
        assert heading in lines, heading


def test_every_page_is_in_the_navigation_and_every_nav_entry_exists():
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    nav = _nav_pages()
    added = {"REPRODUCE.md", "TEACHING.md"}          # joined from the top level by docs/hooks.py
    assert pages - nav == set(), "pages no navigation reaches"
    assert nav - pages - added == set(), "navigation entries without a page"


def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, a page outside the navigation, a
    docstring mkdocstrings cannot render, or a failing generator fails the build."""
    missing = [m for m in DOCS_EXTRA if importlib.util.find_spec(m.split(".")[0]) is None
               or importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)} missing): "
                    "pip install -e '.[docs]'")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-d", str(tmp_path / "site")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    config = (tmp_path / "site" / "configuration" / "index.html").read_text()
    assert "num_clients" in config and "an integer in 1..1024" in config   # generated, not hand-kept
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "simulate" in api
    # simulate() as imported (docs/hooks.py, Inspected): its defaults' values and the registries'
    # names, not the source's DEFAULTS.num_clients and {SERVER_RULES}; Result as written
    assert "DEFAULTS" not in api and "SERVER_RULES" not in api and "outer_nesterov" in api
    assert "__dataclass_fields__" not in api


def test_the_configuration_reference_is_generated_from_the_declarations():
    """Every key ``--help`` lists is in the reference, with the valid values ``--help`` prints."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
        import hooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    from repro.config import loader
    from repro.config import settings

    reference = hooks.configuration_reference()
    for key in loader.key_docs():
        row = next((r for r in reference.splitlines() if r.startswith(f"| `{key}` |")), None)
        assert row, key
        assert settings.valid_values(key).replace("|", "\\|") in row, key
    assert "`+exp` |" in reference and "**`digits`**" in reference


def test_the_python_api_examples_run_as_pasted(tmp_path):
    """README's quick-start example is self-contained, trains (its last test error is low and
    below its first), and is the first example of docs/api.md, whose blocks run after it."""
    readme, = [b for b in _python_blocks(ROOT / "README.md") if "repro.api" in b]
    api = _python_blocks(ROOT / "docs" / "api.md")
    assert api[0] == readme, "docs/api.md's first example is not the README's"
    script = tmp_path / "example.py"
    script.write_text("\n".join(api) + textwrap.dedent("""
        first, last = result.evals.test_error.iloc[0], result.evals.test_error.iloc[-1]
        print("CHECK", result.summary["status"], first, last)
        """))
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    status, first, last = done.stdout.split("CHECK", 1)[1].split()
    assert status == "completed" and float(last) < 0.1 and float(last) < float(first), done.stdout


def test_ci_keeps_the_checkouts_environment(tmp_path):
    """``.ci/run`` builds its environment in a folder of its own: run in a checkout whose .venv
    a contributor uses, it leaves that .venv as it was, and installs as the README's first
    command does (``pip install -e ".[test]"``) before the docs extra."""
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    (checkout / ".ci" / "run").write_text((ROOT / ".ci" / "run").read_text())
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "mine").write_text("a contributor's environment")
    log = tmp_path / "calls.log"
    fake = tmp_path / "bin"
    fake.mkdir()
    # python3 -m venv DIR makes DIR/bin/{pip,python}, each of which logs its arguments
    (fake / "python3").write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        echo "python3 $*" >> {log}
        mkdir -p "$3/bin"
        for tool in pip python; do
          printf '#!/usr/bin/env bash\\necho "%s $*" >> {log}\\n' "$tool" > "$3/bin/$tool"
          chmod +x "$3/bin/$tool"
        done
        """))
    (fake / "python3").chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CI_VENV", None)
    done = subprocess.run(["bash", str(checkout / ".ci" / "run")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (checkout / ".venv" / "mine").is_file(), ".ci/run deleted the checkout's .venv"
    calls = log.read_text().splitlines()
    assert calls[0].startswith("python3 -m venv ") and not calls[0].endswith(" .venv"), calls
    installs = [c for c in calls if c.startswith("pip install")]
    assert installs[0] == 'pip install -q -e .[test]' and installs[1] == 'pip install -q -e .[docs]'
    assert calls[-1] == "python -m pytest", calls
