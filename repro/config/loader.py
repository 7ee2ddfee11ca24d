"""Where the configuration lives (:data:`CONF_DIR`), how the command line composes it onto the
dataclasses of :mod:`repro.config.settings`, what ``--help`` prints, and the checks of the command
line's words and folders (each an exit 2 with one line). How it fits: docs/configuration.md.
"""
from __future__ import annotations

import ast
import difflib
import functools
import inspect
import sys
import textwrap
import threading
from pathlib import Path

from hydra import compose as hydra_compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from repro.config import checks
from repro.config import settings as config
from repro.config.renames import modern_override
from repro.errors import EXIT_BAD_INPUT, ConfigError
from repro.files import schema
from repro.files.storage import is_read_only, shortened, unmakeable
from repro.hydra_internals import (check_flags, check_package, named_options,   # Hydra's own readings
                                   null_node_named, plain_number)

_PACKAGE = Path(__file__).resolve().parent.parent   # repro/
CONF_DIR = next((c for c in (_PACKAGE / "conf", _PACKAGE.parent / "conf")   # wheel, then checkout
                 if (c / "config.yaml").is_file()), None)
if CONF_DIR is None:
    raise FileNotFoundError(f"no Hydra configuration (conf/config.yaml) beside {_PACKAGE}: "
                            "reinstall the package (pip install gpu-asgd-repro or pip install -e .)")


def group_options(group: str) -> list[str]:
    """The option names of one config group (``conf/<group>/*.yaml``), sorted."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


GROUPS = ("data", "model", "algo", "cost", "backend", "protocol")
OPTIONAL_GROUPS = ("exp", "problem", "mitigation", "partition")   # added with +GROUP=OPTION, never in defaults
ALL_GROUPS = (*GROUPS, *OPTIONAL_GROUPS)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: the docstring written under it}, read from the source (Python does not keep them)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {node.target.id: " ".join(str(nxt.value.value).split()) for node, nxt in zip(body, body[1:])
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)}


def key_docs() -> dict[str, str]:
    """{dotted key: meaning} for every settable key."""
    return {key: field_docs(cls).get(f.name, "") for key, f, cls in config._leaves()}


def help_text(tree: dict, choices: dict[str, str]) -> str:
    """The help page for the composed config ``tree``; ``choices``: {group: chosen option}."""
    lines = ["usage: python -m repro.run [GROUP=OPTION ...] [KEY=VALUE ...] [+exp=NAME]",
             "",
             "Trains one run (a folder under results/<exp_name>/) with the delay simulator",
             "(backend=sim, default) or real processes (backend=real); +exp=NAME runs an",
             "experiment's whole grid and draws its figure. Bad input exits 2 before any work.",
             "",
             "groups (GROUP=OPTION; * marks the option in use):"]
    for group in ALL_GROUPS:
        opts = [o + ("*" if choices.get(group) == o else "") for o in group_options(group)]
        name = "+" + group if group in OPTIONAL_GROUPS else group
        lines.append(f"  {name:8} {', '.join(opts)}")
    lines += ["", "keys (KEY=VALUE):"]
    docs = key_docs()
    width = max(map(len, docs)) + 2
    indent = " " * (width + 4)
    for key, meaning in docs.items():
        lines.append(f"  {key:{width}}{_show(config.get(tree, key, '(not set)'))}")
        lines += [textwrap.fill(text, 96, initial_indent=indent, subsequent_indent=indent)
                  for text in (f"valid: {config.valid_values(key)}", meaning)]
    lines += ["", "Run folders are named from the overrides of keys that shape training;",
              "resume=true continues an interrupted run, force=true starts a folder over.",
              "Hydra's own options: --hydra-help; the composed config: --cfg job."]
    return "\n".join(lines)


def _show(value) -> str:
    if value == REQUIRED:
        return "???"   # as Hydra writes a value the user must give
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


SHORTENED: dict[str, str] = {}   # {shortened folder name: the overrides it stands for}, this process's


def job_name(overrides) -> str:
    """A run folder's name: the sorted overrides of keys that shape training, ``base`` for none; over 255 bytes,
    shortened and remembered in :data:`SHORTENED` (docs/getting-started.md, "What a run leaves behind")."""
    shaping = set(config.shaping_keys()) | set(GROUPS) | (set(OPTIONAL_GROUPS) - {"exp"})
    kept = sorted((key, plain_number(str(item))) for item in overrides or ()
                  for key in [str(item).partition("=")[0].lstrip("+~")] if "=" in str(item) and key in shaping)
    name = ",".join(f"{k}={v}" for k, v in kept) or "base"
    short = shortened(name, checks.NAME_BYTES)
    if short != name:
        SHORTENED[short] = name
    return short


def register_schema() -> None:
    """The dataclasses' defaults as Hydra's base configs: ``schema``, and ``backend/real_schema`` (the real
    driver's keys, only under ``backend=real``). Plain nodes: :func:`repro.config.checks.from_dict` checks them."""
    store = ConfigStore.instance()
    tree = config.to_dict(config.RunConfig())
    store.store(group="backend", name="real_schema", node=dict(tree["backend"]))
    tree["backend"] = {"name": tree["backend"]["name"]}
    store.store(name="schema", node=tree)


# A value an option requires the user to give: Hydra's '???' merged onto the schema's default keeps the
# default (OmegaConf's rule), so the option writes ${required:} and reading it fails as '???' did.
REQUIRED = "${required:}"


def _required(*, _node_):
    raise MissingMandatoryValue(_node_._get_full_key(None))


if not OmegaConf.has_resolver("required"):
    OmegaConf.register_new_resolver("required", _required)
register_schema()
_COMPOSING = threading.Lock()


def compose(overrides: list[str], return_hydra_config: bool = False):
    """The ``DictConfig`` that ``python -m repro.run OVERRIDES`` would compose, without output folders."""
    # job_name: what @hydra.main names the job of repro/run.py (its log is run.log)
    overrides = [modern_override(o) for o in overrides]   # old flat spellings, with a line each
    # Hydra's GlobalHydra is one per process: two threads composing at once (simulate() in a
    # ThreadPoolExecutor) raised "GlobalHydra is already initialized" in all but one
    with _COMPOSING, initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="run"):
        return null_node_named(lambda o: hydra_compose(config_name="config", overrides=o,
                                                       return_hydra_config=return_hydra_config), overrides)


def parse(dcfg) -> config.RunConfig:
    """A composed config resolved and validated (or a ConfigError): nothing below sees a ``DictConfig``."""
    try:
        tree = OmegaConf.to_container(dcfg, resolve=True, throw_on_missing=True)
    except (MissingMandatoryValue, InterpolationResolutionError) as e:
        key = getattr(e, "full_key", None) or "?"
        if not isinstance(e, InterpolationResolutionError) or "MissingMandatoryValue" in str(e):
            raise ConfigError(key, None, "a value (it has none: set " + key + "=...)") from None
        if key == "?" or key.startswith("hydra."):   # Hydra's own (a run folder's record): not input
            raise
        # the user's ${...} (a key or environment variable that is not there): a traceback before
        written = config.get(OmegaConf.to_container(dcfg, resolve=False), key, None)
        raise ConfigError(key, written, f"a ${{...}} that resolves ({str(e).splitlines()[0]})") from None
    tree.pop("hydra", None)
    return checks.from_dict(tree)


def composed(overrides: tuple[str, ...] = ()) -> config.RunConfig:
    """``parse(compose(overrides))``: the config the command line would run for ``overrides``."""
    return parse(compose(list(overrides)))


def exit_bad_input(err: ConfigError | str) -> None:
    """Bad input: one line on stderr, exit 2, before any work."""
    print(f"error: {err}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_INPUT)


def check_folder_makeable(dcfg: DictConfig, grid: bool) -> None:
    """Exit 2 for a new run's or grid's folder that cannot be made (Hydra would die with a traceback), or
    that holds files no run wrote; a grid's must be writable even if it exists (multirun.yaml goes there)."""
    from hydra.core.hydra_config import HydraConfig   # Hydra's documented way to its own config
    HydraConfig.instance().set_config(dcfg)   # resolves ${hydra:...} in hydra.run.dir
    key = "hydra.sweep.dir" if grid else "hydra.run.dir"
    try:
        name = str(OmegaConf.select(dcfg, key))
    except InterpolationResolutionError as exc:   # -m exp_name=${oops}: OmegaConf's traceback
        exit_bad_input(f"cannot name the {'grid' if grid else 'run'} folder ({key}): {str(exc).splitlines()[0]}")
    folder = Path(name).absolute()
    # Hydra takes '' for the folder above it: the run's files went there, among other runs' or files
    for part in [key, "hydra.sweep.subdir"] if grid else [key]:   # a subdir of ${hydra.job.num}: a job's
        if not str(OmegaConf.select(dcfg, part, throw_on_resolution_failure=False)).strip():
            exit_bad_input(f"{part} is empty: the {'grid' if grid else 'run'} would write into {folder}; give "
                           f"a folder, or leave {part} out (results_dir=FOLDER)")
    why = unmakeable(folder)
    if why is None and grid and folder.is_dir() and is_read_only(folder):
        why = f"{folder} is read-only or not writable"
    if why:
        exit_bad_input(f"cannot make the {'grid' if grid else 'run'} folder {folder}: {why} (set "
                       f"results_dir=FOLDER to a writable folder)")
    if schema.holds_others(folder, grid):   # before Hydra writes its record, run.log or multirun.yaml there
        exit_bad_input(ConfigError(key, str(folder), schema.GRID_OTHERS if grid else schema.OTHERS))


def composition_line(exc: Exception) -> str:
    """Hydra's first line, with why (a key not in a node) or the options where it says them; for an override
    its grammar cannot read (exp_name=é), how to quote it."""
    if isinstance(exc, OverrideParseException):
        *what, grammar = [line.strip() for line in str(exc).splitlines() if line.strip() not in ("", "^")]
        return f"{'; '.join(what)} (quote a value with other characters: KEY='VALUE'; {grammar})"
    cause = str(exc.__cause__ or "").partition("\n")[0]   # e.g. "Key 'n_jobs' not in 'BasicLauncherConf'"
    options = getattr(exc, "options", None)
    return (str(exc).partition("\n")[0] + (f" {cause}" if cause.startswith("Key ") else "")
            + (f" (one of: {', '.join(options)})" if options else ""))


def parsed_overrides(argv: list[str]) -> list[tuple[str, str, str]]:
    """(prefix, key, value) of each ``KEY=VALUE`` argument (flags and their values skipped)."""
    pairs = (arg.partition("=") for arg in argv if not arg.startswith("-") and "=" in arg)
    return [(key[:len(key) - len(key.lstrip("+~"))], key.lstrip("+~").split("@")[0], value) for key, _, value in pairs]


# Hydra's flags that take a value (``--cfg job``); every other word must be KEY=VALUE or a flag.
VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
               "--config-dir", "-cd", "--experimental-rerun", "--info", "-i")
# Hydra's flags that each choose what the command does: one at most
MODE_FLAGS = ("--run", "-r", "--multirun", "-m", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc")
# those that only show the config or Hydra's help: no run folder is made or checked, no torch loads
SHOWS = {"--cfg", "-c", "--info", "-i", "--hydra-help"}
# Hydra's flags that cannot work for ``python -m repro.run``, and why
UNSUPPORTED_FLAGS = {
    ("--shell-completion", "-sc"): "Hydra's completion completes 'python FILE.py', not 'python -m repro.run'",
    ("--config-name", "-cn", "--config-path", "-cp"): "the command's config is conf/config.yaml, whose "
                                                       "experiments are added with +exp=NAME",
}


def check_words(argv: list[str]) -> None:
    """Exit 2 for a word that is neither a flag nor ``KEY=VALUE`` (Hydra: its usage text, exit 1), a setting
    given twice (Hydra silently keeps the last), and Hydra's flags that cannot work here."""
    modes = [w for w in argv if w in MODE_FLAGS]
    if len(set(modes)) > 1:   # Hydra: a raw ValueError traceback
        exit_bad_input(f"{' and '.join(modes)}: give one of --run, --multirun (-m), --cfg and --info "
                       "(--cfg job shows a single run's config)")
    check_flags(argv, lambda why: exit_bad_input(f"{why} (python -m repro.run --hydra-help lists Hydra's flags)"))
    for flags, why in UNSUPPORTED_FLAGS.items():   # Hydra: a traceback, its 14 lines, or 'install' an unknown key
        for flag in [w for w in argv if w in flags][:1]:
            exit_bad_input(f"{flag}: {why} (python -m repro.run --help lists every key and option)")
    rerun = argv[argv.index("--experimental-rerun") + 1:][:1] if "--experimental-rerun" in argv else []
    if rerun and not Path(rerun[0]).is_file():   # Hydra: a raw ValueError traceback
        exit_bad_input(f"--experimental-rerun: no file {rerun[0]} (it takes the config.pickle of Hydra's "
                       "save_job_info callback; resume=true continues a run, force=true runs it again)")
    for i, word in enumerate(argv):
        if word.startswith("-") or "=" in word or (i and argv[i - 1] in VALUE_FLAGS):
            continue   # a flag, an override, or a flag's value
        after = argv[i + 1] if i + 1 < len(argv) else "-"   # the last word: no value to show
        value = after if "=" not in after and not after.startswith("-") else "VALUE"
        key = word.lstrip("~")   # the advice is accepted as written: no ~ (deletes), + on exp and its kin
        key = f"+{key}" if key in OPTIONAL_GROUPS else key
        exit_bad_input(f"'{word}' is not an override: every setting is KEY=VALUE without spaces "
                        f"(write {key}={value}; python -m repro.run --help lists every key)")
    seen: dict[str, str] = {}
    for arg in (a for a in argv if not a.startswith("-") and "=" in a):
        key = arg.partition("=")[0].lstrip("+~")
        # Hydra's own settings may repeat: a later one replaces an earlier one, as documented
        if key in seen and key != "hydra" and not key.startswith(("hydra.", "hydra/")):
            exit_bad_input(f"'{key}' is set twice ('{seen[key]}' and '{arg}'); keep one "
                            f"(a sweep is one argument: {key}=A,B)")
        seen[key] = arg


def check_overrides(argv: list[str]) -> None:
    """Exit 2 where Hydra's message would be raw or point the wrong way: :func:`check_words`, an unknown key
    (with the closest valid ones), an unknown group option, ``exp`` without ``+``, ``+`` on a known key."""
    argv = [modern_override(a, quiet=True) for a in argv]   # an old spelling is a known key
    check_words(argv)
    keys = set(config.all_keys())
    for prefix, key, value in parsed_overrides(argv):
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        if key in ALL_GROUPS:
            optional = key in OPTIONAL_GROUPS
            if optional != (prefix == "+"):
                right = f"+{key}={value}" if optional else f"{key}={value}"
                exit_bad_input(f"'{prefix}{key}={value}': write {right} ("
                                + (f"'{key}' options are added with +" if optional else
                                   f"'{key}' is already in the config") + ")")
            named = named_options(f"{key}={value}")   # 'a, b', choice(a,b): as Hydra reads them
            if key == "exp" and (named is None or len(named) > 1):   # Hydra ran each experiment's base config once
                exit_bad_input(f"'+exp={value}' sweeps experiments, and each is a grid of its own: run one "
                               "experiment per command (" + ", then ".join(f"+exp={v}" for v in named or [value]) + ")")
            choices = group_options(key)
            for v in named or []:
                if v not in choices:
                    exit_bad_input(ConfigError(key, v, choices))
        elif key in keys:
            if prefix in ("+", "~"):
                exit_bad_input(f"'{prefix}{key}={value}': '{key}' is already a key; write {key}={value}")
        else:
            near = difflib.get_close_matches(key, [*config.all_keys(), *ALL_GROUPS], n=3, cutoff=0.6)
            if not near:   # e.g. 'lr' for 'algo.lr': match on the last component
                tails = {k.rsplit(".", 1)[-1]: k for k in config.all_keys()}
                near = [tails[t] for t in difflib.get_close_matches(key.rsplit(".", 1)[-1], list(tails), n=3)]
            exit_bad_input(f"unknown key '{key}' (in '{prefix}{key}={value}'); "
                            + (f"closest valid keys: {', '.join(near)}" if near else "no key is close")
                            + " (python -m repro.run --help lists every key)")


def owning_option(key: str) -> str | None:
    """``backend=real`` for ``backend.timeout_s``: the group option whose YAML sets the key."""
    group, _, leaf = key.partition(".")
    options = group_options(group) if group in GROUPS else []
    # the option's keys, its stored schema's included
    return next((f"{group}={o}" for o in options if leaf in compose([f"{group}={o}"])[group]), None)
