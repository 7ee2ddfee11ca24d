"""Analysis: run folders -> tidy frames -> tables and figures (the last link of the chain).

Uses the synthetic tree of :mod:`tests.helpers.fake_runs`; no training runs here.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.analysis import figures, frames, load_runs, speedup_table, time_to_target  # noqa: E402
from repro.analysis.__main__ import main  # noqa: E402
from repro.analysis.render import FIGURES, build_figure  # noqa: E402
from repro.analysis.load import NoRunsError  # noqa: E402
from repro.analysis.tables import resolve_target, run_speedups, summarise_speedups  # noqa: E402
from repro.files import schema  # noqa: E402
from tests.helpers import fake_runs  # noqa: E402
from tests.helpers.paths import ROOT  # noqa: E402


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    return fake_runs.make_results(tmp_path_factory.mktemp("results"))


def quiet_load(root: Path, exp: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_runs(root, exp)


@pytest.fixture(scope="module")
def fig3_runs(results):
    return quiet_load(results, "fig3")


# --- loading ------------------------------------------------------------------------------------

def test_load_flattens_config_and_keeps_diverged(fig3_runs):
    runs = fig3_runs.runs
    assert len(runs) == 12  # 3 client counts x 2 nsync x 2 seeds; bad folders left out
    for col in ("run_dir", "exp_name", "job", "algo.lr", "cost.profile", "backend.name",
                "cost.compute_s", "status", "final_test_error", "wall_time_s"):
        assert col in runs, col
    diverged = runs[runs["status"] == "diverged"]
    assert diverged[["num_clients", "nsync", "seed"]].to_dict("records") == [fake_runs.DIVERGED]
    assert set(fig3_runs.evals["run_dir"]) == set(runs["run_dir"])
    for col in ("exp_name", "num_clients", "nsync", "seed", "start", "backend.name", "status",
                *schema.EVAL_COLUMNS):
        assert col in fig3_runs.evals, col
    assert set(schema.UPDATE_COLUMNS) <= set(fig3_runs.updates)
    assert fig3_runs.updates["staleness"].dtype == np.int64


def test_the_fake_runs_write_only_keys_this_version_knows(results):
    """The helper wrote a key no version had (cost.measured_compute_s): every test reading fake
    runs warned of it, which hid the warning a real unknown key gives."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_runs(results, "fig1")
    assert not [str(w.message) for w in caught if "unknown to this version" in str(w.message)]


def test_reads_what_the_drivers_runlog_writes(tmp_path):
    runlog = pytest.importorskip("repro.runs.runlog")
    log = runlog.RunLog(tmp_path / "exp" / "job", fake_runs.config("exp", 2, 4, 0, "cold"),
                        clock="virtual", backend="sim", num_train=100, eval_every=0.5,
                        target_error=0.1)
    log.log_eval(version=0, time_s=0.0, test_loss=2.3, test_error=0.9, train_loss=2.3,
                 train_error=0.9)
    for v in (1, 2):
        log.log_push(version=v, time_s=0.5 * v, client=v, read_version=v - 1, staleness=1,
                     num_steps=4, num_samples=64, train_loss=math.nan, train_error=0.5)
    log.log_eval(version=2, time_s=1.0, test_loss=math.nan, test_error=0.05,
                 train_loss=math.nan, train_error=0.05)
    log.write_summary("diverged", "loss is NaN")
    log.close()
    runs = load_runs(tmp_path, "exp")
    assert runs.runs["status"].tolist() == ["diverged"] and len(runs.evals) == 2
    assert runs.runs["time_to_target.0.1"].tolist() == [1.0]
    assert runs.updates["train_loss"].isna().all()


@pytest.mark.filterwarnings("ignore:skipping")  # the other bad folders' warnings
@pytest.mark.parametrize("folder", sorted(fake_runs.BAD_FOLDERS))
def test_bad_folder_is_skipped_with_a_warning(results, folder):
    with pytest.warns(UserWarning, match=re.escape(folder)):
        runs = load_runs(results, "fig3")
    assert folder not in set(runs.runs["job"])
    skipped = runs.skipped.set_index("job")
    assert skipped.loc[folder, "kind"] == fake_runs.BAD_FOLDERS[folder]


def _corrupt_variants(exp: Path) -> dict[str, str]:
    """More ways a folder can be broken: folder -> expected words in the warning."""
    base = fake_runs.write_experiment(exp.parent, exp.name, [1], [1], [0], "cold")[0]
    text = {p.name: p.read_text() for p in base.iterdir() if p.is_file()}
    cases = {"bad_json": (schema.CONFIG_FILE, "{not json", "unreadable"),
             "bad_status": (schema.SUMMARY_FILE, json.dumps({"status": "exploded"}), "status"),
             "no_updates": (schema.UPDATES_FILE, None, "missing"),
             "empty_evals": (schema.EVALS_FILE, "", "empty"),
             "no_column": (schema.EVALS_FILE, "version,time_s\n1,2\n", "lacks columns"),
             "interrupted": (schema.SUMMARY_FILE, json.dumps({"status": "interrupted"}),
                             "interrupted")}
    for name, (file, content, _) in cases.items():
        d = exp / name
        d.mkdir()
        for f, t in text.items():
            (d / f).write_text(t)
        if content is None:
            (d / file).unlink()
        else:
            (d / file).write_text(content)
    return {name: words for name, (_, _, words) in cases.items()}


def test_loader_never_crashes_on_bad_folders(tmp_path):
    expected = _corrupt_variants(tmp_path / "exp")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(tmp_path, "exp")
    assert len(runs.runs) == 1
    messages = [str(w.message) for w in caught]
    for folder, words in expected.items():
        assert any(folder in m and words in m for m in messages), (folder, messages)


def _copy_of_a_good_run(exp: Path, name: str) -> Path:
    """A completed fake run (2 clients, nsync 4: evals and updates both climb every row) copied
    to ``exp/name``."""
    good = fake_runs.write_experiment(exp.parent / "_good", exp.name, [2], [4], [0], "cold")[0]
    d = exp / name
    d.mkdir(parents=True)
    for f in good.iterdir():
        if f.is_file():
            (d / f.name).write_text(f.read_text())
    return d


@pytest.mark.timeout(60)
def test_a_run_file_that_is_a_fifo_or_a_folder_is_skipped_with_a_warning_and_never_waited_on(tmp_path):
    """A summary.json that is a folder or a FIFO was skipped as 'no summary.json (killed before its
    first summary)', and a config.json that is a FIFO blocked the analysis for good (its read
    waits for a writer). Each is skipped as corrupt, named, without opening it."""
    exp = tmp_path / "exp"
    _copy_of_a_good_run(exp, "good")
    bad = {"summary-fifo": schema.SUMMARY_FILE, "summary-folder": schema.SUMMARY_FILE,
           "config-fifo": schema.CONFIG_FILE, "evals-fifo": schema.EVALS_FILE}
    for name, file in bad.items():
        path = _copy_of_a_good_run(exp, name) / file
        path.unlink()
        path.mkdir() if name.endswith("folder") else os.mkfifo(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(tmp_path, "exp")
    assert runs.runs["job"].tolist() == ["good"]
    said = [str(w.message) for w in caught]
    for name, file in bad.items():
        assert any(f"skipping corrupt run {exp / name}: {file} is not a regular file" in m for m in said), said


def _edit_rows(path: Path, edit) -> None:
    """Rewrite a CSV's data rows as ``edit(rows)`` returns them (each row a list of strings)."""
    header, *rows = [line.split(",") for line in path.read_text().splitlines()]
    path.write_text("\n".join(",".join(r) for r in [header, *edit(rows)]) + "\n")


def _set_version(rows: list[list[str]], index: int, version: int) -> list[list[str]]:
    rows[index][0] = str(version)
    return rows


# folder -> (file, edit of its rows, words the warning must hold); every one of these a resume
# would refuse (repro.runs.folder.check_table)
BAD_TABLES = {
    "dup_update": (schema.UPDATES_FILE, lambda r: r[:3] + [r[2]] + r[3:], "repeats version 3"),
    "gap_update": (schema.UPDATES_FILE, lambda r: r[:3] + r[4:], "version 5 after version 3"),
    "swapped_updates": (schema.UPDATES_FILE, lambda r: [r[1], r[0], *r[2:]],
                        "version 2 after the header"),
    "fractional_version": (schema.UPDATES_FILE, lambda r: _set_version(r, 1, 1.5),
                           "has version 1.5"),
    "lost_last_update": (schema.UPDATES_FILE, lambda r: r[:-1], "summary.json says version"),
    "dup_eval": (schema.EVALS_FILE, lambda r: r[:2] + [r[1]] + r[2:], "repeats version"),
    "eval_goes_back": (schema.EVALS_FILE, lambda r: [r[0], r[2], r[1], *r[3:]], "goes back to"),
}


def test_tables_a_resume_would_refuse_are_skipped_as_corrupt(tmp_path):
    exp = tmp_path / "exp"
    for name, (file, edit, _) in BAD_TABLES.items():
        _edit_rows(_copy_of_a_good_run(exp, name) / file, edit)
    _copy_of_a_good_run(exp, "good")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(tmp_path, "exp")     # never raises for a bad folder
    assert runs.runs["job"].tolist() == ["good"]
    skipped = runs.skipped.set_index("job")
    assert sorted(skipped.index) == sorted(BAD_TABLES)
    messages = [str(w.message) for w in caught]
    for name, (file, _, words) in BAD_TABLES.items():
        assert skipped.loc[name, "kind"] == "corrupt"
        assert file in skipped.loc[name, "reason"] and words in skipped.loc[name, "reason"], (
            name, skipped.loc[name, "reason"])
        assert any(str(exp / name) in m and words in m for m in messages), (name, messages)


def _running(exp: Path, name: str) -> Path:
    d = _copy_of_a_good_run(exp, name)
    summary = json.loads((d / schema.SUMMARY_FILE).read_text())
    (d / schema.SUMMARY_FILE).write_text(json.dumps({**summary, "status": "running"}))
    return d


def test_a_running_summary_is_killed_or_still_running_by_its_lock(tmp_path):
    from repro.analysis.load import lock_held
    from repro.files.locks import FileLock
    from repro.files.schema import LOCK_FILE

    exp = tmp_path / "exp"
    no_lock_file = _running(exp, "no_lock_file")
    stale = _running(exp, "stale_lock")
    FileLock(stale / LOCK_FILE).acquire().release()      # a lock file nobody holds any more
    dead = _running(exp, "holder_died")
    code = ("import sys, time; from repro.files.locks import FileLock; "
            "FileLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(dead / LOCK_FILE)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        live = _running(exp, "live")
        with FileLock(live / LOCK_FILE):              # the writer is alive: this process
            assert lock_held(dead / LOCK_FILE)         # another live process holds it
            proc.kill()
            proc.wait(timeout=30)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                runs = load_runs(tmp_path, "exp")
            lock_text = (live / LOCK_FILE).read_text()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert len(runs.runs) == 0
    reasons = runs.skipped.set_index("job")["reason"].to_dict()
    kinds = set(runs.skipped["kind"])
    assert kinds == {"partial"}
    killed = "killed (its summary says running but no process holds it)"
    assert reasons == {"no_lock_file": killed, "stale_lock": killed, "holder_died": killed,
                       "live": "still running (a live process holds its lock)"}
    messages = [str(w.message) for w in caught]
    for name, reason in reasons.items():
        assert any(str(exp / name) in m and reason in m for m in messages), (name, messages)
    # the probe writes nothing: no lock file made, the live holder's record left as it was
    assert not (no_lock_file / LOCK_FILE).exists()
    assert json.loads(lock_text)["pid"] == os.getpid()


def test_no_summary_says_whether_a_process_still_holds_the_run(tmp_path):
    from repro.files.locks import FileLock
    from repro.files.schema import LOCK_FILE

    exp = tmp_path / "exp"
    for name in ("killed", "starting"):
        (_copy_of_a_good_run(exp, name) / schema.SUMMARY_FILE).unlink()
    with FileLock(exp / "starting" / LOCK_FILE):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs = load_runs(tmp_path, "exp")
    reasons = runs.skipped.set_index("job")["reason"]
    assert set(runs.skipped["kind"]) == {"partial"}
    assert "no process holds it" in reasons["killed"] and "no summary.json" in reasons["killed"]
    assert "still running" in reasons["starting"]


def test_missing_experiment_raises_config_error(tmp_path):
    with pytest.raises(NoRunsError, match="nope"):
        load_runs(tmp_path, "nope")


# --- tables -------------------------------------------------------------------------------------

def _evals(rows) -> pd.DataFrame:
    """Hand-made evals: (run, num_clients, nsync, seed, status, [(time_s, train_error), ...])."""
    out = []
    for run, n, k, seed, status, points in rows:
        for v, (t, err) in enumerate(points):
            out.append({"run_dir": run, "num_clients": n, "nsync": k, "seed": seed,
                        "status": status, "version": v, "time_s": t, "clock": "virtual",
                        "train_error": err, "test_error": err})
    return pd.DataFrame(out)


HAND = _evals([
    ("one_s0", 1, 1, 0, "completed", [(0, .9), (50, .5), (100, .1), (150, .05)]),
    ("one_s1", 1, 1, 1, "completed", [(0, .9), (100, .1)]),
    ("two_s0", 2, 1, 0, "completed", [(0, .9), (50, .09)]),
    ("four_s0", 4, 1, 0, "completed", [(0, .9), (25, .1)]),
    ("four_s1", 4, 1, 1, "completed", [(0, .9), (50, .1)]),
    ("four_s2", 4, 1, 2, "completed", [(0, .9), (40, .1)]),       # no 1-client seed 2
    ("four_div", 4, 1, 0, "diverged", [(0, .9), (10, .05), (20, math.nan)]),
    ("two_k8", 2, 8, 0, "completed", [(0, .9), (40, .2)]),        # never reaches 0.1
    ("four_k8", 4, 8, 1, "completed", [(0, .9), (20, .1)]),       # reference: nsync 1, seed 1
])


def test_time_to_target_is_first_eval_at_or_below_target():
    t = time_to_target(HAND, 0.1).set_index("run_dir")["time_to_target_s"]
    assert t["one_s0"] == 100 and t["two_s0"] == 50 and t["four_div"] == 10
    assert math.isnan(t["two_k8"])


def test_speedup_arithmetic():
    per_run = run_speedups(HAND, 0.1).set_index("run_dir")
    assert per_run.loc["two_s0", "speedup"] == pytest.approx(2.0)  # 100 s / 50 s
    assert per_run.loc["four_k8", "speedup"] == pytest.approx(5.0)  # other-nsync reference
    assert per_run.loc["four_k8", "ref_run_dir"] == "one_s1"
    assert per_run.loc["four_div", "outcome"] == "diverged"
    assert per_run.loc["four_s2", "outcome"] == "no_reference"
    assert per_run.loc["two_k8", "outcome"] == "not_reached"
    table = summarise_speedups(run_speedups(HAND, 0.1)).set_index(["nsync", "num_clients"])
    four = table.loc[(1, 4)]
    assert four["speedup_mean"] == pytest.approx(3.0)  # seeds: 100/25 = 4, 100/50 = 2
    assert four["speedup_std"] == pytest.approx(math.sqrt(2))
    assert (four["speedup_min"], four["speedup_max"]) == (2.0, 4.0)
    assert (four["n"], four["n_runs"], four["n_diverged"], four["n_no_reference"]) == (2, 4, 1, 1)
    assert table.loc[(1, 1), "speedup_mean"] == 1.0
    assert table.loc[(8, 2), "n_not_reached"] == 1


def test_n_no_reference_counts_runs_without_a_reference_not_those_at_the_target_at_start(tmp_path):
    """At target 1.0 every fake run meets it at time 0; only the 4-client run (seed 1) lacks a
    1-client run of its seed. Runs met at start were counted as having no reference."""
    fake_runs.write_experiment(tmp_path, "fig4", [1, 2], [1], [0], "warm")
    fake_runs.write_experiment(tmp_path, "fig4", [4], [1], [1], "warm")
    with pytest.warns(UserWarning, match="at time 0"):
        table = speedup_table(load_runs(tmp_path, "fig4"), 1.0).set_index("num_clients")
    assert table["n_runs"].tolist() == [1, 1, 1] and table["n"].tolist() == [0, 0, 0]
    assert table["n_no_reference"].tolist() == [0, 0, 1]


def test_target_comes_from_config_and_warns_when_runs_disagree():
    frame = pd.DataFrame({"target_error": [0.1, 0.2, 0.1]})
    with pytest.warns(UserWarning, match="disagree"):
        assert resolve_target(frame) == 0.1
    assert resolve_target(frame, 0.3) == 0.3
    with pytest.raises(NoRunsError):
        resolve_target(pd.DataFrame({"x": [1]}))


def test_speedup_table_from_fake_tree_counts_the_diverged_run(fig3_runs):
    table = speedup_table(fig3_runs).set_index(["nsync", "num_clients"])
    assert table.loc[(8, 4), "n_diverged"] == 1 and table.loc[(8, 4), "n"] == 1
    assert 1.5 < table.loc[(1, 2), "speedup_mean"] <= 2.2
    assert table["target"].unique().tolist() == [fake_runs.TARGET]


# --- figures ------------------------------------------------------------------------------------

def _labels(fig) -> list[str]:
    return [line.get_label() for ax in fig.axes for line in ax.get_lines()]


@pytest.mark.parametrize("name", ["fig1", "fig2", "fig3", "fig4", "staleness"])
def test_every_figure_builds_from_its_frame(results, name):
    exp = {"staleness": "fig3"}.get(name, name)
    frame = FIGURES[name].frame(quiet_load(results, exp), None)
    assert len(frame) and set(frames.RUN_ID) <= set(frame)
    before = frame.copy()
    fig = getattr(figures, name)(frame)
    pd.testing.assert_frame_equal(frame, before)  # pure: the frame is not touched
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_xlabel()]
    assert axes and all(ax.get_ylabel() or ax is not axes[0] for ax in axes)
    assert fig.axes[0].get_title() or fig.get_suptitle()
    if name in ("fig2", "fig3"):
        assert axes[0].get_xlabel() == "time (s, virtual)"
        assert axes[0].get_ylabel() == "training error (%)"
        assert frame["train_error_pct"].max() > 1  # percent, not a fraction


@pytest.mark.parametrize("name", ["fig3", "fig4", "staleness"])
def test_diverged_run_is_drawn_as_diverged(fig3_runs, name):
    frame = FIGURES[name].frame(fig3_runs, None)
    assert frame["diverged"].any()
    labels = _labels(getattr(figures, name)(frame))
    assert any("diverged" in label for label in labels), labels


def test_client_colours_are_fixed_across_figures(results, fig3_runs):
    f2 = figures.fig2(frames.fig2_frame(quiet_load(results, "fig2")))
    f3 = figures.fig3(frames.fig2_frame(fig3_runs))
    for fig in (f2, f3):
        line = next(l for ax in fig.axes for l in ax.get_lines() if l.get_label() == "4 clients")
        assert matplotlib.colors.to_rgb(line.get_color()) == figures.client_color(4)
    assert len({figures.client_color(n) for n in (1, 2, 4, 8, 16)}) == 5


def test_the_command_line_draws_in_the_style_a_run_draws_in(results, tmp_path, monkeypatch):
    """REPRODUCE.md: every figure is redrawn from the logs alone by python -m repro.analysis. The
    command line first set seaborn's theme globally, whose palette a run's figure callback never has,
    so a redrawn churn.png (default colour cycle) differed from the committed one in every colour."""
    import repro.analysis.render as render

    seen = []
    monkeypatch.setattr(render, "atomic_write", lambda path, write: path.suffix == ".png" and seen.append(
        dict(matplotlib.rcParams)))
    with matplotlib.rc_context():   # whatever the command line sets globally is undone after the test
        build_figure("fig1", results, tmp_path / "run")
        assert main(["fig1", "--results", str(results), "--out", str(tmp_path / "cli")]) == 0
    drawn_by_run, drawn_by_cli = seen
    assert drawn_by_cli == drawn_by_run, {k for k in drawn_by_run if drawn_by_cli[k] != drawn_by_run[k]}


def _curve_frame(runs) -> pd.DataFrame:
    """A fig2/fig3 frame by hand: (num_clients, nsync, seed, end time_s); errors fall 90% -> 1%."""
    rows = []
    for n, k, seed, end in runs:
        for i, t in enumerate(np.linspace(0.0, end, 6)):
            err = 90.0 * (1 / 90) ** (i / 5)
            rows.append({"exp_name": "fig3", "run_dir": f"n{n}_k{k}_s{seed}", "seed": seed,
                         "num_clients": n, "nsync": k, "start": "warm", "backend.name": "sim",
                         "status": "completed", "diverged": False, "clock": "virtual",
                         "version": i, "epoch": i / 2, "time_s": t, "train_error_pct": err,
                         "test_error_pct": err + 1})
    return pd.DataFrame(rows, columns=list(frames.CURVE_COLUMNS))


def test_fig3_annotates_each_panels_own_one_client_run():
    # 1-client runs end at different times per nsync; multi-client runs all end by 100 s, so
    # the shared x limit is 125 s and the annotation must state the panel's own 1-client end.
    frame = _curve_frame([(1, 1, 0, 700.0), (1, 1, 1, 650.0), (2, 1, 0, 100.0),
                          (1, 4, 0, 400.0), (2, 4, 0, 90.0),
                          (1, 8, 0, 110.0), (2, 8, 0, 80.0),   # not cut off: no annotation
                          (2, 16, 0, 95.0)])                   # no 1-client run: nsync 1's
    fig = figures.fig3(frame)
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible() and ax.get_title()}
    texts = {title: [t.get_text() for t in ax.texts] for title, ax in panels.items()}
    assert texts == {"nsync = 1": ["1 client: to 700 s"], "nsync = 4": ["1 client: to 400 s"],
                     "nsync = 8": [], "nsync = 16": ["1 client: to 700 s"]}
    assert {ax.get_xlim() for ax in panels.values()} == {(0.0, 125.0)}  # common x limit


def test_mean_band_interpolates_runs_on_a_common_grid():
    curves = pd.DataFrame({"run_dir": ["a"] * 3 + ["b"] * 2,
                           "t": [0, 10, 20, 0, 15], "y": [10, 0, 0, 20, 5]})
    band = figures.mean_band(curves, "t", "y").set_index("t")
    assert list(band.index) == [0, 10, 15]  # up to where both runs have data
    assert band.loc[10, "mean"] == pytest.approx((0 + 10) / 2)
    assert (band.loc[0, "lo"], band.loc[0, "hi"]) == (10, 20)


# --- entry points -------------------------------------------------------------------------------

def test_cli_writes_png_pdf_csv_and_speedup_table(results, tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["fig4", "--results", str(results), "--out", str(tmp_path)])
    assert code == 0
    for file in ("fig4.png", "fig4.pdf", "fig4.csv", "fig4_speedup.csv"):
        assert (tmp_path / file).stat().st_size > 0, file
    assert "speedup" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "fig4_speedup.csv")
    assert {"speedup_mean", "speedup_std", "n", "n_diverged"} <= set(table)
    saved = pd.read_csv(tmp_path / "fig4.csv")
    assert len(saved) == 12 and saved["diverged"].sum() == 1


def test_cli_exits_2_on_missing_or_unusable_experiment(results, tmp_path, capsys):
    assert main(["fig2", "--results", str(results), "--exp", "nope", "--out",
                 str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err
    fake_runs.write_bad_runs(tmp_path / "results" / "broken")
    assert main(["fig3", "--results", str(tmp_path / "results"), "--exp", "broken"]) == 2
    err = capsys.readouterr().err
    assert "warning: skipping corrupt run" in err and "finished run" in err
    assert not list(tmp_path.glob("*.png"))


def test_a_missing_results_folder_is_refused_in_the_one_line_of_every_bad_input(tmp_path, capsys):
    """Key, value and what is accepted, in ConfigError's own words (nothing patched on in front)."""
    missing = tmp_path / "nonexistent"
    assert main(["fig3", "--results", str(missing)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: invalid value for '--results': '{missing}'; expected an existing "
                           "results folder (this one does not exist)"), line


def test_a_results_file_is_named_a_file_not_a_missing_folder(tmp_path, capsys):
    """``--results FILE`` said the file does not exist."""
    (tmp_path / "FILE").write_text("")
    assert main(["fig1", "--results", str(tmp_path / "FILE")]) == 2
    assert capsys.readouterr().err.startswith(f"error: invalid value for '--results': '{tmp_path / 'FILE'}'; "
                                              "expected an existing results folder (this one is a file)")


def test_a_figure_folder_holding_no_run_names_no_skipped_runs_nor_warnings(tmp_path, capsys):
    """A figure's folder holding no run at all said '(0 skipped: see the warnings)', and no
    warning was printed."""
    (tmp_path / "results" / "fig1").mkdir(parents=True)
    assert main(["fig1", "--results", str(tmp_path / "results"), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"error: invalid value for '--exp': '{tmp_path / 'results' / 'fig1'}'; "
                                       "expected a folder holding at least one finished run\n")



@pytest.mark.parametrize("args, key", [(["--target", "nan"], "--target"), (["--target", "-1"], "--target"),
                                       (["--out", "FILE/sub"], "--out")])
def test_a_bad_target_or_an_out_folder_that_cannot_be_made_is_one_line_exit_2(results, tmp_path, capsys, args, key):
    """A target no run can reach drew blank speedups with exit 0; a file in --out's way was a traceback."""
    (tmp_path / "FILE").write_text("")
    args = [a.replace("FILE", str(tmp_path / "FILE")) for a in args]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fig4", "--results", str(results), "--out", str(tmp_path / "out"), *args]) == 2
    assert capsys.readouterr().err.startswith(f"error: invalid value for '{key}'")



@pytest.mark.parametrize("figure", ["churn", "sync_vs_async"])
def test_a_lab_figure_of_runs_that_record_no_protocol_is_one_line_exit_2(results, tmp_path, capsys, figure):
    """The synthetic tree's config.json, like an old run's, has no protocol: a KeyError traceback."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([figure, "--results", str(results), "--exp", "fig2", "--out", str(tmp_path)]) == 2
    assert "records no 'protocol.name'" in capsys.readouterr().err


def test_build_figure_returns_written_paths(results, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paths = build_figure("fig1", results, tmp_path)
    assert [p.name for p in paths] == ["fig1.png", "fig1.pdf", "fig1.csv"]
    assert all(p.is_file() for p in paths)
    frame = pd.read_csv(paths[-1])
    assert set(frame["metric"]) == {"training error", "test error"}


def test_a_config_key_unknown_to_this_version_is_read_with_a_warning_naming_folder_and_key(tmp_path):
    """A run folder of a newer version (or a hand edit) was read silently: a figure pools runs
    that differ only in a setting it does not know, so say so; the run is kept, the key a column."""
    new, old = fake_runs.write_experiment(tmp_path, "exp", [1, 2], [1], [0], "cold")
    config = json.loads((new / schema.CONFIG_FILE).read_text())
    config["algo"]["nesterov"] = True
    (new / schema.CONFIG_FILE).write_text(json.dumps(config))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(tmp_path, "exp")
    said = [str(w.message) for w in caught if "unknown to this version" in str(w.message)]
    assert len(runs.runs) == 2 and "algo.nesterov" in runs.runs
    assert any(str(new) in m and "algo.nesterov" in m for m in said), said
    assert not any(str(old) in m and "algo.nesterov" in m for m in said), said


@pytest.mark.parametrize("file", [schema.CONFIG_FILE, schema.SUMMARY_FILE])
def test_json_nested_past_the_parsers_depth_is_a_corrupt_folder_not_a_traceback(tmp_path, file):
    bad, good = fake_runs.write_experiment(tmp_path, "exp", [1, 2], [1], [0], "cold")
    (bad / file).write_text("[" * 100_000 + "]" * 100_000)   # json.loads: RecursionError
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = load_runs(tmp_path, "exp")
    assert runs.runs["run_dir"].tolist() == [str(good)]
    assert runs.skipped.set_index("job").loc[bad.name, "kind"] == "corrupt"


@pytest.mark.parametrize("argv", [["fig1", "--name", "sub/fig1"], ["fig1", "--name", ""], ["fig1", "--name", ".."],
                                  ["all", "--name", "mine"], ["fig1", "--name", " "], ["fig1", "--name", " \t"],
                                  ["fig1", "--name", "fig1/"]])
def test_a_name_that_is_not_one_files_stem_is_refused_naming_name(results, tmp_path, capsys, argv):
    # "sub/fig1" was blamed on --out ("No such file or directory"); "" and all ignored it silently;
    # " " wrote " .png", a file that looks nameless
    assert main([*argv, "--results", str(results), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: invalid value for '--name'"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit, words", [(lambda r: [], "has no rows"),
                                         (lambda r: r[:-2], "summary.json says version")])
def test_a_completed_runs_evals_cut_short_is_corrupt_not_a_seed_left_out(tmp_path, edit, words):
    """A completed run evaluates at its start and its end: an evals.csv holding its header only, or
    cut at a row's end, was read as a run without those points (a figure drew one seed fewer)."""
    exp = tmp_path / "exp"
    _edit_rows(_copy_of_a_good_run(exp, "cut") / schema.EVALS_FILE, edit)
    _copy_of_a_good_run(exp, "good")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(tmp_path, "exp")
    assert runs.runs["job"].tolist() == ["good"]
    assert any(str(exp / "cut") in str(w.message) and words in str(w.message) for w in caught)


def test_all_draws_every_figure_it_can_and_names_the_refused_one(tmp_path, capsys):
    """all stopped at the first figure refusing its runs (fig1 mixing configurations): fig2 was
    never drawn and nothing said which figures were written."""
    mixed = fake_runs.write_experiment(tmp_path / "res", "fig1", [1], [1], [0, 1], "cold")[0]
    fake_runs.write_experiment(tmp_path / "res", "fig2", [1, 2], [4], [0, 1], "cold")
    cfg = json.loads((mixed / schema.CONFIG_FILE).read_text())
    (mixed / schema.CONFIG_FILE).write_text(json.dumps({**cfg, "algo": {**cfg["algo"], "lr": 0.5}}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["all", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 2 and (tmp_path / "out" / "fig2.png").exists()
    assert f"wrote {tmp_path / 'out' / 'fig2.csv'}" in out
    assert not (tmp_path / "out" / "fig1.png").exists()
    assert "error: fig1: " in err and "algo.lr=0.5" in err and "fig1 refused" in err.splitlines()[-1]


def test_all_without_a_run_of_any_figure_says_so_once_in_a_short_line(tmp_path, capsys):
    """all on a results folder holding no figure's experiment: each figure's reason is printed,
    then the error line repeated all of them (16 figures' reasons, thousands of characters)."""
    fake_runs.write_experiment(tmp_path / "res", "default", [1], [1], [0], "cold")
    code = main(["all", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 2 and out.count("skipping ") == len(FIGURES.names()), out
    assert err == (f"error: invalid value for '--results': {str(tmp_path / 'res')!r}; expected usable runs for at "
                   "least one figure: no figure has any there (each one's reason is said above)\n"), err


def test_all_says_why_it_skips_a_figure_without_blaming_an_exp_the_user_never_gave(tmp_path, capsys):
    """all without --exp printed "skipping fig3: invalid value for 'exp': '.../fig3'; expected ..."."""
    fake_runs.write_experiment(tmp_path / "res", "fig1", [1], [1], [0], "cold")
    main(["all", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert f"skipping fig3: {tmp_path / 'res' / 'fig3'}: expected an experiment folder under" in out, out
    assert "'exp'" not in out


def test_all_with_config_names_each_variant_by_its_settings_never_over_the_figure_as_committed(tmp_path, capsys):
    # all --config algo.lr=0.5 wrote the variant as fig1.png, over the committed figure (into
    # figures/, by default), where one figure's --config writes fig1-algo.lr=0.5.png
    mixed = fake_runs.write_experiment(tmp_path / "res", "fig1", [1], [1], [0, 1], "cold")[0]
    cfg = json.loads((mixed / schema.CONFIG_FILE).read_text())
    (mixed / schema.CONFIG_FILE).write_text(json.dumps({**cfg, "algo": {**cfg["algo"], "lr": 0.5}}))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "fig1.png").write_bytes(b"committed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["all", "--config", "algo.lr=0.5", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "fig1-algo.lr=0.5.png").exists()
    assert (tmp_path / "out" / "fig1.png").read_bytes() == b"committed"


def test_all_with_exp_is_refused_not_every_figure_drawn_from_that_folder(results, tmp_path, capsys):
    # all --exp fig1 wrote fig2.png .. fig4_paper.png from fig1's runs (into figures/, by default)
    assert main(["all", "--exp", "fig1", "--results", str(results), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: invalid value for '--exp': 'fig1'"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("exp", ["", " "])
def test_a_blank_exp_is_refused_naming_exp_not_the_figures_own_folder_drawn(results, tmp_path, capsys, exp):
    # --exp '' (an unset shell variable) drew fig1's own folder as if --exp were left out
    assert main(["fig1", "--exp", exp, "--results", str(results), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: invalid value for '--exp': '{exp}'"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("file", [schema.EVALS_FILE, schema.UPDATES_FILE])
def test_a_table_cut_inside_its_last_row_is_corrupt_not_a_smaller_number(tmp_path, file):
    """A write cut inside the last row's last cell ('0.377' -> '0.3') leaves every row its full
    width and a number: the run was drawn with that wrong number. The writer ends every row
    with a newline, and a resume refuses a row without one (schema.parse_row): so does the loader."""
    exp = tmp_path / "exp"
    path = _copy_of_a_good_run(exp, "cut") / file
    text = path.read_text()
    assert text.endswith("\n") and not text.endswith(",\n")   # the last cell has digits to lose
    path.write_text(text[:-2])
    _copy_of_a_good_run(exp, "good")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(tmp_path, "exp")
    assert runs.runs["job"].tolist() == ["good"]
    said = [str(w.message) for w in caught]
    assert any(f"skipping corrupt run {exp / 'cut'}: {file}" in m and "cut" in m for m in said), said


def _drawn_texts(monkeypatch, argv: list[str], capsys) -> tuple[list[str], str]:
    """Every text of the figures ``main(argv)`` saves (read from the Figure objects), and stderr."""
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    texts, save = [], Figure.savefig

    def savefig(fig, *args, **kw):
        texts.extend(t.get_text() for t in fig.findobj(Text))
        return save(fig, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", savefig)
    assert main(argv) == 0
    return texts, capsys.readouterr().err


@pytest.mark.parametrize("cut", [False, True])
def test_a_figure_says_how_many_run_folders_it_left_out_and_a_clean_one_says_nothing(
        tmp_path, monkeypatch, capsys, cut):
    """A run folder the loader skips (here a table cut inside its last row) was named only in a
    warning on stderr: the figure's title said '2 seeds' and nothing else, so the PNG, shared
    later, looked whole. It now says how many folders it left out and where the reasons are; a
    figure with nothing left out carries no such note (the committed figures stay as they are)."""
    runs = fake_runs.write_experiment(tmp_path / "results", "fig1", [1], [1], [0, 1, 2], "cold")
    if cut:
        path = runs[2] / schema.EVALS_FILE
        path.write_text(path.read_text()[:-2])
    argv = ["fig1", "--results", str(tmp_path / "results"), "--out", str(tmp_path / "out")]
    texts, err = _drawn_texts(monkeypatch, argv, capsys)
    assert len(texts) > 5 and any(f"{2 if cut else 3} seeds" in t for t in texts), texts
    notes = [t for t in texts if "left out" in t]
    if cut:   # the PNG and the PDF each say it, once
        assert notes == ["1 run folder left out as unusable (why: the warnings on stderr)"] * 2, notes
        assert err.count("left out") == 1 and "warning: fig1: 1 run folder left out" in err, err
    else:
        assert notes == [] and "left out" not in err, (notes, err)


@pytest.mark.timeout(60)
def test_a_linked_run_folder_is_read_and_a_link_back_up_the_tree_read_once(tmp_path):
    """A tree assembled from links to runs kept elsewhere (ln -s ../elsewhere/seed=1 exp/) drew
    without the linked runs, and said nothing: the search did not follow folder links. A link to
    a folder above it (a loop) is walked once."""
    exp = tmp_path / "res" / "exp"
    _copy_of_a_good_run(exp, "here")
    elsewhere = _copy_of_a_good_run(tmp_path / "elsewhere" / "exp", "there")
    (exp / "linked").symlink_to(elsewhere, target_is_directory=True)
    (exp / "here" / "loop").symlink_to(exp, target_is_directory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(tmp_path / "res", "exp")
    assert sorted(runs.runs["job"]) == ["here", "linked"], [str(w.message) for w in caught]
    assert runs.skipped.empty


@pytest.mark.parametrize("argv", [["fig1", "--out", "RUN"], ["fig1", "--out", "RUN/sub"],
                                  ["compare", "RESULTS", "RESULTS", "--csv", "RUN/cmp.csv"]])
def test_an_output_inside_a_run_folder_is_refused_and_the_run_left_as_it_was(tmp_path, capsys, argv):
    """--out results/fig1/<run> (or compare's --csv there) wrote the figure's files into the run
    folder: the analysis reads run folders and must never change one."""
    results = tmp_path / "res"
    run = fake_runs.write_experiment(results, "fig1", [1], [1], [0, 1], "cold")[0]
    before = sorted(p.name for p in run.rglob("*"))
    argv = [a.replace("RESULTS", str(results)).replace("RUN", str(run)) for a in argv]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*argv, "--results", str(results)] if argv[0] != "compare" else argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    key = "--csv" if "--csv" in argv else "--out"
    assert len(err) == 1 and err[0].startswith(f"error: invalid value for '{key}'") and str(run) in err[0], err
    assert sorted(p.name for p in run.rglob("*")) == before


@pytest.mark.parametrize("out", ["RESULTS", "RESULTS/fig1", "OTHER"])
def test_an_out_that_is_the_results_tree_or_holds_run_folders_is_refused_naming_out(tmp_path, capsys, out):
    """--out results (or an experiment folder, or another results tree) wrote the figure beside the
    experiment folders: the tree then held fig1.csv and fig1/, which compare refuses as both kinds."""
    results = tmp_path / "res"
    fake_runs.write_experiment(results, "fig1", [1], [1], [0, 1], "cold")
    fake_runs.write_experiment(tmp_path / "other", "fig2", [1], [1], [0], "cold")
    out = out.replace("RESULTS", str(results)).replace("OTHER", str(tmp_path / "other"))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fig1", "--results", str(results), "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: invalid value for '--out'") and out in err[0], err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_run_folder_named_in_bytes_that_are_not_utf8_is_drawn_and_its_csv_stays_utf8(tmp_path, capsys):
    """A run folder whose name is not UTF-8 (copied from another file system) was a traceback
    (UnicodeEncodeError) half way through writing the figure's CSV; its name is written escaped."""
    results = tmp_path / "res"
    kept, run = fake_runs.write_experiment(results, "fig1", [1], [1], [0, 1], "cold")
    odd = run.with_name(os.fsdecode(b"seed\xff1"))
    run.rename(odd)
    assert main(["fig1", "--results", str(results), "--out", str(tmp_path / "out")]) == 0
    frame = pd.read_csv(tmp_path / "out" / "fig1.csv", encoding="utf-8")
    assert sorted(frame["run_dir"].unique()) == sorted([str(kept), str(odd).encode("utf-8", "backslashreplace").decode()])


@pytest.mark.parametrize("argv, written", [(["fig4", "--results", "RES", "--out", "OUT"], ["fig4.png", "fig4.csv", "fig4_speedup.csv"]),
                                           (["compare", "RES", "RES", "--csv", "OUT/cmp.csv"], ["cmp.csv"])])
def test_a_reader_that_leaves_early_loses_no_output_file_nor_prints_a_traceback(results, tmp_path, argv, written):
    """| head: the first line written after the reader left raised BrokenPipeError, a traceback,
    and the files still to come (fig4's speedup table, compare's --csv) were never written."""
    argv = [a.replace("RES", str(results)).replace("OUT", str(tmp_path / "out")) for a in argv]
    proc = subprocess.Popen([sys.executable, "-m", "repro.analysis", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    proc.stdout.close()   # as head does once it has its lines
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err and "Exception ignored" not in err, err
    assert all((tmp_path / "out" / name).is_file() for name in written), sorted(os.listdir(tmp_path / "out"))


@pytest.mark.parametrize("argv", [["fig1"], ["compare", "RES", "RES"]])
def test_ctrl_c_ends_the_analysis_with_130_and_no_traceback(results, tmp_path, capsys, monkeypatch, argv):
    """Ctrl-C while the runs were read or a figure drawn was KeyboardInterrupt's traceback."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr("repro.analysis.load.read_run", interrupted)
    argv = [a.replace("RES", str(results)) for a in argv]
    if argv[0] != "compare":
        argv += ["--results", str(results), "--out", str(tmp_path / "out")]
    try:
        code = main(argv)
    except KeyboardInterrupt:
        code = "KeyboardInterrupt raised"
    assert code == 130 and capsys.readouterr().err == ""



@pytest.mark.parametrize("argv, file", [(["fig4"], "fig4.png"), (["fig4"], "fig4.pdf"), (["fig4"], "fig4.csv"),
                                        (["fig4"], "fig4_speedup.csv"), (["compare", "RES", "RES", "--csv", "OUT/cmp.csv"], "cmp.csv")])
def test_an_interrupt_while_a_file_is_written_leaves_the_old_file_never_a_cut_one(results, tmp_path, monkeypatch, argv, file):
    """Ctrl-C inside savefig or to_csv left a truncated PNG, PDF or CSV under its final name: a
    broken figure that looks finished. Each is written under a temporary name, then renamed."""
    out = tmp_path / "out"
    out.mkdir()
    (out / file).write_bytes(b"the old file")

    def cut(original):
        def write(self, target=None, *args, **kwargs):
            if not Path(os.fspath(getattr(target, "name", target or ""))).name.startswith(file):
                return original(self, target, *args, **kwargs)
            if isinstance(target, (str, os.PathLike)):
                Path(target).write_bytes(b"half")
            else:
                target.write(b"half")
            raise KeyboardInterrupt   # half written
        return write
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", cut(matplotlib.figure.Figure.savefig))
    monkeypatch.setattr(pd.DataFrame, "to_csv", cut(pd.DataFrame.to_csv))
    argv = [a.replace("RES", str(results)).replace("OUT", str(out)) for a in argv]
    if argv[0] != "compare":
        argv += ["--results", str(results), "--out", str(out)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv) == 130
    assert (out / file).read_bytes() == b"the old file" and not list(out.glob("*.tmp"))


def test_a_figure_two_processes_write_at_once_is_written_whole(tmp_path, monkeypatch):
    """Two launches of one grid draw its figure at once, through one temporary file (fig3.png.tmp):
    the other's rename took it away, and this one's failed (FileNotFoundError, which Hydra turned
    into a warning); a file truncated mid-write by the other could have been renamed into place."""
    import os

    from repro.analysis.render import write_csv

    path, to_csv, pid = tmp_path / "fig3.csv", pd.DataFrame.to_csv, os.getpid()

    def meanwhile(frame, f, **kwargs):
        if "b" not in frame:   # the other launcher's process writes the same file meanwhile
            with monkeypatch.context() as other:
                other.setattr(os, "getpid", lambda: pid + 1)
                write_csv(pd.DataFrame({"b": [2]}), path)
        return to_csv(frame, f, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_csv", meanwhile)
    write_csv(pd.DataFrame({"a": [1]}), path)
    assert path.read_text() == "a\n1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["fig3.csv"]


def test_a_folder_in_the_way_of_a_figure_is_named_not_its_temporary_file(results, tmp_path, capsys):
    """Written under a temporary name and renamed, the rename's error named the temporary file."""
    (tmp_path / "out" / "fig1.png").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fig1", "--results", str(results), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"({tmp_path / 'out' / 'fig1.png'}: Is a directory)")
    assert not list((tmp_path / "out").glob("*.tmp"))


@pytest.mark.parametrize("edit, words", [(lambda cfg: cfg, "they are copies of one run: remove all but one, e.g. rm -r "),
                                         (lambda cfg: {**cfg, "algo": {**cfg["algo"], "lr": 0.5}},
                                          "choose one with --config algo.lr=")])
def test_runs_a_figure_cannot_tell_apart_without_config_blame_their_folder_not_config_none(tmp_path, capsys, edit, words):
    """Without --config, a folder holding two copies of one run (or two configurations) was
    refused as "invalid value for 'config': None": the folder is what is wrong, and the line
    says what to type."""
    run = fake_runs.write_experiment(tmp_path / "res", "fig1", [1], [1], [0, 1], "cold")[0]
    copy = run.with_name("copy")
    shutil.copytree(run, copy)
    (copy / schema.CONFIG_FILE).write_text(json.dumps(edit(json.loads((copy / schema.CONFIG_FILE).read_text()))))
    assert main(["fig1", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: invalid value for '--exp': '{tmp_path / 'res' / 'fig1'}'; expected ") and words in err, err
    assert "None" not in err


def test_copies_of_one_run_given_config_name_the_option_as_typed(tmp_path, capsys):
    """With --config, copies of one run were refused as "invalid value for 'config'", the
    Python API's parameter, not the command line's option; as are a --config it cannot read."""
    run = fake_runs.write_experiment(tmp_path / "res", "fig1", [1], [1], [0, 1], "cold")[0]
    shutil.copytree(run, run.with_name("copy"))
    for choice, words in (("algo.lr=0.05", "they are copies of one run: remove all but one, e.g. rm -r "),
                          ("num_epochs", "KEY=VALUE")):
        assert main(["fig1", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "out"),
                     "--config", choice]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: invalid value for '--config': '{choice}'; expected ") and words in err, err


@pytest.mark.parametrize("args, option", [(["compare", "A", "B", "--k", "-1"], "--k"),
                                          (["compare", "A", "B", "--target", "2"], "--target"),
                                          (["compare", "A", "B", "--figures", "fig9"], "--figures"),
                                          (["all", "--results", "res"], "--results"),
                                          (["fig1", "--results", "res", "--exp", "none"], "--exp")])
def test_every_refusal_of_an_option_names_the_option_as_typed(tmp_path, monkeypatch, capsys, args, option):
    """compare --k -1 was refused as "invalid value for 'k'" (as --target, --figures, a --results
    holding no runs, an --exp folder missing): the Python API's parameter, not the option typed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "res").mkdir()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: invalid value for '{option}': "), err


@pytest.mark.parametrize("args, key", [(["fig1", "--name", "a" * 240], "--name"),
                                       (["fig1", "--name", "é" * 120], "--name"),   # 240 bytes
                                       (["fig1", "--config", "algo.lr=" + "1" * 230], "--name"),
                                       (["all", "--config", "algo.lr=" + "1" * 230], "--config")])
def test_a_name_too_long_for_a_file_is_refused_naming_the_option(tmp_path, capsys, args, key):
    """A --name (or the name --config makes) too long for the file system once atomic_write's temporary
    suffix is added was refused as the first file was written, blaming --out (or as runs --config
    did not find): one line now names the option and the longest name a figure can write."""
    fake_runs.write_experiment(tmp_path / "res", "fig1", [1], [1], [0], "cold")
    assert main([*args, "--results", str(tmp_path / "res"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: invalid value for '{key}': "), err
    assert "expected a file name of at most 222 bytes" in err[0], err
    assert not (tmp_path / "out").exists()
