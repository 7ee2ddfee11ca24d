"""Build the lab's Jupyter notebook from its percent-format twin, and say whether they agree.

``notebooks/staleness_lab.py`` is the source: a plain Python script whose ``# %%`` lines start
code cells and ``# %% [markdown]`` lines markdown cells (their lines commented with ``# ``), the
percent format that jupytext, VS Code and Spyder read. This script turns it into
``notebooks/staleness_lab.ipynb``, runs every cell top to bottom in a fresh kernel (nbclient,
ipykernel: the ``notebook`` extra, part of ``test``) and writes the notebook with its outputs, so
that it reads on a code host without running:

    python notebooks/build_notebook.py            # rebuild and run (the full lab, about a minute)
    python notebooks/build_notebook.py --check    # exit 1 when the two differ (no kernel needed)

To add a step to the lesson, add its cells to the script (a markdown cell, then a code cell
whose ``check(...)`` lines state the claim), run it as a script (``REPRO_LAB_QUICK=1`` first),
then rebuild the notebook and commit both files. ``tests/test_notebook_ipynb.py`` fails when the
notebook's cells are not the script's, or when it was committed without its outputs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT, NOTEBOOK = HERE / "staleness_lab.py", HERE / "staleness_lab.ipynb"
KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def cells(text: str) -> list[tuple[str, str]]:
    """(cell type, source) of each cell of a percent-format script; a markdown cell's lines
    lose their ``# `` (``#`` alone is an empty line); blank lines around a cell are dropped."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("# %%"):
            out.append(("markdown" if "[markdown]" in line else "code", []))
        elif out:
            out[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"{SCRIPT.name}: text before the first '# %%' line: {line!r}")
    return [(kind, _source(kind, lines)) for kind, lines in out]


def _source(kind: str, lines: list[str]) -> str:
    if kind == "markdown":
        lines = [line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines]
    return "\n".join(lines).strip("\n")


def notebook_cells(notebook: dict) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"])) for c in notebook["cells"]]


def drift(script: Path = SCRIPT, notebook: Path = NOTEBOOK) -> list[str]:
    """What differs between the script and the committed notebook (empty: they agree): their
    cells, in order; every code cell run, top to bottom (execution counts 1, 2, ...), none failed."""
    if not notebook.is_file():
        return [f"{notebook} is missing: run python {Path(__file__).name}"]
    nb = json.loads(notebook.read_text())
    want, got = cells(script.read_text()), notebook_cells(nb)
    problems = [f"cell {i + 1}: the notebook's differs from the script's" for i, (a, b) in enumerate(zip(want, got))
                if a != b]
    if len(want) != len(got):
        problems.append(f"the script has {len(want)} cells, the notebook {len(got)}")
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    if [c.get("execution_count") for c in code] != list(range(1, len(code) + 1)):
        problems.append("the notebook was not run top to bottom before it was committed (execution counts)")
    if any(o.get("output_type") == "error" for c in code for o in c.get("outputs", [])):
        problems.append("a cell of the committed notebook failed")
    return problems


def build(timeout_s: int = 900) -> dict:
    """The notebook of the script's cells, run in a fresh kernel (the full lab)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": KERNEL, "language_info": {"name": "python"}})
    make = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell}
    nb.cells = [make[kind](source) for kind, source in cells(SCRIPT.read_text())]
    for cell in nb.cells:
        cell.pop("id", None)   # random ids would make every rebuild a diff
    nb.nbformat_minor = 4
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(HERE)}}).execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = _coalesced(cell.outputs)
    return nb


def _coalesced(outputs: list) -> list:
    """Consecutive prints to one stream as one output, as a notebook front end shows them."""
    out: list = []
    for o in outputs:
        if out and o.output_type == "stream" and out[-1].output_type == "stream" and out[-1].name == o.name:
            out[-1].text += o.text
        else:
            out.append(o)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the two agree (exit 1: not)")
    args = parser.parse_args(argv)
    if not args.check:
        try:   # the notebook extra (the test extra has it): without it, which to install, not a traceback
            import ipykernel, nbclient, nbformat  # noqa: F401
        except ImportError as err:
            sys.exit(f"error: building the notebook needs {err.name} (pip install -e '.[notebook]'); "
                     "--check needs none")
        nbformat.write(build(), str(NOTEBOOK))
        print(f"wrote {NOTEBOOK}")
    problems = drift()
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
