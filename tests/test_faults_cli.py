"""The command line under attack (wave 7): a Ctrl-C while its imports load, a grid with one bad
point, a sweep without --multirun. Each ends with one line and the exit code the guide gives."""
from __future__ import annotations

import subprocess
import sys

from tests.helpers.paths import ROOT

CTRL_C_WHILE_IMPORTING = """
import builtins, os, runpy, signal, sys
real_import = builtins.__import__
def ctrl_c_on_hydra(name, *args, **kwargs):   # the first heavy import of repro.run
    if name == "hydra":
        builtins.__import__ = real_import
        os.kill(os.getpid(), signal.SIGINT)
    return real_import(name, *args, **kwargs)
builtins.__import__ = ctrl_c_on_hydra
sys.argv = ["repro.run", "--help"]
runpy.run_module("repro.run", run_name="__main__", alter_sys=True)
"""


def test_a_ctrl_c_while_the_command_line_imports_exits_130_without_a_traceback():
    """Ctrl-C in the first half second (Hydra, OmegaConf loading) printed importlib's traceback
    and died by the signal: no handler was installed before the imports."""
    proc = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_IMPORTING], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (130, ""), (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
