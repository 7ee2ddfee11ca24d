"""A figure, and compare, draw the runs of one configuration grid: never a pool of settings.

Issue 16 §2: after ``+exp=fig1``, ``+exp=fig1 num_epochs=3`` and ``+exp=fig1 num_epochs=3
algo.lr=0.001`` in one tree, fig1.csv held 9 runs of three configurations under the title "3
seeds", and compare said ``agree`` for 30.7% against 2.6%. Issue 22 §1 and §4: compare and the
CLI refused ``fig3_paper``/``fig4_paper``, a baseline that lands elsewhere moved every grid point
unannounced, and variants overwrote the committed figures. Trees are written by
:mod:`tests.fake_runs` (seconds); the end-to-end grid test is slow.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from repro.analysis import build_figure, configs, load_runs, run_speedups
from repro.analysis.__main__ import main
from repro.analysis.render import FIGURES, figure_runs
from repro.errors import ConfigError
from repro.files.storage import LONGEST_NAME
from repro.grid import BuildFigure, figure_stem

from tests.helpers import fake_runs as fr
from tests.helpers.paths import ROOT

matplotlib.use("Agg")
VARIANTS = {"num_epochs=3": ({"num_epochs": 3.0}, 0.05),
            "algo.lr=0.001,num_epochs=3": ({"num_epochs": 3.0, "algo": {"lr": 0.001}}, 0.6)}


def write_variant(root: Path, exp: str, job: str, change: dict, shift: float, num_clients=(1,),
                  nsyncs=(1,), seeds=(0, 1, 2), start: str = "cold") -> list[str]:
    """Runs of ``exp`` with ``change`` applied to their config, errors raised by ``shift``, in
    folders named as Hydra names them (``<job>,seed=0``); returns the folder names."""
    names = []
    for n in num_clients:
        for k in nsyncs:
            for s in seeds:
                ev, up = fr.curves(n, k, s, start, error_shift=shift)
                cfg = fr.config(exp, n, k, s, start)
                for key, value in change.items():
                    cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
                name = f"{job},{fr.job_name(n, k, s)}"
                fr.write_run(root / exp / name, cfg, ev, up, fr.summary(ev, "completed"))
                names.append(name)
    return names


@pytest.fixture
def mixed(tmp_path) -> Path:
    """The issue's tree: fig1 (3 seeds) plus two variants of 3 seeds each, in one folder."""
    root = tmp_path / "results"
    fr.write_experiment(root, "fig1", [1], [1], [0, 1, 2], "cold")
    for job, (change, shift) in VARIANTS.items():
        write_variant(root, "fig1", job, change, shift)
    return root


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------------------------------------
# Drawing from the logs alone
# ---------------------------------------------------------------------------------------------

def test_a_folder_of_three_configurations_is_refused_naming_each(mixed, tmp_path):
    code, _, err = cli("fig1", "--results", str(mixed), "--out", str(tmp_path / "figures"))
    assert code == 2
    assert "3 configurations" in err and "--config" in err
    for label in ("num_epochs=6,algo.lr=0.05", "num_epochs=3,algo.lr=0.05",
                  "num_epochs=3,algo.lr=0.001"):
        assert label in err, err
    assert not (tmp_path / "figures").exists()   # nothing drawn, nothing half-written


def test_config_draws_one_configuration_into_files_of_its_own(mixed, tmp_path):
    out = tmp_path / "figures"
    code, stdout, err = cli("fig1", "--results", str(mixed), "--out", str(out),
                            "--config", "num_epochs=3,algo.lr=0.001")
    assert code == 0, err
    frame = pd.read_csv(out / "fig1-num_epochs=3,algo.lr=0.001.csv")
    assert frame["run_dir"].nunique() == 3 and frame["seed"].nunique() == 3
    assert frame["run_dir"].str.contains("algo.lr=0.001").all()
    assert frame["config_id"].nunique() == 1
    assert not (out / "fig1.png").exists()        # the committed name is left alone
    code, _, err = cli("fig1", "--results", str(mixed), "--out", str(out), "--config",
                       "num_epochs=6", "--name", "fig1_base")
    assert code == 0 and pd.read_csv(out / "fig1_base.csv")["run_dir"].nunique() == 3, err


def test_a_choice_that_is_not_a_setting_or_matches_nothing_exits_2(mixed, tmp_path):
    for choice, words in (("lr=0.1", "'lr' is not one"), ("num_epochs", "KEY=VALUE"),
                          ("num_epochs=4", "num_epochs=4"),
                          # the last value used to win, drawn under a file name showing both
                          ("num_epochs=4,num_epochs=6", "'num_epochs' is given twice")):
        code, _, err = cli("fig1", "--results", str(mixed), "--out", str(tmp_path), "--config",
                           choice)
        assert code == 2 and words in err, (choice, err)


def test_config_matches_a_bool_a_string_and_an_int_as_typed_and_a_non_number_matches_none(tmp_path):
    """--config KEY=VALUE compares a value by its setting's type: a bool as true/false in any
    case, a string as written, an integer as a number (64 or 64.0); a non-number where a number
    is due matches no run (exit 2 naming the choice), as does 1 for true."""
    root = tmp_path / "results"
    fr.write_experiment(root, "fig1", [1], [1], [0, 1], "cold")
    for job, change in (("held", {"cost": {"reply_holds_server": True}}), ("exp", {"cost": {"jitter": "exponential"}}),
                        ("b64", {"algo": {"batch_size": 64}})):
        write_variant(root, "fig1", job, change, 0.0, seeds=(0, 1))
    for choice, job in (("cost.reply_holds_server=true", "held"), ("cost.reply_holds_server=True", "held"),
                        ("cost.jitter=exponential", "exp"), ("algo.batch_size=64", "b64"),
                        ("algo.batch_size=64.0", "b64"),
                        ("cost.reply_holds_server=false,cost.jitter=lognormal,algo.batch_size=32", None)):
        code, _, err = cli("fig1", "--results", str(root), "--out", str(tmp_path / "figures"), "--config", choice)
        assert code == 0, (choice, err)
        drawn = pd.read_csv(tmp_path / "figures" / f"fig1-{choice}.csv")["run_dir"].map(lambda d: Path(d).name)
        assert sorted(set(drawn)) == [f"{job + ',' if job else ''}{fr.job_name(1, 1, s)}" for s in (0, 1)], choice
    for choice in ("algo.batch_size=sixty", "cost.reply_holds_server=1", "cost.jitter=Exponential"):
        code, _, err = cli("fig1", "--results", str(root), "--out", str(tmp_path / "figures"), "--config", choice)
        assert code == 2 and f"finished runs with {choice}" in err, (choice, err)


def test_two_runs_of_one_grid_point_are_refused_naming_what_differs(tmp_path):
    """One configuration at 1 and at 2 threads: twice as many runs as seeds, never pooled."""
    root = tmp_path / "results"
    fr.write_experiment(root, "fig1", [1], [1], [0, 1], "cold")
    write_variant(root, "fig1", "num_threads=2", {"num_threads": 2}, 0.0, seeds=(0, 1))
    with pytest.raises(ConfigError, match=r"num_threads: choose with --config num_threads=1"):
        figure_runs("fig1", root, "fig1")
    [(_, runs)], _ = figure_runs("fig1", root, "fig1", config="num_threads=2")
    assert len(runs.runs) == 2


# ---------------------------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------------------------

def test_compare_never_pools_configurations(mixed, tmp_path):
    """The issue's compare: the mixed tree against the baseline tree's figures. It said agree
    (exit 0) for 30.7% against 2.6%; now it refuses, and compares what is chosen."""
    base = tmp_path / "base"
    fr.write_experiment(base, "fig1", [1], [1], [0, 1, 2], "cold")
    with contextlib.redirect_stdout(io.StringIO()):
        build_figure("fig1", base, tmp_path / "figs")
    code, _, err = cli("compare", str(mixed), str(tmp_path / "figs"), "--figures", "fig1")
    assert code == 2 and "3 configurations" in err
    code, out, err = cli("compare", str(mixed), str(tmp_path / "figs"), "--figures", "fig1",
                         "--config", "num_epochs=6")
    assert code == 0 and "fig1: agree (1 grid point x 2 metrics)" in out, out + err
    assert "3/3" in out                                    # 3 seeds a side, not 9
    code, out, err = cli("compare", str(mixed), str(tmp_path / "figs"), "--figures", "fig1",
                         "--config", "algo.lr=0.001")
    assert code == 2 and "different configurations" in err, out + err   # not compared at all


# ---------------------------------------------------------------------------------------------
# The grid callback: its own points, one figure per configuration, files of its own
# ---------------------------------------------------------------------------------------------

def test_the_grid_callback_draws_its_own_points_and_names_the_others(mixed, tmp_path):
    points = [f"algo.lr=0.001,num_epochs=3,{fr.job_name(1, 1, s)}" for s in (0, 1, 2)]
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        paths = BuildFigure("fig1", str(tmp_path / "figures")).build(
            str(mixed), "fig1", points, "fig1-variant")
    assert [p.name for p in paths] == ["fig1-variant.png", "fig1-variant.pdf", "fig1-variant.csv"]
    frame = pd.read_csv(tmp_path / "figures" / "fig1-variant.csv")
    assert sorted(frame["run_dir"].map(lambda d: Path(d).name).unique()) == sorted(points)
    said = " ".join(str(w.message) for w in caught)
    assert "6 other run(s)" in said and "num_epochs=3,num_clients=1" in said, said


def _grid_beside_other_grids(tmp_path) -> tuple[list[Path], list[str]]:
    """A grid of 3 points, the last cut, beside five broken folders no point of it names; its
    figure built: the points and the warnings it gave."""
    points = fr.write_experiment(tmp_path, "fig1", [1], [1], [0, 1, 2], "cold")
    cut = points[2] / "evals.csv"
    cut.write_text(cut.read_text()[:-2])
    fr.write_bad_runs(tmp_path / "fig1")
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        BuildFigure("fig1", str(tmp_path / "figures")).build(str(tmp_path), "fig1", [p.name for p in points])
    return points, [str(w.message) for w in caught]


def test_a_grids_figure_counts_its_own_unusable_points_not_another_grids(tmp_path):
    """A figure says how many unusable run folders it left out (render.save_figure); a grid's is
    drawn from its own points, so the broken folders of other grids beside them are not its own:
    it counted them too (6 where 1 of its 3 points was cut)."""
    said = [m for m in _grid_beside_other_grids(tmp_path)[1] if "left out as unusable" in m]
    assert said == ["fig1: 1 run folder left out as unusable, each named above"], said


def test_a_grids_figure_warns_only_about_its_own_unusable_points(tmp_path):
    """The folders of other grids beside a grid's points (an interrupted one's) are not its own:
    building its figure warned "skipping partial run" for each of them too (load_runs warned
    before the grid's points were chosen), above a note that counts its own only."""
    points, messages = _grid_beside_other_grids(tmp_path)
    said = [m for m in messages if m.startswith("skipping ")]
    assert len(said) == 1 and str(points[2]) in said[0], said


def test_a_grids_figure_leaves_out_its_refused_points_and_none_left_draws_nothing(tmp_path, monkeypatch, capsys):
    """A finished grid launched again with resume=auto and other settings refuses its points
    (exit 2, errors.BAD_POINTS), yet its figure was redrawn from those folders' runs of the old
    settings ("fig3: wrote ..."): a refused point did not run. Its folder is left out, the
    figure says so, and a grid whose every point was refused draws nothing, in one line."""
    from omegaconf import OmegaConf

    points = [p.name for p in fr.write_experiment(tmp_path, "fig1", [1], [1], [0, 1, 2], "cold")]
    monkeypatch.setattr("repro.grid.grid_points", lambda config: points)
    config = OmegaConf.create({"hydra": {"overrides": {"task": []}, "sweep": {"dir": str(tmp_path / "fig1")}}})
    figure = BuildFigure("fig1", str(tmp_path / "figures"))
    # as repro.run.job and repro.launcher record a refused point in the launching process
    monkeypatch.setattr("repro.grid.BAD_POINTS", points[2:])
    figure.on_multirun_end(config)
    drawn = pd.read_csv(tmp_path / "figures" / "fig1.csv")["run_dir"].map(lambda d: Path(d).name)
    assert sorted(drawn.unique()) == sorted(points[:2])
    err = capsys.readouterr().err
    assert f"fig1: 1 grid point refused as bad input left out (not run with this grid's settings): {points[2]}" \
        in err and "fig1: 1 refused grid point left out, each named above" in err and "other run" not in err, err

    monkeypatch.setattr("repro.grid.BAD_POINTS", points)
    (tmp_path / "figures" / "fig1.csv").unlink()
    figure.on_multirun_end(config)
    out = capsys.readouterr()
    assert not (tmp_path / "figures" / "fig1.csv").exists() and "wrote" not in out.out, out
    assert out.err == "fig1: no figure drawn: every point of the grid was refused (named above)\n", out.err


def test_a_grid_of_two_configurations_draws_one_figure_each(mixed, tmp_path):
    """A command-line sweep of a setting the figure does not draw across (num_epochs=3 with
    algo.lr=0.05,0.001): each configuration its own files, named by what differs."""
    points = [p.name for p in (mixed / "fig1").iterdir() if p.name.startswith(("num_epochs=3",
                                                                               "algo.lr"))]
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paths = build_figure("fig1", mixed, tmp_path / "figures", "fig1", jobs=points,
                             stem="fig1-sweep", each=True)
    csvs = sorted(p.name for p in paths if p.suffix == ".csv")
    assert csvs == ["fig1-sweep-algo.lr=0.001.csv", "fig1-sweep-algo.lr=0.05.csv"]
    for name in csvs:
        assert pd.read_csv(tmp_path / "figures" / name)["run_dir"].nunique() == 3


def test_a_configurations_files_whose_name_is_too_long_are_shortened_and_said(mixed, tmp_path):
    """The per-configuration files are named <stem>-<settings>: a long grid stem and the settings
    passed the file system's 255 bytes, and the figure ended in a raw 'File name too long'. Shortened
    as a run folder's name is (a readable start and a hash), the full name said in a warning."""
    points = [p.name for p in (mixed / "fig1").iterdir() if p.name.startswith(("num_epochs=3", "algo.lr"))]
    stem = "fig1-" + "sweep" * 45
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        paths = build_figure("fig1", mixed, tmp_path / "figures", "fig1", jobs=points, stem=stem, each=True)
    csvs = sorted(p.name for p in paths if p.suffix == ".csv")
    assert len(csvs) == 2 and all(len(n.encode()) <= LONGEST_NAME and n.startswith(stem[:90]) for n in csvs)
    for setting in ("algo.lr=0.001", "algo.lr=0.05"):
        assert any(f"{stem}-{setting}" in str(w.message) and "stand for" in str(w.message) for w in said), said


def test_the_committed_figure_is_written_only_by_the_experiment_as_committed():
    assert figure_stem("fig2", ["+exp=fig2"]) == "fig2"
    assert figure_stem("fig2", ["+exp=fig2", "hydra/launcher=basic", "progress=false"]) == "fig2"
    assert figure_stem("fig2", ["+exp=fig2", "algo=sgd"]) == "fig2-algo=sgd"
    assert figure_stem("fig3", ["+exp=fig3", "nsync=4", "num_threads=2"]) == \
        "fig3-nsync=4,num_threads=2"
    assert figure_stem("fig1", ["+exp=fig1", "seed=0,1,2,3"]) == "fig1-seed=0,1,2,3"
    assert figure_stem("stability", ["+exp=stability", "cost=jitter_exponential",
                                     "exp_name=stability_random"]) == "stability_random"
    # quoted as a shell script or simreal quotes it: the folder Hydra makes has no quotes, nor do the files
    assert figure_stem("stability", ["+exp=stability", "exp_name='stability_random'"]) == "stability_random"
    assert figure_stem("fig3_paper", ["+exp=fig3_paper", "data.root=/a/b"]) == "fig3_paper"
    # a grid of two figures renamed by exp_name: each keeps files of its own
    assert figure_stem("own_data", ["+exp=own_data", "exp_name=mine"]) == "mine"
    assert figure_stem("partition", ["+exp=own_data", "exp_name=mine"]) == "mine-partition"
    assert figure_stem("fig3_paper_shared", ["+exp=fig4_paper_shared", "exp_name=x"]) == "x-fig3_paper_shared"
    # a folder of the user's own holds no committed figure: the names stay comparable
    assert figure_stem("fig3", ["+exp=fig3", "num_threads=2", "figures_dir=figures_2threads"]) == "fig3"


def without_hydra(full):
    """``full`` (composed with Hydra's node) as ``compose`` without it: the node dropped in place,
    as ``hydra.compose`` drops it (one composition fewer)."""
    from omegaconf import open_dict

    with open_dict(full):
        del full["hydra"]
    return full


def test_every_committed_experiment_is_one_configuration_per_figure():
    """The axes each figure declares cover what its experiment sweeps: every grid point of every
    experiment file with a figure is the same configuration of that figure (else the committed
    figures would come out split)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from repro.config.settings import to_dict
    from repro.analysis.load import flatten
    from repro.run import parse
    from tests.helpers.configs import composed

    parser = OverridesParser.create()
    groups = {"data", "model", "algo", "cost", "backend", "protocol", "problem", "mitigation", "partition"}
    checked = 0
    for path in sorted((ROOT / "conf" / "exp").glob("*.yaml")):
        full = composed([f"+exp={path.stem}"], hydra=True)
        callback = (full.hydra.get("callbacks") or {}).get("figure")
        if callback is None:
            continue
        axes = FIGURES[callback.figure].axes
        sweep = {k: list(parser.parse_overrides([f"{k}={v}"])[0].sweep_string_iterator())
                 for k, v in (full.hydra.sweeper.params or {}).items()}
        # each group at its first choice; then every value of every key, one at a time
        first = {k: f"{k}={v[0]}" for k, v in sweep.items() if k.lstrip("+") in groups}
        base, ids = composed([f"+exp={path.stem}", *first.values()]) if first else without_hydra(full), set()
        for key, values in sweep.items():
            for value in values:
                if key in first and value == values[0]:   # every group at its first choice
                    dcfg = base
                elif key in first:   # a group: composed as Hydra would
                    dcfg = composed([f"+exp={path.stem}", *(o for k, o in first.items() if k != key),
                                    f"{key}={value}"])
                else:
                    dcfg = copy.deepcopy(base)
                    OmegaConf.update(dcfg, key, parser.parse_overrides([f"{key}={value}"])[0].value())
                ids.add(configs.fingerprint(configs.settings(flatten(to_dict(parse(dcfg))), axes)))
        assert len(ids) == 1, f"{path.stem}: its grid spans {len(ids)} configurations of {callback.figure}"
        checked += 1
    assert checked >= 10


# ---------------------------------------------------------------------------------------------
# fig4's reference
# ---------------------------------------------------------------------------------------------

def test_fig4_reference_is_never_a_stale_folder_of_other_settings(tmp_path):
    """A 1-client run of other settings whose folder sorts first used to be every seed-0
    point's reference."""
    root = tmp_path / "results"
    grid = fr.write_experiment(root, "fig4", [1, 2, 4], [1], [0, 1], "warm")
    stale = write_variant(root, "fig4", "aaa_num_epochs=3", {"num_epochs": 3.0}, 0.2,
                          seeds=(0,), start="warm")
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_figure("fig4", root, tmp_path / "figures", "fig4", jobs=[p.name for p in grid],
                     stem="fig4", each=True)
    frame = pd.read_csv(tmp_path / "figures" / "fig4.csv")
    assert not frame["ref_run_dir"].str.contains(stale[0]).any()
    assert (frame["ref_run_dir"].map(lambda d: Path(d).name.split(",")[0]) == "num_clients=1").all()
    # and through the API on the pooled tables: the reference shares the configuration
    runs = configs.annotate(load_runs(root, "fig4"), FIGURES["fig4"].axes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_run = run_speedups(runs.evals, 0.1)
    mine = per_run[~per_run["run_dir"].str.contains("aaa_")]
    assert not mine["ref_run_dir"].dropna().str.contains("aaa_").any()


# ---------------------------------------------------------------------------------------------
# The paper's regime and the warm-start baseline (issue 22 §1)
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def paper_trees(tmp_path) -> dict[str, Path]:
    """fig3_paper and fig4_paper as results trees; B is A regenerated from a baseline 3 points
    lower (every error of every run shifted: what another CPU's baseline does)."""
    trees = {}
    for side, shift in (("a", 0.0), ("b", -0.03)):
        root = tmp_path / side
        for exp in ("fig3_paper", "fig4_paper"):
            fr.write_experiment(root, exp, [1, 2, 4], [1, 8], [0, 1], "warm", error_shift=shift)
        trees[side] = root
    return trees


def test_the_cli_and_compare_take_the_paper_regime_figures(paper_trees, tmp_path):
    figs = tmp_path / "figs"
    for name in ("fig3_paper", "fig4_paper"):
        code, _, err = cli(name, "--results", str(paper_trees["a"]), "--out", str(figs))
        assert code == 0, err
    assert {p.name for p in figs.iterdir()} >= {"fig3_paper.png", "fig3_paper.csv",
                                               "fig4_paper.png", "fig4_paper.csv",
                                               "fig4_paper_speedup.csv"}
    code, out, err = cli("compare", str(paper_trees["a"]), str(figs), "--figures",
                         "fig3_paper,fig4_paper")
    assert code == 0, out + err
    assert "fig3_paper: agree" in out and "fig4_paper: agree" in out


def test_compare_reports_a_warm_start_baseline_that_differs(paper_trees):
    code, out, err = cli("compare", str(paper_trees["a"]), str(paper_trees["b"]), "--figures",
                         "fig3_paper")
    assert code == 1, out + err
    verdict = [line for line in out.splitlines() if line.startswith("fig3_paper:")][0]
    assert "the warm-start baseline itself DIFFERS" in verdict
    assert out.index("warm-start baseline") < out.index("num_clients=1 nsync=1")   # first


def test_a_figures_folder_s_fig3_paper_is_timed_to_its_own_target(tmp_path):
    """A CSV does not hold the target: fig3_paper's is 10% (conf/exp/fig3_paper.yaml), not the
    digits figures' 1%."""
    from repro.analysis.compare import curve_target
    from repro.analysis.trees import Tree

    folder = Tree(tmp_path, "figures", {}, {})
    assert curve_target("fig3_paper", folder, folder) == 0.1
    assert curve_target("fig3", folder, folder) == 0.01


# ---------------------------------------------------------------------------------------------
# fig4's legend and colours (issue 22 §5)
# ---------------------------------------------------------------------------------------------

def test_fig4_legend_stays_off_the_data_and_every_nsync_has_its_own_marker():
    from repro.analysis import figures

    frame = pd.read_csv(ROOT / "figures" / "fig4_paper.csv")
    fig = figures.fig4(frame)
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    assert not legend.overlaps(ax.get_window_extent())     # beside the axes, not on the data
    lines = [h for h in ax.get_lines() if h.get_label().startswith("nsync = ")]
    assert len(lines) == frame["nsync"].nunique() >= 3
    assert len({h.get_marker() for h in lines}) == len(lines)
    colors = np.array([matplotlib.colors.to_rgb(h.get_color()) for h in lines])
    gaps = [np.abs(a - b).sum() for i, a in enumerate(colors) for b in colors[i + 1:]]
    assert min(gaps) > 0.25                                # neighbours apart, not five greens


# ---------------------------------------------------------------------------------------------
# End to end: real grids in one tree (slow)
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_variant_grids_in_one_tree_draw_their_own_runs_into_their_own_files(tmp_path):
    """Two variants of fig1 run one after the other in one results tree, with the default
    figures folder: each draws only its own runs, into files named by its overrides; the
    committed name fig1.png is never written."""
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "repro.run", "+exp=fig1", "eval_every=0.1", "progress=false",
            "hydra/launcher=basic", "hydra.sweeper.params.seed='0,1'"]
    outs = []
    for extra in (["num_epochs=0.2"], ["num_epochs=0.2", "algo.lr=0.001"]):
        proc = subprocess.run(base + extra, cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        outs.append(proc.stdout + proc.stderr)
    figures_dir = tmp_path / "figures"
    assert sorted(p.name for p in figures_dir.glob("*.csv")) == \
        ["fig1-algo.lr=0.001,eval_every=0.1,num_epochs=0.2.csv", "fig1-eval_every=0.1,num_epochs=0.2.csv"]
    first = pd.read_csv(figures_dir / "fig1-eval_every=0.1,num_epochs=0.2.csv")
    second = pd.read_csv(figures_dir / "fig1-algo.lr=0.001,eval_every=0.1,num_epochs=0.2.csv")
    assert first["run_dir"].nunique() == 2 and second["run_dir"].nunique() == 2
    assert second["run_dir"].str.contains("algo.lr=0.001").all()
    assert "2 other run(s)" in outs[1] and "left out" in outs[1]
    assert json.loads((tmp_path / "results" / "fig1" / "eval_every=0.1,num_epochs=0.2,seed=0"
                       / "summary.json").read_text())["status"] == "completed"


def test_a_configuration_told_apart_by_a_list_is_chosen_as_the_refusal_prints_it(tmp_path):
    """The refusal printed data.slow_client_classes=[0, 1], which --config split at its comma
    ("KEY=VALUE pairs separated by commas"): that configuration could not be drawn at all."""
    root = tmp_path / "results"
    fr.write_experiment(root, "fig1", [1], [1], [0, 1, 2], "cold")
    listed = write_variant(root, "fig1", "slow", {"data": {"slow_client_classes": [0, 1]}}, 0.1)
    code, _, err = cli("fig1", "--results", str(root), "--out", str(tmp_path / "figures"))
    assert code == 2 and "data.slow_client_classes=[0, 1]: 3 run(s)" in err, err
    for choice in ("data.slow_client_classes=[0, 1]", "data.slow_client_classes=[0,1],num_epochs=6"):
        code, _, err = cli("fig1", "--results", str(root), "--out", str(tmp_path / "figures"), "--config", choice)
        assert code == 0, err
        frame = pd.read_csv(next((tmp_path / "figures").glob("*.csv")))
        assert sorted(frame["run_dir"].map(lambda d: Path(d).name).unique()) == sorted(listed)
        for path in (tmp_path / "figures").iterdir():
            path.unlink()
