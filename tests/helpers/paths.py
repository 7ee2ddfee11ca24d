"""Where things are: the one ``ROOT`` of the suite, and the working tree's files."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # tests/helpers/paths.py -> the repository root


def tree_files() -> list[str]:
    """The working tree's files as git sees them (tracked, and untracked but not ignored: a file
    another change just added counts), relative to ROOT; without git, every file outside the
    folders git would ignore anyway. Some names may be deleted files: callers check."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
        return [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "__pycache__", "results", "build"}
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
