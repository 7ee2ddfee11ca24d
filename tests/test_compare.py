"""``python -m repro.analysis compare``: do two trees agree within the spread over seeds?

Uses the synthetic trees of :mod:`tests.helpers.fake_runs` (one written as if regenerated elsewhere by
shifting its errors and stretching its times); no training runs here.
"""
from __future__ import annotations

import math
import shutil
import warnings
from pathlib import Path

import matplotlib
import matplotlib.figure

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.analysis import compare_trees  # noqa: E402
from repro.analysis.__main__ import main, parse_args  # noqa: E402
from repro.analysis.render import build_figure  # noqa: E402
from repro.analysis.compare import compare_values  # noqa: E402
from repro.analysis.trees import tree_kind  # noqa: E402
from tests.helpers import fake_runs  # noqa: E402

# The fake fig3 holds bad folders on purpose; the loader's warnings about them are tested in
# test_analysis.py, and the shifted tree gives no speedup at the config target.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
FIGS = ("fig1", "fig2", "fig3", "fig4", "staleness")


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trees")
    out = {"a": fake_runs.make_results(root / "a"),
           # errors 20 percentage points higher: far beyond a 1-pp floor and the seed spread
           "far": fake_runs.make_results(root / "far", error_shift=0.2),
           # another machine: errors 0.2 pp higher, 3% slower; within floors and spreads
           "near": fake_runs.make_results(root / "near", error_shift=0.002, time_scale=1.03),
           "figs": root / "figs"}
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("ignore")
        # compare reads only the CSVs; rendering 10 PNG/PDF files would take most of this file's
        # run time, so the images are left empty (test_analysis.py checks that they are drawn)
        mp.setattr(matplotlib.figure.Figure, "savefig", lambda self, file, **kw: None)
        build_figure("all", out["a"], out["figs"])
    return out


def verdict_lines(out: str) -> dict[str, str]:
    return {line.split(":")[0]: line for line in out.splitlines()
            if line.split(":")[0] in FIGS}


# --- the rule -----------------------------------------------------------------------------------

def test_difference_within_k_pooled_spreads_agrees_beyond_disagrees():
    # both trees: sample variance 8 -> pooled sd sqrt(8) = 2.83, tolerance 3 sd = 8.49
    near = compare_values([10, 14], [13, 17], k=3, floor_abs=1.0)
    assert near["verdict"] == "agree"
    assert near["sd"] == pytest.approx(math.sqrt(8))
    assert near["tolerance"] == pytest.approx(3 * math.sqrt(8))
    assert compare_values([10, 14], [30, 34], k=3, floor_abs=1.0)["verdict"] == "DISAGREE"
    assert compare_values([10, 14], [13, 17], k=0.5, floor_abs=1.0)["verdict"] == "DISAGREE"


def test_floor_applies_when_seeds_have_no_spread():
    assert compare_values([5, 5], [5.5, 5.5], floor_abs=1.0)["verdict"] == "agree"
    assert compare_values([5, 5], [6.5, 6.5], floor_abs=1.0)["verdict"] == "DISAGREE"
    assert compare_values([100], [109], floor_rel=0.1)["verdict"] == "agree"  # one seed each
    assert compare_values([100], [112], floor_rel=0.1)["verdict"] == "DISAGREE"


def test_a_tree_with_one_seed_contributes_no_variance():
    row = compare_values([10, 14], [11], k=3)
    assert row["sd"] == pytest.approx(math.sqrt(8))  # A's variance alone, not halved


def test_nan_rules():
    nan = math.nan
    both = compare_values([nan, nan], [nan, nan, nan])
    assert (both["verdict"], both["note"]) == ("agree", "NaN in both")
    one = compare_values([nan, nan], [1.0, 1.1], floor_abs=1.0)
    assert one["verdict"] == "DISAGREE" and one["note"] == "NaN in A: 2 of 2 seeds"
    assert compare_values([1.0, 1.1], [nan, nan, 2.0])["note"].startswith("NaN in B")
    # one NaN seed of two is not a majority: the finite values are compared
    assert compare_values([nan, 3.0], [3.0, 3.2], floor_abs=1.0)["verdict"] == "agree"
    assert compare_values(None, [1.0])["verdict"] == "only in B"
    assert compare_values([1.0], None)["verdict"] == "only in A"


# --- whole trees --------------------------------------------------------------------------------

def test_a_tree_agrees_with_itself(trees, capsys):
    assert main(["compare", str(trees["a"]), str(trees["a"])]) == 0
    lines = verdict_lines(capsys.readouterr().out)
    assert lines["fig3"] == "fig3: agree (6 grid points x 2 metrics)"
    assert lines["fig4"] == "fig4: agree (4 grid points x 1 metric)"
    assert all(": agree (" in lines[name] for name in FIGS), lines


def test_errors_shifted_far_beyond_the_spread_disagree(trees, capsys):
    code = main(["compare", str(trees["a"]), str(trees["far"]), "--figures", "fig1,fig3"])
    out = capsys.readouterr().out
    assert code == 1
    lines = verdict_lines(out)
    assert set(lines) == {"fig1", "fig3"}
    assert lines["fig3"].startswith("fig3: DISAGREE at 12 of 12 comparisons"), lines
    assert any("num_clients=2 nsync=8" in line and "final_train_error_pct" in line
               and "DISAGREE" in line for line in out.splitlines()), out
    table = compare_trees(trees["a"], trees["far"], figures=["fig3"]).set_index(
        ["grid_point", "metric"])
    row = table.loc[("num_clients=2 nsync=8", "final_train_error_pct")]
    assert row["verdict"] == "DISAGREE" and row["diff"] == pytest.approx(20.0)
    # 10% training error is never reached once every error is 20 points higher
    ttt = table.loc[("num_clients=2 nsync=8", "time_to_target_s")]
    assert ttt["verdict"] == "DISAGREE" and ttt["note"] == "NaN in B: 2 of 2 seeds"


def test_a_shift_within_the_spread_agrees(trees, capsys):
    assert main(["compare", str(trees["a"]), str(trees["near"])]) == 0
    lines = verdict_lines(capsys.readouterr().out)
    assert all(": agree (" in lines[name] for name in FIGS), lines


@pytest.mark.parametrize("order", ["results_first", "figures_first"])
def test_results_tree_agrees_with_the_figures_folder_built_from_it(trees, capsys, order):
    a, b = trees["a"], trees["figs"]
    assert (tree_kind(a), tree_kind(b)) == ("results", "figures")
    if order == "figures_first":
        a, b = b, a
    assert main(["compare", str(a), str(b)]) == 0
    assert all(": agree (" in line for line in verdict_lines(capsys.readouterr().out).values())
    table = compare_trees(a, b)
    assert set(table["figure"]) == set(FIGS) and (table["verdict"] == "agree").all()
    both = table.dropna(subset=["mean_a", "mean_b"])
    assert len(both) > 20 and (both["mean_a"] == both["mean_b"]).all()  # the very same floats


def test_grid_points_in_one_tree_only_make_the_figure_incomplete(trees, tmp_path, capsys):
    fake_runs.write_experiment(tmp_path, "fig3", [1, 2], [1, 8], [0, 1], "warm")
    code = main(["compare", str(trees["a"]), str(tmp_path), "--figures", "fig1,fig3"])
    lines = verdict_lines(capsys.readouterr().out)
    assert code == 0
    assert lines["fig1"] == "fig1: only in A"
    assert lines["fig3"] == ("fig3: incomplete (2 grid points only in A; the common 4 grid "
                             "points x 2 metrics agree)")


def test_comparison_table_is_written_as_csv(trees, tmp_path):
    out = tmp_path / "sub" / "cmp.csv"
    assert main(["compare", str(trees["a"]), str(trees["figs"]), "--figures", "fig4",
                 "--csv", str(out)]) == 0
    table = pd.read_csv(out)
    assert {"figure", "grid_point", "num_clients", "nsync", "metric", "mean_a", "mean_b",
            "tolerance", "verdict"} <= set(table)
    assert set(table["verdict"]) == {"agree"}   # the warm-start baseline's 2 rows first, then 4 points
    assert list(table["grid_point"].iloc[:2]) == ["warm-start baseline"] * 2 and len(table) == 6


# --- bad input and the command line ----------------------------------------------------------

def test_bad_input_exits_2_with_a_message(trees, tmp_path, capsys):
    assert main(["compare", str(trees["a"]), str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty"), str(trees["a"])]) == 2
    assert "results tree" in capsys.readouterr().err
    assert main(["compare", str(trees["a"]), str(trees["a"]), "--figures", "fig9"]) == 2
    assert "fig9" in capsys.readouterr().err
    fake_runs.write_experiment(tmp_path / "other", "fig2", [1], [4], [0], "cold")
    assert main(["compare", str(trees["a"]), str(tmp_path / "other"), "--figures", "fig1"]) == 2
    assert "in both trees" in capsys.readouterr().err
    (tmp_path / "badcsv").mkdir()
    (tmp_path / "badcsv" / "fig4.csv").write_text("run_dir,x\na,1\n")
    assert main(["compare", str(trees["figs"]), str(tmp_path / "badcsv")]) == 2
    assert "lacks" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["nope", "empty"])
def test_a_missing_or_unknown_b_is_refused_before_a_is_read(trees, tmp_path, capsys, monkeypatch, bad):
    # compare A B read every run of A (minutes on a big tree) before it said that B does not exist
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr("repro.analysis.trees.load_runs", lambda *a: pytest.fail("A was read"))
    assert main(["compare", str(trees["a"]), str(tmp_path / bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path / bad) in err[0], err


def test_help_lists_compare_and_figure_commands_parse_as_before(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "compare" in capsys.readouterr().out
    args = parse_args(["fig3", "--results", "r", "--out", "o"])
    assert (args.figure, args.results, args.out) == ("fig3", "r", "o")
    with pytest.raises(SystemExit) as exit_:
        main(["--results", "r", "compare"])
    assert exit_.value.code == 2 and "must come first" in capsys.readouterr().err


def test_a_nan_seed_left_out_of_a_mean_is_not_counted_and_is_named():
    """Issue 32 item 8: one NaN seed of three was counted ("3/3") but the mean was of two."""
    from repro.analysis.compare import compare_figure, format_report

    def runs(train):
        return pd.DataFrame({"num_clients": 1, "nsync": 1, "seed": [0, 1, 2],
                             "final_train_error_pct": train, "final_test_error_pct": [10.0, 12.0, 11.0]})

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        rows = compare_figure("fig1", runs([10.0, 12.0, math.nan]), runs([10.0, 12.0, 11.0]))
    assert [str(w.message) for w in said] == [
        "fig1 num_clients=1 nsync=1 final_train_error_pct: in A, seed 2 is NaN and left out of the "
        "mean of the 2 others"]
    train, test = rows
    assert (train["mean_a"], train["note"]) == (11.0, "NaN seeds left out of the mean: 1 of 3 in A")
    assert test["note"] == ""
    lines = format_report(pd.DataFrame(rows)).splitlines()
    assert "2/3" in next(x for x in lines if "final_train_error_pct" in x)
    assert "3/3" in next(x for x in lines if "final_test_error_pct" in x)


def test_speedups_to_two_targets_are_said_to_differ_for_that_alone(trees):
    """A figures folder's fig4 speedups are to the target its CSV was written at: compared with a
    results tree at another --target they disagreed without a word about why."""
    with pytest.warns(UserWarning, match=r"fig4: A's speedups are to training error 0.2, B's to 0.1: "
                                         "they differ for that alone"):
        compare_trees(trees["a"], trees["figs"], figures=["fig4"], target=0.2)
    with warnings.catch_warnings(record=True) as said:   # the same target: nothing to say
        warnings.simplefilter("always")
        compare_trees(trees["a"], trees["figs"], figures=["fig4"])
    assert not [w for w in said if "differ for that alone" in str(w.message)]


@pytest.mark.parametrize("name", ["fig1", "fig4"])
def test_a_figures_csv_cut_inside_its_last_row_is_refused_not_a_smaller_number(trees, tmp_path, capsys, name):
    """compare read a figures folder's CSV unchecked: one cut inside its last cell (a truncated
    write) gave a smaller number silently. The loader's rule: a table not ending in a newline was cut."""
    shutil.copytree(trees["figs"], tmp_path / "cut")
    csv = tmp_path / "cut" / f"{name}.csv"
    csv.write_bytes(csv.read_bytes()[:-2])
    assert main(["compare", str(trees["figs"]), str(tmp_path / "cut"), "--figures", name]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(csv) in err[0] and "its last line was cut" in err[0], err
