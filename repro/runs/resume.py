"""What a resume reads before it continues a run: the checkpoint, checked whole, and the tables,
intact up to it; rows after it are dropped (the resumed run recomputes them)."""
from __future__ import annotations

from pathlib import Path

import torch

from repro.asgd.protocols import Policy, make_protocol
from repro.config.renames import modern_tree
from repro.config.settings import RunConfig, differences
from repro.errors import ConfigError
from repro.files import schema
from repro.files.storage import atomic_write_text, read_checkpoint
from repro.logs import get_logger

log = get_logger("repro.runs.resume")

# What a checkpoint must hold for a resume to read it (key: type), per part.
REQUIRED = {"server": dict, "server.params": torch.Tensor, "server.version": int, "server.rule": dict,
            "runlog": dict, "runlog.version": int, "runlog.samples_seen": int, "runlog.next_eval": float,
            "runlog.time_s": float, "runlog.last_eval_version": int, "runlog.events": list,
            "runlog.final": dict, "runlog.wall_time_s": float, "driver": dict}

DRIVER = {"sim": {"driver.clients": dict, "driver.scheduler": dict}, "real": {"driver.clients": dict}}


def resume_state(run_dir: Path, kind: str, device: torch.device | str, cfg: RunConfig | None = None) -> dict:
    """The checkpoint to resume from, its tables cut back to it: ConfigError naming the file and line
    of a damaged or missing row, or, before any file changes, each setting in which the run that wrote
    the checkpoint differs from ``cfg`` (a checkpoint copied from another run's folder), or the
    protocol's refusal of its saved state."""
    state = load_checkpoint(run_dir, kind, device)
    runlog, run_dir = state["runlog"], Path(run_dir)
    written_by = runlog.get("config")   # (none in a checkpoint older than this check)
    diffs = differences(modern_tree(written_by, quiet=True), cfg) if cfg and isinstance(written_by, dict) else []
    if diffs:
        raise ConfigError("resume", cfg.resume, f"a checkpoint of this run ({run_dir / schema.CHECKPOINT_FILE} was "
                          f"written by a run with other settings (checkpoint -> now): {'; '.join(diffs)}); "
                          "force=true starts over")
    if cfg is not None and kind == "sim":   # (the real driver starts a resumed run's rounds afresh)
        clients = sorted(int(k) for k in state["driver"]["clients"])   # (they only seed what its state replaces)
        load_protocol_state(make_protocol(cfg, clients, state["server"]["version"]), state.get("protocol"), run_dir)
    version, evaluated = int(runlog["version"]), int(runlog["last_eval_version"])
    for name, columns, upto in ((schema.UPDATES_FILE, schema.UPDATE_COLUMNS, version),
                                (schema.EVALS_FILE, schema.EVAL_COLUMNS, evaluated)):
        kept, dropped = schema.check_table(run_dir / name, columns, upto, contiguous=name == schema.UPDATES_FILE)
        cut(run_dir / name, kept, dropped, f"after version {upto}")
    # timings.csv: a row per handled push (versions repeat), up to the rows the checkpoint counted (older: none)
    rows = runlog.get("timing_rows")
    kept, dropped = schema.check_handled(run_dir / schema.TIMINGS_FILE, schema.TIMING_COLUMNS, version,
                                         None if rows is None else int(rows))
    runlog["timing_rows"] = len(kept) - 1
    cut(run_dir / schema.TIMINGS_FILE, kept, dropped, "written after the checkpoint")
    return state


def load_protocol_state(protocol: Policy, state: dict | None, run_dir: Path) -> None:
    """Give ``protocol`` a checkpoint's ``state`` (None: none kept): ConfigError where it refuses it."""
    try:
        if state is not None:
            protocol.load_state_dict(state)
    except LookupError as exc:   # never a held push rebuilt as a plain Push without its fields
        raise ConfigError("resume", str(run_dir), f"a checkpoint whose held pushes can be rebuilt: {exc}; "
                          "make that type importable, or force=true starts the run over") from exc


def cut(path: Path, kept: list[str], dropped: int, after: str) -> None:
    """Rewrite the table at ``path`` as its lines ``kept`` when ``dropped`` rows followed (logged)."""
    if dropped:
        atomic_write_text(path, "".join(kept))
        log.info(f"resume: {path.name}: dropped {dropped} row(s) {after} (recomputed now)")


def load_checkpoint(run_dir: Path, kind: str, device: torch.device | str) -> dict:
    """The run folder's checkpoint, written by the ``kind`` driver and holding every part a resume reads."""
    path = Path(run_dir) / schema.CHECKPOINT_FILE
    if not path.exists():
        raise ConfigError("resume", True, f"a run folder holding {schema.CHECKPOINT_FILE} "
                          f"(none at {path}: nothing to resume; force=true starts over)")
    try:
        state = read_checkpoint(path, device)
    except ConfigError as e:   # unreadable: nothing to continue from, as without a checkpoint
        raise ConfigError(e.key, e.value, f"{e.expected}; force=true starts over") from None
    if state.get("kind") != kind:
        raise ConfigError("resume", True, f"a {kind!r} checkpoint ({path} was written by the "
                          f"{state.get('kind')!r} backend)")
    if missing := _missing(state, {**REQUIRED, **DRIVER[kind]}):
        raise ConfigError("resume", str(path), f"a complete checkpoint (it lacks {', '.join(missing)})")
    return state


def _missing(state: dict, required: dict) -> list[str]:
    """The required keys (dotted) absent from ``state`` or of the wrong type."""
    out = []
    for key, kind in required.items():
        node = state
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if not (isinstance(node, kind) or (kind is float and isinstance(node, int) and not isinstance(node, bool))):
            out.append(key)
    return out
