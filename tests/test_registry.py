"""One registry idiom (issue 31, item 5): every kind of name users type is declared once in
:data:`repro.registry.DECLARED` with the modules that register it; a module registers with the
registry's decorator, never by being imported for its side effect; a lookup imports the module
declared for the name."""
import subprocess
import sys

import pytest

from repro import registry
from repro.errors import ConfigError
from repro.registry import Registry

from tests.helpers.paths import ROOT

# Each line prints what the process had imported after the statement before it.
LAZY = """
import sys
def loaded(*modules): return [m for m in modules if m in sys.modules]
import repro.asgd
print('asgd', loaded('torch', 'repro.asgd.optimal'))
from repro.asgd.protocols import PROTOCOLS
print('protocols', loaded('repro.asgd.optimal'), 'ringmaster' in PROTOCOLS)
print('lookup', PROTOCOLS['ringmaster'].__name__, loaded('repro.asgd.optimal'))
from repro.lab import grader
print('catalogue', len(grader.EXERCISES.names()), loaded('repro.lab.numeric', 'repro.lab.plugins'))
print('exercise', grader.EXERCISES['ssp_gate'].name, loaded('repro.lab.plugins', 'repro.lab.numeric'))
from repro.analysis.render import FIGURES
print('figures', len(tuple(FIGURES)), loaded('repro.analysis.lab.churn'))
print('figure', FIGURES['churn'].exps, loaded('repro.analysis.lab.churn', 'repro.analysis.lab.sync'))
"""


def test_a_lookup_imports_the_declared_module_and_nothing_registers_by_side_effect():
    out = subprocess.run([sys.executable, "-c", LAZY], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=True).stdout.splitlines()
    assert out == ["asgd []",                      # the package imports no protocol module
                   "protocols [] True",            # ringmaster is known before its module loads
                   "lookup Ringmaster ['repro.asgd.optimal']",
                   "catalogue 7 []",
                   "exercise ssp_gate ['repro.lab.plugins']",
                   "figures 16 []",
                   "figure ('churn',) ['repro.analysis.lab.churn']"]


@pytest.fixture
def declared(monkeypatch):
    """A registry declared for this test only: module ``home`` registers ``a`` and ``b``."""
    monkeypatch.setitem(registry.DECLARED, "test.name", {"home": ("a", "b"), "other": ("c",)})
    monkeypatch.setattr(registry, "_BUILT", {})
    return Registry("test.name")


def test_a_module_registers_only_what_it_declares(declared):
    declared.add("a", 1, module="home")
    with pytest.raises(ValueError, match="home registers 'x', which repro.registry.DECLARED does not list"):
        declared.add("x", 2, module="home")
    with pytest.raises(ValueError, match="elsewhere registers 'b'"):
        declared.add("b", 2, module="elsewhere")    # a declared name from another module
    with pytest.raises(ValueError, match="other registers 'b'"):
        declared.add("b", 2, module="other")
    declared.add("mine", 3, module="users_own")     # a user's own name: from anywhere
    assert declared.names() == ("a", "b", "c", "mine") == registry.names_of("test.name")()
    assert list(declared) == ["a", "b", "c", "mine"]


def test_a_notebook_cell_run_twice_registers_its_class_again_and_only_its_own(declared):
    # a cell defining @RULES.register("mine") class Mine, run again after a fix: "registered
    # twice", and the old class stayed the one that ran, until the kernel was restarted
    cell = 'class Mine:\n    pass\nregistry.register("mine")(Mine)\n'
    for _ in range(2):
        exec(cell, run := {"__name__": "__main__", "registry": declared})
    assert declared["mine"] is run["Mine"]
    with pytest.raises(ValueError, match="'mine' is registered twice"):
        exec(cell, {"__name__": "elsewhere", "registry": declared})   # another module's: refused
    declared.add("a", 1, module="home")
    with pytest.raises(ValueError, match="'a' is registered twice"):
        declared.add("a", 2, module="home")   # a declared name is registered once


def test_an_unknown_name_is_a_config_error_naming_the_key_and_the_declared_names(declared):
    with pytest.raises(ConfigError, match=r"invalid value for 'test.name': 'z'; expected one of: 'a', 'b', 'c'"):
        declared["z"]
    with pytest.raises(ConfigError):
        declared[["a"]]   # not a name at all


def test_a_declared_name_its_module_does_not_register_says_so(declared, monkeypatch):
    monkeypatch.setitem(registry.DECLARED, "test.name", {"tests.helpers.paths": ("a",)})
    monkeypatch.setattr(declared, "_homes", registry.declared("test.name"))
    with pytest.raises(LookupError, match="tests.helpers.paths is declared to register 'a'"):
        declared["a"]


def test_the_names_are_declared_before_the_registry_is_built(monkeypatch):
    monkeypatch.setitem(registry.DECLARED, "test.name", {"home": ("b", "a")})
    monkeypatch.setattr(registry, "_BUILT", {})
    assert registry.names_of("test.name")() == ("a", "b")


def test_every_figure_reads_experiments_that_conf_exp_declares():
    """Experiments are declared once, as Hydra's ``exp`` group (one conf/exp/NAME.yaml each);
    the figure registry names them by those names only."""
    from repro.analysis.render import FIGURES

    experiments = {p.stem for p in (ROOT / "conf" / "exp").glob("*.yaml")}
    for name, figure in FIGURES.items():
        assert set(figure.exps) <= experiments, (name, figure.exps)
