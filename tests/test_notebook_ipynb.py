"""The lab as a real Jupyter notebook (issue 19, part 5): notebooks/staleness_lab.ipynb holds
exactly the cells of its percent-format twin notebooks/staleness_lab.py, committed run top to
bottom with its outputs; its first code cell installs the package only when it is missing; and
it runs top to bottom in a kernel on shrunk settings (nbclient and ipykernel, the test extra).

The builder (notebooks/build_notebook.py) is loaded from its file: it is a script of the
notebooks folder, not a module of the package."""
import importlib.util
import json
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT

NOTEBOOKS = ROOT / "notebooks"


def builder():
    spec = importlib.util.spec_from_file_location("build_notebook", NOTEBOOKS / "build_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_notebook_holds_the_scripts_cells_run_with_their_outputs():
    assert builder().drift() == []
    nb = json.loads((NOTEBOOKS / "staleness_lab.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    printed = "".join("".join(o.get("text", "")) for c in code for o in c["outputs"])
    assert "the lab's claims all held\n" in printed and "FAIL" not in printed   # the full lab, not the quick one
    assert sum("image/png" in o.get("data", {}) for c in code for o in c["outputs"]) >= 2


def test_the_drift_check_sees_an_edited_script_a_missing_cell_and_missing_outputs(tmp_path):
    b = builder()
    script, notebook = tmp_path / "lab.py", tmp_path / "lab.ipynb"
    text = (NOTEBOOKS / "staleness_lab.py").read_text()
    nb = json.loads((NOTEBOOKS / "staleness_lab.ipynb").read_text())
    notebook.write_text(json.dumps(nb))
    script.write_text(text.replace("## 2. Why staleness hurts", "## 2. Why staleness really hurts"))
    assert any("differs" in p for p in b.drift(script, notebook))
    script.write_text(text + "\n# %% [markdown]\n# ## 6. A new step\n\n# %%\nprint('six')\n")
    assert any("cells" in p for p in b.drift(script, notebook))
    script.write_text(text)
    for cell in nb["cells"]:
        cell.pop("execution_count", None) if cell["cell_type"] == "code" else None
    notebook.write_text(json.dumps(nb))
    assert any("top to bottom" in p for p in b.drift(script, notebook))


def test_building_without_the_notebook_extra_says_which_to_install(monkeypatch):
    """After ``pip install -e .`` (no extra) the build ended in ModuleNotFoundError's traceback."""
    monkeypatch.setitem(sys.modules, "nbformat", None)   # as if not installed: its import fails
    with pytest.raises(SystemExit) as exited:
        builder().main([])
    assert exited.value.code == ("error: building the notebook needs nbformat (pip install -e '.[notebook]'); "
                                 "--check needs none")


def test_percent_cells_parse_as_jupytext_reads_them():
    cells = builder().cells("# %% [markdown]\n# # Title\n#\n# text\n\n# %%\nx = 1\n\n\n# %%\n# a comment\ny = 2\n")
    assert cells == [("markdown", "# Title\n\ntext"), ("code", "x = 1"), ("code", "# a comment\ny = 2")]


def install_cell() -> str:
    kind, source = builder().cells((NOTEBOOKS / "staleness_lab.py").read_text())[1]
    assert kind == "code" and "pip" in source
    return source


def test_the_install_cell_does_nothing_when_the_package_is_there(monkeypatch):
    """Offline-safe: in a kernel that imports repro (the tests', a set-up Jupyter) nothing runs."""
    def no_pip(*a, **k):
        raise AssertionError(f"pip was called: {a}")
    monkeypatch.setattr(subprocess, "check_call", no_pip)
    exec(install_cell(), {})


def test_the_install_cell_installs_the_checkout_around_the_notebook(monkeypatch, tmp_path):
    """A fresh kernel (repro not importable) started in a checkout's notebooks folder, or beside a
    clone (Colab's /content), pip-installs that checkout into the kernel's own Python."""
    checkout = tmp_path / "gpu-asgd-repro"
    (checkout / "repro").mkdir(parents=True)
    (checkout / "notebooks").mkdir()
    (checkout / "pyproject.toml").write_text("")
    calls = []
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "repro" else real_find_spec(name, *a))
    monkeypatch.setattr(subprocess, "check_call", lambda cmd: calls.append(cmd))
    monkeypatch.delenv("REPRO_SOURCE", raising=False)
    for cwd in (checkout / "notebooks", tmp_path):
        monkeypatch.chdir(cwd)
        exec(install_cell(), {})
    assert calls == [[sys.executable, "-m", "pip", "install", "--quiet", str(checkout)]] * 2
    monkeypatch.setenv("REPRO_SOURCE", "git+https://example.invalid/gpu-asgd-repro")
    exec(install_cell(), {})
    assert calls[-1][-1] == "git+https://example.invalid/gpu-asgd-repro"


def test_the_lab_starts_without_its_set_up_cell():
    """The set-up cell says it does nothing where the package is installed: a student who skips
    it ran the next cell into "NameError: name 'os' is not defined" (it used the set-up's imports)."""
    code = [source for kind, source in builder().cells((NOTEBOOKS / "staleness_lab.py").read_text()) if kind == "code"]
    assert "pip" in code[0]
    run = subprocess.run([sys.executable, "-c", code[1]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr


def test_the_notebook_runs_top_to_bottom_in_a_kernel_shrunk(monkeypatch, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("REPRO_LAB_QUICK", "1")   # the kernel inherits it: the shrunk budgets
    nb = nbformat.read(str(NOTEBOOKS / "staleness_lab.ipynb"), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()   # raises on a failed cell
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "the lab's claims all held (quick mode)" in printed and "FAIL" not in printed
    assert printed.count("  ok    ") >= 14
    assert not list(tmp_path.iterdir())   # a notebook shows its figures, writes none
