"""What a newcomer meets on a fresh clone (issue 33): each mismatch between what the docs or a
message said and what happened, fixed, with the test that keeps it fixed.

* a run's last line: the loss for a problem without classes (the quadratic), a word when the
  run ended worse than it started, and on divergence what to change; exit 1 for ``diverged``;
* ``help(repro.api.simulate)`` lists every server rule and protocol it accepts (the registries');
* a ``cifar10`` run without ``data.root`` says what the folder must hold and where to get it;
* ``python -m repro.analysis`` on a results folder that does not exist names ``--results``;
* the docs state what the code does: speedup's target error, the exit codes, the set-up
  commands' last lines.
"""
from __future__ import annotations

import contextlib
import io
import re
import subprocess

import pytest
import torch
import yaml
from torch import nn

from tests.helpers.grids import cli_run
from tests.helpers.paths import ROOT


def _run(tmp_path, monkeypatch, capfd, *overrides: str) -> subprocess.CompletedProcess:
    # in the test's process: its last line and exit status are tested, not a fresh interpreter's
    # start-up (~2 s of imports; tests/helpers/grids.cli_run)
    return cli_run(monkeypatch, capfd, f"results_dir={tmp_path}", *overrides)


def _status_line(done: subprocess.CompletedProcess) -> str:
    return next(line for line in (done.stdout + done.stderr).splitlines()
                if re.match(r"(completed|diverged|failed)\w*: version", line))


def test_a_quadratic_run_prints_its_loss_not_a_meaningless_error(tmp_path, monkeypatch, capfd):
    done = _run(tmp_path, monkeypatch, capfd, "+problem=quadratic", "num_epochs=20")
    assert done.returncode == 0, done.stderr[-2000:]
    line = _status_line(done)
    assert "test loss" in line and "test error" not in line, line
    assert "test error" not in done.stdout + done.stderr   # nor in a progress line


def test_a_diverged_run_exits_1_and_says_to_lower_the_learning_rate(tmp_path, monkeypatch, capfd):
    done = _run(tmp_path, monkeypatch, capfd, "algo.lr=1000", "num_epochs=1")
    assert done.returncode == 1, done.stderr[-2000:]
    line = _status_line(done)
    assert line.startswith("diverged:") and "smaller algo.lr (now 1000" in line, line


def _misfit_problem():
    """Training labels that make the test labels (their opposite) less likely: the run
    completes its budget while its test loss rises."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    y = (x[:, 0] > 0).long()
    return (x, y), (x, 1 - y)


def test_a_run_that_ends_worse_than_it_started_says_so_in_python_and_on_the_command_line():
    from repro import api
    from repro.run import last_lines

    train, test = _misfit_problem()
    torch.manual_seed(0)
    result = api.simulate(nn.Linear(6, 2), train, test, num_clients=2, nsync=2, num_epochs=5,
                          lr=0.1, momentum=0.0, cost="uniform")
    assert result.summary["status"] == "completed"
    assert result.evals.test_loss.iloc[-1] > result.evals.test_loss.iloc[0]
    assert "worse than its first" in result.summary["message"], result.summary["message"]
    line = last_lines(result.summary, ROOT).splitlines()[0]
    assert line.startswith("completed:") and "worse than its first" in line, line


def test_a_run_that_trains_has_no_such_word():
    from repro import api

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    result = api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_clients=2, nsync=2, num_epochs=5,
                          lr=0.1, momentum=0.0, cost="uniform")
    assert result.summary["status"] == "completed" and result.summary["message"] == ""


def test_simulate_help_lists_every_rule_and_protocol_it_accepts():
    from repro import api
    from repro.asgd.protocols import PROTOCOLS
    from repro.asgd.rules import RULES

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        help(api.simulate)
    text = out.getvalue()
    rules = re.search(r"server_rule : \{([^}]*)\}", text).group(1)
    protocols = re.search(r"protocol : \{([^}]*)\}", text).group(1)
    assert set(re.findall(r'"(\w+)"', rules)) == set(RULES.names())
    assert set(re.findall(r'"(\w+)"', protocols)) == set(PROTOCOLS.names())


def test_cifar10_without_a_folder_says_what_it_must_hold_and_where_to_get_it(tmp_path, monkeypatch, capfd):
    done = _run(tmp_path, monkeypatch, capfd, "data=cifar10", "model=cifar_18pct")
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert "data.root" in line and "data_batch_1..5" in line and "test_batch" in line, line
    assert "https://www.cs.toronto.edu/~kriz/cifar.html" in line and "Traceback" not in done.stderr


def test_redrawing_from_a_missing_results_folder_names_results(tmp_path, capsys):
    from repro.analysis.__main__ import main

    assert main(["fig3", "--results", str(tmp_path / "nonexistent")]) == 2
    err = capsys.readouterr().err
    assert "'--results'" in err and "does not exist" in err and "'exp'" not in err, err


# ---------------------------------------------------------------------------------------------
# The docs say what the code does
# ---------------------------------------------------------------------------------------------

def test_reproduce_states_the_target_error_the_speedup_figures_use():
    targets = {yaml.safe_load((ROOT / "conf" / "exp" / f"{f}.yaml").read_text())["target_error"]
               for f in ("fig2", "fig3", "fig4")}
    assert len(targets) == 1
    target = targets.pop()
    row = next(line for line in (ROOT / "REPRODUCE.md").read_text().splitlines()
               if line.startswith("| target error, speedup |"))
    stated = re.findall(r"(\d+(?:\.\d+)?)% training error", row)
    assert stated and all(float(s) == pytest.approx(100 * target) for s in stated), row


def test_the_exit_codes_are_documented_as_the_command_line_returns_them():
    page = (ROOT / "docs" / "getting-started.md").read_text()
    table = page.split("## Exit codes", 1)[1]
    codes = dict(re.findall(r"^\| (\d+) \| (.*) \|$", table, re.M))
    assert set(codes) == {"0", "1", "2", "130"}, codes
    assert "diverged" in codes["1"] and "failed" in codes["1"] and "algo.lr" in codes["1"]
    readme = (ROOT / "README.md").read_text()
    assert "1 when it ends `diverged`" in readme


def test_the_readme_shows_the_last_line_a_run_prints():
    """The first set-up command's last lines, as the README shows them, have the form
    repro.run prints (status line, then the run folder)."""
    from repro.run import last_lines

    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"```\n(completed: .*)\n(run folder: .*)\n```", readme)
    assert shown, "README shows no run's last lines"
    summary = {"status": "completed", "version": 225, "epoch": 20.04, "clock": "virtual",
               "time_s": 2.31, "wall_time_s": 3.0, "final": {"test_error": 10 / 360}, "message": ""}
    status_line, folder_line = last_lines(summary, "results/default/base").splitlines()
    assert shown.group(1) == status_line and shown.group(2) == folder_line
