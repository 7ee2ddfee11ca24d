"""The staleness explorer: sliders in a browser, one small simulation per change.
Owns ``python -m repro.lab explore``: a page on 127.0.0.1 (explore.html) whose every change runs the simulator
for a few hundred steps and answers JSON, measured beside predicted (docs/lab.md, "The explorer")."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import reprlib
import signal
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np

from repro.config.checks import pushes_per_apply
from repro.runtime import EXIT_INTERRUPTED, SIGNALS, exit_on_signal, request_stop

PROTOCOLS = ("async", "sync", "ssp", "ringmaster", "rennala")
PROBLEMS = {"quadratic": ("+problem=quadratic",), "digits": ("data=digits", "model=digits_cnn")}
DIGITS_STEPS = 60      # the digits network's steps per change: fewer, to keep within budget
BOUND_KEY = {"sync": "backup_workers", "ssp": "staleness_bound", "ringmaster": "staleness_threshold",
             "rennala": "collection_size"}
STEPS = 300            # local exact-gradient steps per change: "a few hundred updates", < 1 s
EVAL_EVERY = 5.0       # steps between evaluations of the loss: 60 points (each costs a forward pass)
COMPUTE_S = 0.01       # one step: 10 ms of virtual time (the uniform profile's)
BUDGET_S = 1.0         # each change must be answered within this on 2 idle cores
PAGE = Path(__file__).with_name("explore.html")
DIGITS = {int: "[0-9]+", float: r"[0-9]+(\.[0-9]+)?"}   # what a slider sends: 4, 0.5, 0


@dataclass(frozen=True)
class Settings:
    """One position of the sliders (the query string of /api)."""
    clients: int = 4
    nsync: int = 1
    jitter: float = 0.5          # w: a step takes (1 - w) + w Exp(1) times 10 ms; 0: no jitter
    lr: float = 0.2
    protocol: str = "async"
    bound: int = 3
    problem: str = "quadratic"

    @classmethod
    def from_query(cls, query: dict[str, list[str]]) -> "Settings":
        """The settings of a query string; ValueError naming the key, value and what is accepted."""
        kinds = {"clients": (int, 1, 32), "nsync": (int, 1, 16), "jitter": (float, 0.0, 1.0),
                 "lr": (float, 1e-4, 4.0), "bound": (int, 0, 64)}
        values, known = {}, (*kinds, "protocol", "problem")
        for key in query:   # else a misspelt key (client=8) or a second value was ignored, without a word
            if key not in known:
                raise ValueError(f"{reprlib.repr(key)}: unknown; accepted {', '.join(known)}")
            if len(query[key]) > 1:
                raise ValueError(f"{key}: given {len(query[key])} times; give it once")
        for key, (kind, lo, hi) in kinds.items():
            if key in query:
                v = None   # as a slider writes: int() and float() also took 2_0, ' 2', +2, 1e-1, other scripts' digits
                with contextlib.suppress(ValueError):   # an int of over 4300 digits
                    v = kind(query[key][0]) if re.fullmatch(DIGITS[kind], query[key][0]) else None
                if v is None or not lo <= v <= hi:   # reprlib: a 60 kB value is not echoed whole
                    raise ValueError(f"{key}={reprlib.repr(query[key][0])}: accepted {kind.__name__} from {lo} to {hi}"
                                     f", in digits{' (a point allowed)' if kind is float else ''}")
                values[key] = v
        for key, accepted in (("protocol", PROTOCOLS), ("problem", tuple(PROBLEMS))):
            if key in query:
                if query[key][0] not in accepted:
                    raise ValueError(f"{key}={reprlib.repr(query[key][0])}: accepted {', '.join(accepted)}")
                values[key] = query[key][0]
        return cls(**values)


@functools.cache
def _base_config(problem: str = "quadratic"):
    """The lab's quadratic or the digits network, composed once per process and problem."""
    import repro.api as asgd
    return asgd.configure(*PROBLEMS[problem], "cost=uniform", "seed=0")


def run_config(s: Settings):
    """The RunConfig of one slider position (checked when it runs)."""
    base = _base_config(s.problem)
    bound = {"sync": min(s.bound, s.clients - 1), "ssp": s.bound, "ringmaster": max(s.bound, 1),
             "rennala": max(s.bound, 1)}
    protocol = dataclasses.replace(base.protocol, name=s.protocol,
                                   **({BOUND_KEY[s.protocol]: bound[s.protocol]} if s.protocol in BOUND_KEY else {}))
    cost = dataclasses.replace(base.cost, compute_s=COMPUTE_S, jitter="exponential" if s.jitter else "none",
                               jitter_sigma=float(s.jitter))
    algo = dataclasses.replace(base.algo, lr=float(s.lr))
    # the quadratic's epoch is one step; the digits' is 1437 samples: count its budget in steps too
    steps, per_epoch, evals = ((STEPS, 1.0, EVAL_EVERY) if s.problem == "quadratic" else
                               (DIGITS_STEPS, base.algo.batch_size / 1437, 2 * EVAL_EVERY))
    cfg = dataclasses.replace(base, num_clients=s.clients, nsync=s.nsync, num_epochs=steps * per_epoch,
                              eval_every=max(evals, s.nsync) * per_epoch, protocol=protocol, cost=cost, algo=algo,
                              exp_name="explore")
    # one apply may not exceed the run (repro.config.checks): a larger round or collection is
    # run once (the budget half a step short of it: the digits' rounded epoch buys no second)
    once = pushes_per_apply(cfg) * s.nsync
    return cfg if once <= steps else dataclasses.replace(cfg, num_epochs=(once - 0.5) * per_epoch)


@functools.cache
def _initial_weights() -> np.ndarray:
    """The quadratic's initial weights at seed 0 (what every run starts from)."""
    import torch
    from repro.workload.start import build_problem
    return build_problem(_base_config(), torch.device("cpu")).init_params.numpy().astype(float)


def theory_loss(lr: float, tau: int, nsync: int, versions: int) -> np.ndarray:
    """Loss after each of ``versions`` updates of delayed gradient descent on the quadratic, a push
    nsync steps from parameters tau versions old: w_{t+1} = w_t + ((1 - lr l)^nsync - 1) w_{t - tau}."""
    from repro.workload.data import QUADRATIC_CURVATURES
    curv = np.asarray(QUADRATIC_CURVATURES)
    w = [_initial_weights().copy()]
    factor = (1.0 - lr * curv) ** nsync - 1.0
    for t in range(versions):
        w.append(w[-1] + factor * w[max(t - tau, 0)])
        if not np.all(np.isfinite(w[-1])) or np.abs(w[-1]).max() > 1e6:
            break
    return np.array([0.5 * float(np.sum(curv * v * v)) for v in w])


def predictions(s: Settings, cfg, pushes: int) -> dict:
    """The theory's numbers for one slider position: mean staleness (versions), the ceiling and the
    protocol's own rate (local steps per virtual second), the critical lr."""
    from repro.analysis.lab.mitigation import expected_mean_staleness
    from repro.analysis.lab.stability import critical_lr
    from repro.analysis.lab.sync import predict, timing
    from repro.sim.ceiling import ceiling
    ceil = ceiling(cfg.cost, s.clients, s.nsync, param_bytes=40).pushes_per_s * s.nsync
    tm = timing(cfg.cost, s.nsync, s.clients, param_bytes=40)
    # sync and rennala: every applied push was computed from the current parameters
    staleness = 0.0 if s.protocol in ("sync", "rennala") else expected_mean_staleness(s.clients, pushes)
    rate, source = ceil, "the ceiling: every client busy"
    if s.protocol == "sync":
        rate = predict(tm, "sync", cfg.protocol.backup_workers, 0, pushes)["segments_per_s"] * s.nsync
        source = "barrier: (N - b) / E[(N-b)-th segment]"
    elif s.protocol == "ssp":   # its staleness too: the clock rule's recurrence
        ssp = predict(tm, "ssp", 0, s.bound, max(pushes, 1))
        rate, staleness, source = ssp["segments_per_s"] * s.nsync, ssp["mean_staleness"], "ssp clock rule (Monte Carlo)"
    elif s.protocol == "rennala":   # a step per S collected pushes; the others' work is dropped
        from repro.analysis.lab.uneven import collection_time
        size = cfg.protocol.resolved_collection_size(s.clients)
        taus = [tm.nsync * tm.compute_s * f + tm.overhead_s for f in tm.factors()]
        rate = size * s.nsync / collection_time(taus, size)
        source = "S / t(S), t(S) = min{t : sum floor(t/tau_i) >= S} (Tyurin & Richtarik 2023; exact without jitter)"
    tau = int(round(staleness))
    return {"mean_staleness": staleness, "ceiling_steps_per_s": ceil, "steps_per_s": rate,
            "rate_source": source, "critical_lr": float(critical_lr(tau)), "tau": tau}


def point(s: Settings) -> dict:
    """Simulate one slider position and return its measured and predicted numbers."""
    import repro.api as asgd
    cfg = run_config(s)
    result = asgd.run_config(cfg)
    summary, updates, evals = result.summary, result.updates, result.evals
    pushes = int(updates["num_steps"].count())
    pred = predictions(s, cfg, max(pushes, 1))
    end = float(updates["time_s"].max()) if len(updates) else 0.0
    # local steps from samples: a merged push (a sync round, a rennala collection) is one row of
    # one step, but carries every collected client's samples
    steps = float(updates["num_samples"].sum()) / cfg.algo.batch_size
    versions = int(updates["version"].max()) if len(updates) else 0
    # the theory's curve is the quadratic's (delayed gradient descent); none for the digits network
    theory = theory_loss(s.lr, pred["tau"], s.nsync, versions) if s.problem == "quadratic" else np.array([])
    update_rate = versions / end if end > 0 else float("nan")
    bound = getattr(cfg.protocol, BOUND_KEY[s.protocol]) if s.protocol in BOUND_KEY else None
    return {"settings": dataclasses.asdict(s), "status": summary.get("status", "?"), "bound_used": bound,
            "pushes": pushes, "versions": versions,
            "staleness": updates["staleness"].astype(int).tolist(),
            "mean_staleness": float(updates["staleness"].mean()) if pushes else float("nan"),
            "steps_per_s": steps / end if end > 0 else float("nan"),
            "loss_time_s": evals["time_s"].tolist(), "loss_version": evals["version"].astype(int).tolist(),
            "loss": evals["train_loss"].tolist(),
            "theory_time_s": (np.arange(len(theory)) / update_rate).tolist() if update_rate > 0 else [],
            "theory_loss": theory.tolist(), "predicted": pred}


def answer(query: dict[str, list[str]]) -> dict:
    """What /api returns: the numbers the page draws; {"error": ...} for bad input."""
    try:
        s = Settings.from_query(query)
    except ValueError as e:
        return {"error": str(e)}
    t0 = time.perf_counter()
    return {**point(s), "elapsed_s": time.perf_counter() - t0}


class _Handler(BaseHTTPRequestHandler):
    lock = threading.Lock()    # one simulation at a time: two cores, and torch's threads

    def handle(self):
        with contextlib.suppress(ConnectionError):   # the page went away (reloaded, closed) before
            super().handle()                         # its answer: nobody to tell, no traceback

    def do_GET(self):  # noqa: N802 (http.server's name)
        url = urlparse(self.path)
        if url.path == "/":
            self._send(200, "text/html; charset=utf-8", PAGE.read_bytes())
        elif url.path == "/api":
            with self.lock:   # held until sent: a Ctrl-C waits for the answer under way (main)
                # kept blank: else clients= (a value left out) ran the default, without a word
                body = answer(parse_qs(url.query, keep_blank_values=True))
                # a diverged run's NaN or inf goes as the text "NaN" or "Infinity": JSON has no
                # such numbers, and the page's JSON.parse would throw and stop redrawing for good
                text = json.dumps(json.loads(json.dumps(body), parse_constant=str))
                self._send(400 if "error" in body else 200, "application/json", text.encode())
        else:
            self.send_error(404, f"{reprlib.repr(url.path)}: unknown; accepted / and /api")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every refusal as /api's, one JSON line: http.server's own (a method other than GET, a bad
        or too long request line or header) answered an HTML page, the bad line echoed whole."""
        message = message or HTTPStatus(code).phrase
        text = message if len(message) <= 200 else message[:200] + "..."   # a 64 kB bad line: not echoed whole
        self._send(code, "application/json", json.dumps({"error": text}).encode())

    def _send(self, code: int, kind: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):   # quiet: the terminal shows the URL, not every request
        pass


def serve(port: int = 0) -> ThreadingHTTPServer:
    """A server on 127.0.0.1 (loopback only; port 0: a free one), not yet serving."""
    return ThreadingHTTPServer(("127.0.0.1", port), _Handler)


BENCH = (Settings(), Settings(clients=8), Settings(clients=8, protocol="sync"), Settings(clients=8, protocol="ssp"),
         Settings(clients=8, protocol="ringmaster", bound=4), Settings(clients=8, protocol="rennala", bound=4),
         Settings(clients=16, nsync=4, jitter=1.0), Settings(lr=1.5), Settings(clients=8, problem="digits"))


def bench() -> int:
    """Time each change of :data:`BENCH` against the budget, in wall and in CPU time (what an idle
    core would take: on a loaded machine the wall time counts the other processes too)."""
    answer({})   # warm-up: imports, Hydra's composition
    walls, cpus = [], []
    for s in BENCH:
        w0, c0 = time.perf_counter(), time.process_time()
        answer({k: [str(v)] for k, v in dataclasses.asdict(s).items()})
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        print(f"{s}: wall {walls[-1] * 1000:6.0f} ms, cpu {cpus[-1] * 1000:6.0f} ms", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; budget {BUDGET_S * 1000:.0f} ms per change")
    for name, times in (("wall", walls), ("cpu", cpus)):
        verdict = "PASS" if max(times) < BUDGET_S else "FAIL"
        print(f"{verdict} ({name}): slowest change {max(times) * 1000:.0f} ms, median {np.median(times) * 1000:.0f} ms")
    return 0 if max(walls) < BUDGET_S else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m repro.lab explore", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--bench", action="store_true", help="time each change against the 1 s budget and exit")
    args = p.parse_args(argv)
    if args.bench:
        return bench()
    try:
        server = serve(args.port)
    except (OSError, OverflowError) as e:   # OverflowError: a port outside 0-65535
        reason = e.strerror if isinstance(e, OSError) else "not a port"
        print(f"explore: --port {args.port}: {reason}; accepted: a free port from 1 to 65535, or 0 for any",
              file=sys.stderr)
        return 2
    for sig in SIGNALS:   # kill and a closed terminal ask as Ctrl-C does: killed, a change under way left its folder
        signal.signal(sig, signal.default_int_handler)
    with server, contextlib.suppress(KeyboardInterrupt):   # Ctrl-C: the socket closed, exit 0
        # warm-up before the URL is printed, so the first slider move is fast (a Ctrl-C during
        # its run stops that run, which ends interrupted: then stop here too)
        if answer({})["status"] != "interrupted":
            print(f"explorer at http://127.0.0.1:{server.server_address[1]}/  (Ctrl-C stops it)", flush=True)
            server.serve_forever()
    # a simulation under way ends first (torch's threads torn down under it abort the process);
    # the lock stays held so that no request waiting for it starts another. A second Ctrl-C
    # raised KeyboardInterrupt in the wait (a traceback, then that abort) or in the shutdown
    forced = threading.Event()

    def stop_now(signum, frame) -> None:
        forced.set()
        request_stop(signal.Signals(signum).name)   # the simulation under way ends interrupted, its folder removed
        exit_on_signal()   # a third signal, or one during the shutdown, exits 130 at once

    exit_on_signal()   # from here a signal during the shutdown is ignored (it killed the process: -2)
    for sig in SIGNALS:
        signal.signal(sig, stop_now)
    _Handler.lock.acquire()
    return EXIT_INTERRUPTED if forced.is_set() else 0
