"""The staleness explorer (repro/lab/explore.py): its numbers, its HTTP endpoint, and (slow) the
page in a real headless browser, a slider moved and the new result shown."""
from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Iterator
from urllib.parse import parse_qs

import numpy as np
import pytest

from repro.analysis.lab.mitigation import expected_mean_staleness
from repro.lab import explore
from repro.lab.explore import Settings


@pytest.fixture(scope="module")
def server():
    srv = explore.serve()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_uniform_async_matches_the_theory_exactly():
    """No jitter, nsync 1: every push after the first round is N - 1 stale, and the simulated
    loss is delayed gradient descent's, step for step."""
    r = explore.point(Settings(clients=4, jitter=0.0, lr=0.2))
    assert r["status"] == "completed" and r["pushes"] == explore.STEPS
    assert r["mean_staleness"] == pytest.approx(expected_mean_staleness(4, explore.STEPS))
    assert r["predicted"]["mean_staleness"] == pytest.approx(r["mean_staleness"])
    assert r["steps_per_s"] == pytest.approx(r["predicted"]["ceiling_steps_per_s"], rel=0.02)
    theory = np.asarray(r["theory_loss"])[r["loss_version"]]
    np.testing.assert_allclose(r["loss"], theory, rtol=1e-4)


def test_sync_and_rennala_predict_no_staleness():
    for protocol in ("sync", "rennala"):
        r = explore.point(Settings(clients=4, protocol=protocol, bound=2))
        assert r["predicted"]["mean_staleness"] == 0.0
        assert r["mean_staleness"] == 0.0, protocol
        assert r["bound_used"] == 2


def test_rennala_without_jitter_is_measured_at_its_collection_rate():
    """S pushes per collection of t(S): 8 equal clients and S = 4 make 4 steps per step time,
    half the ceiling (the other 4 pushes are computed at a point the server has left); S = 12
    waits for a second round of pushes: 12 per two step times. The page showed the ceiling."""
    for bound, share in ((4, 0.5), (8, 1.0), (12, 0.75)):
        r = explore.point(Settings(clients=8, jitter=0.0, protocol="rennala", bound=bound))
        assert r["predicted"]["steps_per_s"] == pytest.approx(share * r["predicted"]["ceiling_steps_per_s"])
        assert r["steps_per_s"] == pytest.approx(r["predicted"]["steps_per_s"], rel=0.02), bound


def test_sync_without_jitter_is_measured_at_the_ceiling():
    """Equal step times: a round ends when every client has made its step, so sync moves as many
    local steps per second as async (a round is one row of one step in the updates, but N
    clients' samples)."""
    r = explore.point(Settings(clients=8, jitter=0.0, protocol="sync", bound=0))
    assert r["steps_per_s"] == pytest.approx(r["predicted"]["steps_per_s"], rel=0.02)
    assert r["predicted"]["steps_per_s"] == pytest.approx(r["predicted"]["ceiling_steps_per_s"])


def test_ssp_is_answered_with_the_simulators_staleness_and_rate():
    """ssp at bound 0 runs in rounds: every client fetches the round's last push, so the k-th
    push of a round is k - 1 stale, (N - 1) / 2 on average with or without jitter; the page
    predicted async's N - 1 (2.98 beside a measured 1.5). At a bound equal clients never reach
    it is async. Its throughput is the clock rule's (exact without jitter)."""
    for s, measured in ((Settings(clients=4, jitter=0.0, protocol="ssp", bound=0), 1.5),
                        (Settings(clients=8, protocol="ssp", bound=0), (37 * 28 + 6) / 300),   # 37.5 rounds
                        (Settings(clients=4, jitter=0.0, protocol="ssp", bound=3), expected_mean_staleness(4, 300))):
        r = explore.point(s)
        assert (r["status"], r["bound_used"], r["pushes"]) == ("completed", s.bound, explore.STEPS), s
        assert r["mean_staleness"] == pytest.approx(measured), s
        assert r["predicted"]["mean_staleness"] == pytest.approx(measured), s
        assert r["steps_per_s"] == pytest.approx(r["predicted"]["steps_per_s"], rel=0.02 if s.jitter == 0 else 0.05)
        assert r["predicted"]["rate_source"] == "ssp clock rule (Monte Carlo)"


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
def test_a_round_or_collection_longer_than_the_run_is_run_once():
    """A sync round of 32 clients x nsync 16 (512 steps) or a rennala collection of 64 x 16 is
    longer than the 300-step run, which the run's own check refuses (one apply may not exceed the
    budget): the slider position is answered with that one apply, as before the check."""
    for s in (Settings(clients=32, nsync=16, protocol="sync", bound=0),
              Settings(clients=8, nsync=16, protocol="rennala", bound=64),
              Settings(clients=32, nsync=16, protocol="rennala", bound=64, problem="digits")):
        r = explore.point(s)
        assert (r["status"], r["versions"]) == ("completed", 1), s


def test_the_bound_slider_is_kept_to_what_each_protocol_accepts():
    """sync: at most N - 1 backup workers; ringmaster's R and rennala's S at least 1 (each a
    config the run's own check accepts)."""
    from repro.config.checks import validate

    def checked(s: Settings):
        cfg = explore.run_config(s)
        validate(cfg)
        return cfg

    assert checked(Settings(clients=4, protocol="sync", bound=9)).protocol.backup_workers == 3
    assert checked(Settings(protocol="ringmaster", bound=0)).protocol.staleness_threshold == 1
    assert checked(Settings(protocol="rennala", bound=0)).protocol.collection_size == 1
    assert checked(Settings(protocol="ssp", bound=0)).protocol.staleness_bound == 0


def test_endpoint_answers_the_sliders(server):
    code, r = _get(server + "/api?clients=2&nsync=1&jitter=0&lr=0.3&protocol=async&bound=3")
    assert code == 200
    assert r["settings"] == {"clients": 2, "nsync": 1, "jitter": 0.0, "lr": 0.3, "protocol": "async", "bound": 3,
                             "problem": "quadratic"}
    assert r["predicted"]["mean_staleness"] == pytest.approx(expected_mean_staleness(2, explore.STEPS))
    assert r["predicted"]["critical_lr"] == pytest.approx(1.0)      # 2 sin(pi / 6) at tau = 1
    assert len(r["staleness"]) == r["pushes"] == explore.STEPS


def test_the_digits_network_when_asked(server):
    """problem=digits trains digits_cnn (no theory curve: that is the quadratic's) and still
    answers with the measured staleness, throughput and loss."""
    code, r = _get(server + "/api?problem=digits&clients=4")
    assert code == 200
    assert r["settings"]["problem"] == "digits" and r["status"] == "completed", r
    assert r["theory_loss"] == [] and len(r["loss"]) >= 2 and all(v > 0 for v in r["loss"])
    assert r["pushes"] > 0 and r["mean_staleness"] == pytest.approx(r["predicted"]["mean_staleness"], abs=1.5)


@pytest.mark.parametrize("query, words", [("clients=0", "clients='0': accepted int from 1 to 32"),
                                          ("lr=abc", "lr='abc'"),
                                          ("protocol=hogwild", "accepted async, sync, ssp, ringmaster, rennala"),
                                          ("problem=cifar", "accepted quadratic, digits")])
def test_endpoint_names_a_bad_value(server, query, words):
    code, r = _get(server + "/api?" + query)
    assert code == 400 and words in r["error"]


@pytest.mark.parametrize("query", ["clients=2_0", "clients=+2+", "clients=%2B2", "clients=%D9%A3", "bound=%EF%BC%93",
                                   "lr=1e-1", "lr=0.2_5", "jitter=.5", "jitter=%201"])
def test_a_number_no_slider_writes_is_refused_naming_the_key(query):
    """int() and float() took 2_0 (as 20), ' 2', +2, 1e-1, .5 and other scripts' digits (an
    Arabic-Indic or a fullwidth 3): each ran as that number, where a slider sends digits."""
    key = query.split("=")[0]
    with pytest.raises(ValueError, match=rf"^{key}='.*': accepted \w+ from .*, in digits"):
        Settings.from_query(parse_qs(query, keep_blank_values=True))


def test_every_value_a_slider_sends_is_accepted():
    """Each position of each slider of the page, written as the browser writes it (0.06, 1, 0)."""
    page = explore.PAGE.read_text()
    sliders = re.findall(r'<input type="range" id="(\w+)" min="([\d.]+)" max="([\d.]+)"(?: step="([\d.]+)")?', page)
    assert {s[0] for s in sliders} == {"clients", "nsync", "jitter", "lr", "bound"}
    for key, lo, hi, step in sliders:
        step = float(step or 1)
        for k in range(round((float(hi) - float(lo)) / step) + 1):
            text = repr(round(float(lo) + k * step, 10)).removesuffix(".0")
            assert getattr(Settings.from_query({key: [text]}), key) == float(text), (key, text)


def test_page_has_the_sliders(server):
    with urllib.request.urlopen(server + "/", timeout=30) as r:
        page = r.read().decode()
    for key in ("clients", "nsync", "jitter", "lr", "bound"):
        assert f'<input type="range" id="{key}"' in page
    assert "ringmaster" in page and "rennala" in page


def test_bench_times_each_change_against_the_budget(monkeypatch, capsys):
    """``python -m repro.lab explore --bench`` (docs/benchmarks.md), over one change here: a
    line per change with its wall and CPU time, then each measure's verdict against the 1 s
    budget; the exit status follows the wall time's (no time is asserted)."""
    from repro.lab.__main__ import main

    monkeypatch.setattr(explore, "BENCH", (Settings(clients=2, protocol="ssp", bound=0),))
    code = main(["explore", "--bench"])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4, out
    assert re.fullmatch(r"Settings\(clients=2, .*protocol='ssp', bound=0.*\): wall +\d+ ms, cpu +\d+ ms", out[0])
    assert re.fullmatch(r"load average [\d.]+ on \d+ CPUs; budget 1000 ms per change", out[1])
    verdict = r"(PASS|FAIL) \((wall|cpu)\): slowest change (\d+) ms, median \3 ms"   # one change: its own median
    verdicts = [re.fullmatch(verdict, line) for line in out[2:]]
    assert all(verdicts) and [v[2] for v in verdicts] == ["wall", "cpu"], out
    assert code == (0 if verdicts[0][1] == "PASS" else 1)


def test_busy_port_exits_2(capsys):
    srv = explore.serve()
    try:
        assert explore.main(["--port", str(srv.server_address[1])]) == 2
    finally:
        srv.server_close()
    assert "--port" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["-1", "70000"])
def test_a_port_out_of_range_exits_2(port, capsys):
    assert explore.main(["--port", port]) == 2
    assert f"--port {port}: not a port" in capsys.readouterr().err


def test_a_run_without_numbers_answers_json_the_page_can_parse(server):
    """32 clients at lr 4 diverge before any push is applied: no mean staleness, no rate. JSON
    has no NaN: the browser's JSON.parse would throw and the page stop redrawing."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    with urllib.request.urlopen(server + "/api?clients=32&nsync=16&lr=4", timeout=120) as r:
        answer = json.loads(r.read(), parse_constant=refuse)
    assert answer["status"] == "diverged" and answer["mean_staleness"] == "NaN"


def test_a_page_that_goes_away_before_its_answer_leaves_no_traceback(server, capsys):
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as page:
        page.sendall(b"GET /api?problem=digits&clients=32 HTTP/1.0\r\n\r\n")
        time.sleep(0.2)   # the change is being simulated
        page.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # closed: a reset
    assert _get(server + "/api?clients=2")[0] == 200   # served after the first (one at a time)
    assert "Traceback" not in capsys.readouterr().err


@contextlib.contextmanager
def _explorer(*code: str) -> Iterator[subprocess.Popen]:
    """``python -m repro.lab explore`` (after ``code``), with Ctrl-C as a terminal delivers it;
    killed when its ``with`` block ends (a test that fails leaves no explorer behind)."""
    run = ["-c", "; ".join((*code, "from repro.lab import explore", "sys.exit(explore.main([]))"))]
    proc = subprocess.Popen([sys.executable, *run], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    with proc:
        try:
            yield proc
        finally:
            proc.kill()


def _signals_during_a_change(proc, *signals: int) -> tuple[str, list[int]]:
    """Ask the explorer at ``proc`` for a digits change (seconds of simulation), send it
    ``signals`` 0.1 s apart while that runs, and return its stderr and the change's HTTP status."""
    url = proc.stdout.readline().split()[2]
    answered = []
    slow = threading.Thread(target=lambda: answered.append(_get(url + "api?problem=digits&clients=32")[0]))
    slow.start()
    time.sleep(0.5)
    for i, sig in enumerate(signals):
        time.sleep(0.1 if i else 0)
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    slow.join()
    return err, answered


def test_ctrl_c_while_a_change_is_simulated_waits_for_it_and_exits_0():
    """The simulation under way ends and is answered; torch's threads torn down under it
    aborted the process (SIGABRT, "terminate called without an active exception")."""
    with _explorer("import sys") as proc:
        err, answered = _signals_during_a_change(proc, signal.SIGINT)
    assert (proc.returncode, err, answered) == (0, "", [200])


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
def test_a_second_ctrl_c_while_a_change_is_simulated_stops_it_and_exits_130_quietly(tmp_path, monkeypatch):
    """The second Ctrl-C raised KeyboardInterrupt in the wait for the simulation under way (a
    traceback, then "terminate called without an active exception", -6), or at shutdown (a
    traceback from an atexit callback; -2). Now that simulation ends interrupted, its temporary
    folder removed, and the explorer exits 130 without a word."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))   # the simulation's temporary folder: none left behind
    # the change takes 3 s more, so both Ctrl-Cs land while it is under way however loaded the machine
    slow_digits = ("import time; from repro.lab import explore as e; point = e.point; "
                   "e.point = lambda s: (time.sleep(3 if s.problem == 'digits' else 0), point(s))[1]")
    with _explorer("import sys", slow_digits) as proc:
        err, answered = _signals_during_a_change(proc, signal.SIGINT, signal.SIGINT)
    assert (proc.returncode, err, answered) == (130, "", [200])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_kill_or_a_closed_terminal_while_a_change_is_simulated_ends_as_ctrl_c_does(tmp_path, monkeypatch, sig):
    """SIGTERM and SIGHUP killed the explorer under the simulation (-15, -1), leaving its
    temporary run folder behind; now they ask as a Ctrl-C does: the change is answered, exit 0."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with _explorer("import sys") as proc:
        err, answered = _signals_during_a_change(proc, sig)
    assert (proc.returncode, err, answered) == (0, "", [200])
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_the_warm_up_stops_the_explorer():
    """A Ctrl-C in the warm-up's run stops that run (interrupted): the explorer stops too,
    rather than print its URL and serve."""
    with _explorer("import sys", "from repro.runtime import request_stop", "request_stop('SIGINT')") as proc:
        out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (0, "", "")


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
def test_a_second_ctrl_c_during_the_shutdown_is_ignored():
    """A first Ctrl-C in the warm-up, a second as the explorer exits (here: when Python finalises
    __main__, after it reset its signal handlers): it killed the process (-2)."""
    at_finalisation = ("import os, signal; late = type('Late', (), {'__del__': lambda self: "
                       "os.kill(os.getpid(), signal.SIGINT)})()")
    with _explorer("import sys", at_finalisation, "from repro.runtime import request_stop",
                   "request_stop('SIGINT')") as proc:
        out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (0, "", "")


# ---------------------------------------------------------------------------------------------
# The page in a real browser
# ---------------------------------------------------------------------------------------------

CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1300,900")


def _browser(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.mark.slow
def test_browser_moves_a_slider_and_sees_the_new_result(tmp_path):
    """Start ``python -m repro.lab explore``, open its URL in headless chromium, move the clients
    slider from 4 to 8: the printed predicted mean staleness follows (3 -> 7, first round aside)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    proc = subprocess.Popen([sys.executable, "-m", "repro.lab", "explore"], stdout=subprocess.PIPE, text=True)
    browser = None
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, line
        url = line.split()[2]
        browser = _browser(tmp_path)
        browser.get(url)
        numbers = browser.find_element(By.ID, "numbers")
        wait = WebDriverWait(browser, 120)
        wait.until(lambda b: "clients=4&" in (numbers.get_attribute("data-settings") or ""))
        before = numbers.text
        assert f"predicted mean staleness: {expected_mean_staleness(4, explore.STEPS):.3f}" in before
        browser.execute_script("const s = document.getElementById('clients'); s.value = 8;"
                               "s.dispatchEvent(new Event('input'));")
        wait.until(lambda b: "clients=8&" in (numbers.get_attribute("data-settings") or ""))
        after = numbers.text
        assert f"predicted mean staleness: {expected_mean_staleness(8, explore.STEPS):.3f}" in after
        browser.save_screenshot(str(tmp_path / "screenshot.png"))
        assert (tmp_path / "screenshot.png").stat().st_size > 0
    finally:
        if browser is not None:
            browser.quit()
        proc.terminate()
        proc.wait(timeout=30)


def test_endpoint_names_an_unknown_key(server):
    """A misspelt key (client for clients) was ignored: the default's run answered, 200."""
    code, r = _get(server + "/api?client=8")
    assert code == 400 and r["error"].startswith("'client': unknown; accepted clients, nsync,")


def test_endpoint_names_a_key_given_twice(server):
    """clients=2&clients=8 ran the first (2) and answered 200: the second value was dropped."""
    code, r = _get(server + "/api?clients=2&clients=8")
    assert code == 400 and r["error"] == "clients: given 2 times; give it once"


@pytest.mark.parametrize("query, words", [("clients=", "clients='': accepted int from 1 to 32"),
                                          ("protocol", "protocol='': accepted async,")])
def test_endpoint_names_a_key_without_a_value(server, query, words):
    """parse_qs dropped a blank value: the key's default was run and answered 200."""
    code, r = _get(server + "/api?" + query)
    assert code == 400 and r["error"].startswith(words)


@pytest.mark.parametrize("query", ["clients=" + "9" * 50000, "protocol=" + "a" * 50000, "a" * 50000 + "=1"])
def test_a_long_value_or_key_is_not_echoed_whole(server, query):
    """The refusal echoed the whole value or key: a 50 kB error line for the page to show."""
    code, r = _get(server + "/api?" + query)
    assert code == 400 and len(r["error"]) < 200 and "..." in r["error"]


def _raw(server: str, request: bytes) -> tuple[int, str, dict]:
    """Send ``request`` as it is and return the answer's status, Content-Type and JSON body."""
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as page:
        page.sendall(request)
        answer = b"".join(iter(lambda: page.recv(65536), b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    kind = re.search(rb"\r\nContent-Type: ([^\r]*)", head)
    return int(head.split()[1]), kind and kind[1].decode(), json.loads(body)


@pytest.mark.parametrize("request_, code, words", [
    (b"GET /apl HTTP/1.0\r\n\r\n", 404, "'/apl': unknown; accepted / and /api"),
    (b"POST /api HTTP/1.0\r\nContent-Length: 0\r\n\r\n", 501, "Unsupported method ('POST')"),
    (b"PUT / HTTP/1.0\r\nContent-Length: 0\r\n\r\n", 501, "Unsupported method ('PUT')"),
    (b"GET /a b HTTP/1.0\r\n\r\n", 400, "Bad request syntax ('GET /a b HTTP/1.0')"),
    (b"GET /a " + b"b " * 30000 + b"HTTP/1.0\r\n\r\n", 400, "Bad request syntax ('GET /a b b b"),
    (b"GET /" + b"a" * 70000 + b" HTTP/1.0\r\n\r\n", 414, "Request-URI Too Long"),
    (b"GET / HTTP/1.0\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431, "Line too long")],
    ids=["unknown-path", "post", "put", "bad-line", "long-bad-line", "long-line", "long-header"])
def test_the_servers_own_refusals_are_json_as_the_apis(server, request_, code, words):
    """http.server answered these itself with an HTML page (the bad request line echoed whole, 60 kB
    of it); an unknown path was the text "not found". Now each is /api's one JSON line."""
    got, kind, body = _raw(server, request_)
    assert (got, kind) == (code, "application/json")
    assert body["error"].startswith(words) and len(body["error"]) < 250, body
