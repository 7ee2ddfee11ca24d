"""The lab's percent-format script (notebooks/staleness_lab.py) runs, shrunk, as a plain script,
and every claim it checks holds."""
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT

SCRIPT = ROOT / "notebooks" / "staleness_lab.py"


def test_the_lab_script_is_a_percent_format_notebook():
    text = SCRIPT.read_text()
    assert text.startswith("# %% [markdown]") and text.count("\n# %%") >= 10


# slow: tests/test_notebook_ipynb.py runs the same cells (the drift check holds them equal) in a
# kernel with the same quick-mode claims in the default suite; this runs them as a plain script
@pytest.mark.slow
def test_the_lab_script_runs_shrunk_and_its_claims_hold(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "REPRO_LAB_QUICK": "1", "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "FAIL" not in proc.stdout and "the lab's claims all held (quick mode)" in proc.stdout
    assert proc.stdout.count("  ok    ") >= 14
    assert not list(tmp_path.iterdir())        # the quick mode writes nothing beside it


def test_the_lab_imports_only_the_public_api():
    """Issue 35: the lesson lives on repro.api alone; an import anywhere in the script (a cell, a
    function) of any other repro module is a dependency on the package's internals."""
    import ast

    imported = set()
    for node in ast.walk(ast.parse(SCRIPT.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported |= {f"{node.module}.{alias.name}" if node.module == "repro" else node.module
                         for alias in node.names}
    assert {m for m in imported if m == "repro" or m.startswith("repro.")} == {"repro.api"}
