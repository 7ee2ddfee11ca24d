"""MkDocs hooks of the documentation site (mkdocs.yml ``hooks:``): what the site adds to docs/.

* The top-level REPRODUCE.md and TEACHING.md become pages, and figures/*.png images, without a
  copy in docs/: the files stay where the package's layout promises them, and the committed
  figures are the ones shown.
* Links are written to work where the markdown is read on its own (GitHub, an editor): a page in
  docs/ links ``../REPRODUCE.md`` and ``../figures/x.png``, a top-level page ``docs/x.md``. On the
  site every one of them lies at the site's root, so the prefixes go.
* ``<!-- generated: configuration -->`` becomes the configuration reference, generated from the
  field declarations that ``python -m repro.run --help`` prints (:mod:`repro.config.loader`), so it
  is never kept by hand.
* ``<!-- csv: PATH -->`` becomes a table of the dated CSV file PATH (relative to docs/): measured
  numbers live in data files, not in prose.
* :class:`Inspected` (a griffe extension, mkdocs.yml): the API page's objects are read from the
  source, but those whose documentation is made at import.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

import griffe
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
TOP_PAGES = ("REPRODUCE.md", "TEACHING.md")
_CSV = re.compile(r"<!--\s*csv:\s*(\S+)\s*-->")
_GENERATED = "<!-- generated: configuration -->"


def on_files(files, config):
    """Add the top-level pages and the committed figures to the site, where they are."""
    names = list(TOP_PAGES) + [str(p.relative_to(ROOT)) for p in sorted((ROOT / "figures").glob("*.png"))]
    for name in names:
        files.append(File(name, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    """Links as the site lays the files out; the generated parts."""
    if page.file.src_uri in TOP_PAGES:
        markdown = markdown.replace("](docs/", "](").replace("](README.md", "](index.md")
    else:
        markdown = markdown.replace("](../", "](")
    if _GENERATED in markdown:
        markdown = markdown.replace(_GENERATED, configuration_reference())
    return _CSV.sub(lambda m: csv_table(Path(config["docs_dir"]) / m.group(1)), markdown)


def csv_table(path: Path) -> str:
    """A markdown table of the CSV file ``path`` (its header row is the table's)."""
    with open(path, newline="") as f:
        rows = [[cell.replace("|", "\\|") for cell in row] for row in csv.reader(f) if row]
    head, body = rows[0], rows[1:]
    code = [i for i, name in enumerate(head) if name == "command"]   # commands read as code
    body = [[f"`{c}`" if i in code else c for i, c in enumerate(r)] for r in body]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body]) + "\n"


def configuration_reference() -> str:
    """Every group's options and every key's default, valid values and meaning, read from the
    declarations ``--help`` prints (:func:`repro.config.loader.help_text` reads the same)."""
    from omegaconf import OmegaConf

    from repro.config import loader as h
    from repro.config import settings

    dcfg = h.compose([], return_hydra_config=True)   # as python -m repro.run --help composes it
    choices = {g: str(dcfg.hydra.runtime.choices.get(g)) for g in h.GROUPS}
    tree = OmegaConf.to_container(dcfg, resolve=False)
    lines = ["### Groups", "", "| group | options (default in bold) |", "|---|---|"]
    for group in (*h.GROUPS, *h.OPTIONAL_GROUPS):
        opts = [f"**`{o}`**" if choices.get(group) == o else f"`{o}`" for o in h.group_options(group)]
        name = "+" + group if group in h.OPTIONAL_GROUPS else group
        lines.append(f"| `{name}` | {', '.join(opts)} |")
    lines += ["", "### Keys", "", "| key | default | valid | meaning |", "|---|---|---|---|"]
    for key, meaning in h.key_docs().items():
        default = h._show(settings.get(tree, key, "(not set)"))
        cells = [f"`{key}`", f"`{default}`", settings.valid_values(key), meaning]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


class Inspected(griffe.Extension):
    """The ``objects`` named in mkdocs.yml are read by importing their module, the rest of the
    package from its source. simulate()'s defaults are the command line's (``DEFAULTS``) and its
    docstring lists the registries' names, both made at import. Inspecting the whole package for
    it (force_inspection) imported every module of repro on each build, and showed every object
    as inspection sees it (Result's dataclass internals, with memory addresses)."""

    def __init__(self, objects: list[str]) -> None:
        self.objects = objects

    def on_package(self, *, pkg, loader, **kwargs) -> None:
        for path in self.objects:
            module, _, name = path.rpartition(".")
            if module.split(".")[0] == pkg.path:
                inspected = griffe.inspect(module, import_paths=loader.finder.search_paths,
                                           docstring_parser=loader.docstring_parser,
                                           docstring_options=loader.docstring_options)
                loader.modules_collection[module].set_member(name, inspected[name])
                inspected[name].parent = inspected   # its docstring's types read as inspection reads them
