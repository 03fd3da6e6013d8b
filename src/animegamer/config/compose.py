"""Compose the project's Hydra configs: the one place every command, test and tool composes its config.

:func:`compose_config` refuses what the typed schema (``config/schema.py``) does not know, whether an
override sets it (``phase.max_step=10``) or adds it (``+phase.max_step=10``: Hydra adds any key given
with ``+``), with one message naming the key and the closest known one. Each command has its own root
schema (:data:`animegamer.config.schema.COMMANDS`): a key another command reads (``trainer.devices`` given to
the pipeline) is refused naming that command. Each root searches its command's own folder
(``configs/<folder>/``, e.g. ``configs/train/experiment/``) beside the shared groups, and any folder a caller
or a ``hydra.searchpath=[...]`` override adds after it. :func:`run_command` is the
body of ``train.py``, ``evaluate.py`` and ``python -m data_pipeline``: it composes the command line's
config here, so a refusal is one message and exit code 2, before anything is written. A command names its
body with :func:`command_body` rather than importing it, so that a refused command line costs the
composition alone, not the import of Lightning and the networks (docs/architecture.md, 'Import rules').
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.resources
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from animegamer.config import schema as schema_module
from animegamer.config.schema import COMMANDS, register_configs
from animegamer.errors import UserError, exit_on_user_error
from animegamer.utils.text import join_words

CONFIG_DIR_ENV = "ANIMEGAMER_CONFIG_DIR"
CONFIG_PACKAGE_DIR = "configs"  # the package data folder of animegamer holding the YAML configs
HYDRA_NODE = "hydra"  # Hydra's own settings (hydra.run.dir, hydra/launcher=...): applied by @hydra.main only
ADDED = ("++", "+")  # prefixes of an override that adds its key (Hydra accepts any key given so)
DELETED = "~"
CONFIG_SUFFIX = ".yaml"
HELP_GROUPS = "$APP_CONFIG_GROUPS"  # the place of the group listing in a hydra/help template
SEARCH_PATH = "hydra.searchpath"  # Hydra's list of further config folders, each a URL (file://, pkg://)
FILE_URL = "file://"
HYDRA_GROUP = f"{HYDRA_NODE}/"  # hydra/help, hydra/launcher, ...: Hydra's own groups, no choice of the command's
T = TypeVar("T")
# Groups renamed: the old name -> the new one. ``data`` chose the film source, while ``data.*`` keys are the
# training data's settings; the group is ``source`` so the two no longer share a name.
RENAMED_GROUPS = {"data": "source"}


class OverrideError(UserError):
    """An override or a config file names a key, a group's option or a value that the schema refuses."""


def config_dir() -> Path:
    """The config folder: ``$ANIMEGAMER_CONFIG_DIR`` if set, else ``animegamer/configs``, the package data
    shipped with the library (a folder on disk in a checkout and in an installed wheel alike)."""
    override = os.environ.get(CONFIG_DIR_ENV)
    return Path(override) if override else Path(str(importlib.resources.files("animegamer") / CONFIG_PACKAGE_DIR))


@contextmanager
def _initialized() -> Iterator[None]:
    """Hydra initialized on :func:`config_dir` (already, inside another composition: describing its refusal)."""
    register_configs()
    if GlobalHydra.instance().is_initialized():
        yield
        return
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        yield


def compose_config(name: str, overrides: Sequence[str] = (), search_path: Sequence[str | Path] = ()) -> DictConfig:
    """The root config ``name`` (``<config_dir()>/<name>.yaml``) with ``overrides``; :class:`OverrideError` names
    an unknown key (added with ``+`` too), group option or wrong value, and the closest known one, or the
    command that reads a key this one does not. ``search_path``: further config folders (paths or Hydra
    URLs) searched after the command's own, e.g. a benchmark's ``configs/train``."""
    overrides, given = _without_search_path(overrides)
    renamed = [renamed_group(o) for o in overrides if _is_renamed(o)]
    elsewhere = [m for m in (read_elsewhere(name, o) for o in overrides if not _is_renamed(o)) if m]
    if renamed or elsewhere:
        raise OverrideError("\n".join([*renamed, *elsewhere]))
    with _initialized():
        try:
            cfg = compose(config_name=name, overrides=[*overrides, search_path_override(name, [*search_path, *given])])
        except HydraException as error:
            raise OverrideError(describe_refusal(error, overrides, name)) from error
    unknown = list(unknown_keys(cfg))
    if unknown:
        raise OverrideError("\n".join(no_such_key(_override_of(key, overrides), key, schema, name)
                                      for key, schema in unknown))
    return cfg


def _is_renamed(override: str) -> bool:
    return override_key(override).lstrip("/") in RENAMED_GROUPS and "=" in override


def search_path(name: str, extra: Sequence[str | Path] = ()) -> list[str]:
    """The folders the root ``name`` searches beside :func:`config_dir`, as Hydra URLs: its command's own
    folder, then ``extra`` (a path, or a URL kept as it is)."""
    own = [config_dir() / COMMANDS[name].folder] if name in COMMANDS else []
    own = [folder for folder in own if folder.is_dir()]  # a command without experiments has no folder
    return [str(p) if "://" in str(p) else f"{FILE_URL}{Path(p).resolve()}" for p in [*own, *extra]]


def search_path_override(name: str, extra: Sequence[str | Path] = ()) -> str:
    """The ``hydra.searchpath=[...]`` override of :func:`search_path`, each folder quoted."""
    return f"{SEARCH_PATH}=[{','.join(quoted(p) for p in search_path(name, extra))}]"


def _without_search_path(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """``overrides`` less any ``hydra.searchpath=[...]`` (with ``+``/``++`` too), and the folders those name: they
    are searched after the command's own folder rather than instead of it."""
    rest, given = [], []
    for override in overrides:
        if override_key(override) != SEARCH_PATH or override.startswith(DELETED):
            rest.append(override)
            continue
        try:
            value = OverridesParser.create().parse_override(override).value()
        except HydraException as error:
            raise OverrideError(f"{override}: {_first_line(error)}") from error
        given += [str(v) for v in (value if isinstance(value, list) else [value])]
    return rest, given


def read_elsewhere(name: str, override: str) -> str | None:
    """``override``'s refusal when its top-level key (or group) is not the root ``name``'s but another command
    reads it (``trainer.devices=2`` given to the pipeline); None otherwise."""
    top = top_key(override)
    if name not in COMMANDS or top in _field_names(COMMANDS[name].schema):
        return None
    readers = [f"animegamer {c.verb}" for root, c in COMMANDS.items() if root != name and top in _field_names(c.schema)]
    if not readers:
        return None
    command = COMMANDS[name]
    return (f"{override}: animegamer {command.verb} does not read {top} (its keys: "
            f"{', '.join(_field_names(command.schema))}); {' and '.join(readers)} "
            f"{'reads' if len(readers) == 1 else 'read'} it: give it there")


def overrides_for(name: str, overrides: Sequence[str], among: Sequence[str] = tuple(COMMANDS)) -> list[str]:
    """What of ``overrides``, given for every command of ``among`` (the roots a recipe composes), the root
    ``name`` reads: each whose top-level key or group is one of the root's. One that none of ``among`` reads
    is refused (:class:`OverrideError`) naming the closest key of them all."""
    known = {root: [*_field_names(COMMANDS[root].schema), *config_groups(root)] for root in among}
    unread = [o for o in overrides if top_key(o) != HYDRA_KEY and not any(top_key(o) in k for k in known.values())]
    if unread:
        everything = list(dict.fromkeys(key for root in among for key in known[root]))
        verbs = "animegamer " + join_words([COMMANDS[root].verb for root in among])
        refusals = []
        for override in unread:
            match = difflib.get_close_matches(top_key(override), everything, n=1)
            hint = f"did you mean {match[0]}?" if match else f"their keys: {', '.join(everything)}"
            refusals.append(f"{override}: no stage reads '{top_key(override)}' (the stages run {verbs}); {hint}")
        raise OverrideError("\n".join(refusals))
    return [o for o in overrides if top_key(o) in known.get(name, ()) or top_key(o) == HYDRA_KEY]


def carried_over(name: str, cfg: DictConfig, overrides: Sequence[str] = ()) -> DictConfig:
    """The root ``name`` composed with ``overrides``, with every top-level node it shares with ``cfg`` (another
    root's composed config) taken from ``cfg``: e.g. the evaluation of the model a train config describes."""
    composed = compose_config(name, overrides)
    shared = set(_field_names(OmegaConf.get_type(composed))) & set(_field_names(OmegaConf.get_type(cfg)))
    for key in sorted(shared):
        composed[key] = cfg[key]
    return composed


HYDRA_KEY = "hydra"  # Hydra's own settings (hydra.*): every root has them


def top_key(override: str) -> str:
    """``phase`` of ``phase.lr=1``, ``+phase.lr=1``, ``phase=c`` or ``/phase@x=c``."""
    return override_key(override).lstrip("/").split("@", 1)[0].split("/", 1)[0].split(".", 1)[0]


def _field_names(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


# --------------------------------------------------------------------------- what is refused, in words
def unknown_keys(node: DictConfig, prefix: str = "") -> Iterator[tuple[str, type]]:
    """(full key, schema of its parent) of every key under ``node`` that its typed schema has no field for.
    A node typed as a dict (a free-form field) takes any key."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return
    fields = {f.name for f in dataclasses.fields(schema)}
    for key, value in node.items_ex(resolve=False):
        full_key = f"{prefix}{key}"
        if key not in fields:
            yield full_key, schema
        elif isinstance(value, DictConfig):
            yield from unknown_keys(value, f"{full_key}.")


def no_such_key(override: str, full_key: str, schema: type, name: str = "") -> str:
    """``override``'s refusal: the node of ``full_key`` (typed ``schema``) of the root ``name`` has no such key;
    the closest one, or the node's keys when none is close."""
    parent, _, key = full_key.rpartition(".")
    known = _field_names(schema)
    if not parent and name:  # at the root a group's name is a key too (experiment=NAME)
        known += [g for g in config_groups(name) if g not in known]
    where = parent or "the config"
    match = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {_join(parent, match[0])}?" if match else f"its keys: {', '.join(known)}"
    return f"{override}: {where} ({schema.__name__}) has no key '{key}'; {hint}"


def describe_refusal(error: HydraException, overrides: Sequence[str], name: str = "") -> str:
    """One message for Hydra's refusal of an override: the key, group or value, and what it may be."""
    cause = error.__cause__
    if isinstance(error, OverrideParseException):
        return f"{error.override}: {error}"
    if isinstance(error, MissingConfigException) and error.missing_cfg_file and "/" in error.missing_cfg_file:
        group, _, option = error.missing_cfg_file.rpartition("/")
        return no_such_option(group, option, error.options or [], name)
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        full_key, schema = str(cause.full_key), cause.object_type
        override = _override_of(full_key, overrides)
        if dataclasses.is_dataclass(schema) and cause.key not in {f.name for f in dataclasses.fields(schema)}:
            return no_such_key(override, full_key, schema, name)
        said = _first_line(cause)
        if isinstance(cause, ValidationError) and dataclasses.is_dataclass(schema):
            kinds = {f.name: f.type for f in dataclasses.fields(schema)}
            if cause.key in kinds:
                said += f" ({full_key}: {kinds[cause.key]})"
                key, _, value = override.partition("=")
                if str(kinds[cause.key]).lower().startswith("list") and not value.startswith("["):
                    said += f"; a list is written in brackets: '{key}=[{value}]'"
        return f"{override}: {said}"
    in_file = _FILE_REFUSAL.match(str(error))
    if in_file:  # a config file's key or value (a user's experiment file): Hydra chains no cause
        where, key = f"{in_file['file']}.yaml", in_file["key"]
        schema = getattr(schema_module, in_file["type"], None)
        if in_file["kind"] == "ConfigKeyError" and dataclasses.is_dataclass(schema):
            return f"{where}: {no_such_key(key, key, schema, name)}"
        return f"{where}: {key}: {in_file['said']}"
    message = _first_line(error) if isinstance(cause, OmegaConfBaseException) else str(error)
    return f"{message}: {_first_line(cause)}" if cause is not None else message


# Hydra's refusal of a key or value set in a config file, e.g. "In 'experiment/mine': ConfigKeyError raised while
# composing config:\nKey 'x' not in 'TrainDataConfig'\n    full_key: data.x\n    reference_type=...\n
# object_type=TrainDataConfig".
_FILE_REFUSAL = re.compile(r"In '(?P<file>[^']+)': (?P<kind>\w+) raised while composing config:\n(?P<said>[^\n]*)\n"
                           r"\s*full_key: (?P<key>\S+)\n\s*reference_type=\S*\n\s*object_type=(?P<type>\w+)")


def renamed_group(override: str) -> str:
    """``data=films`` refused: the group's new name, with the same option."""
    old = override_key(override).lstrip("/")
    new, option = RENAMED_GROUPS[old], override.split("=", 1)[1].strip()
    return f"{override}: the group {old} is now named {new}: {new}={option} (options: {', '.join(group_options(new))})"


def no_such_option(group: str, option: str, options: Sequence[str], name: str = "") -> str:
    """``group=option`` refused: the command whose own option it is (an experiment of another command), else
    the closest option and every option (the schemas registered in the group for the config files to build
    on are left out: they are no choice)."""
    owners = [f"animegamer {c.verb}" for root, c in COMMANDS.items()
              if root != name and name in COMMANDS and option in group_options(group, root)]
    if owners:
        return (f"{group}={option}: {option} is not an option of animegamer {COMMANDS[name].verb} but of "
                f"{' and '.join(owners)}: give it there")
    store = ConfigStore.instance()
    stored = {Path(name).stem for name in store.list(group)} if store.get_type(group) is ObjectType.GROUP else set()
    choices = [o for o in options if o not in stored]
    match = difflib.get_close_matches(option, choices, n=1)
    hint = f"did you mean {group}={match[0]}? " if match else ""
    return f"{group}={option}: the group {group} has no option '{option}'; {hint}options: {', '.join(choices)}"


def config_groups(name: str) -> list[str]:
    """The config groups the root ``name`` chooses from (``trainer``, ``experiment``, ...), Hydra's own left out."""
    return list(_config_groups(name, str(config_dir())))


@functools.lru_cache(maxsize=None)
def _config_groups(name: str, folder: str) -> tuple[str, ...]:
    """:func:`config_groups` of the config folder ``folder`` (composed once per folder)."""
    with _initialized():
        cfg = compose(config_name=name, overrides=[search_path_override(name)], return_hydra_config=True)
    return tuple(sorted(g for g in cfg.hydra.runtime.choices if not g.startswith(HYDRA_GROUP)))


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def override_key(override: str) -> str:
    """``phase.lr`` of ``+phase.lr=1``, ``~phase.lr`` or ``phase.lr=[1,2]``."""
    bare = override.lstrip(DELETED)
    for prefix in ADDED:
        if bare.startswith(prefix):
            bare = bare[len(prefix):]
            break
    return bare.split("=", 1)[0].strip()


def _override_of(full_key: str, overrides: Sequence[str]) -> str:
    """The override that set ``full_key`` (or a key under it, or the node above it), else the key itself (a
    config file set it)."""
    bare = full_key.split("[", 1)[0]
    for override in reversed(overrides):
        key = override_key(override)
        if key == bare or bare.startswith(f"{key}.") or key.startswith(f"{bare}."):
            return override
    return full_key


# --------------------------------------------------------------------------- the commands
def group_options(group: str, name: str = "") -> list[str]:
    """The options of ``group`` that are config files of :func:`config_dir` or of the root ``name``'s own folder
    (the schemas the files build on are no choice)."""
    folders = [config_dir(), *([config_dir() / COMMANDS[name].folder] if name in COMMANDS else [])]
    return sorted({p.stem for folder in folders for p in (folder / group).glob(f"*{CONFIG_SUFFIX}")})


def command_help(config_name: str) -> str:
    """``--help`` of the command over the root config ``config_name``: its ``hydra/help`` template (how to call
    it, then its config groups with their options), every group listed with the files it offers."""
    with _initialized():
        cfg = compose(config_name=config_name, overrides=[search_path_override(config_name)], return_hydra_config=True)
    listed = [(g, group_options(g, config_name)) for g in config_groups(config_name)]
    groups = "\n".join(f"{g}: {', '.join(options)}" for g, options in listed if options)
    return cfg.hydra.help.template.replace(HELP_GROUPS, groups) + "\n"


def _hydra_flag(args) -> bool:
    """A Hydra option that changes what runs (--help, --cfg, --info, --multirun, ...): @hydra.main runs it."""
    return bool(args.help or args.hydra_help or args.cfg or args.info or args.package or args.multirun
                or args.shell_completion or args.experimental_rerun or args.config_path or args.config_name
                or args.config_dir)


def _sets_hydra(overrides: Sequence[str]) -> bool:
    return any(override_key(o).split(".", 1)[0].split("/", 1)[0] == HYDRA_NODE for o in overrides)


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """Each job's overrides of a ``--multirun`` command line, as Hydra's basic sweeper splits them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the sweeper the configs use

    with _initialized():
        try:
            parsed = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader()).parse_overrides(
                list(overrides))
            return [list(job) for job in BasicSweeper.split_arguments(parsed, None)[0]]
        except HydraException as error:
            raise OverrideError(describe_refusal(error, overrides)) from error


def quoted(value: str, raw_suffix: str = "") -> str:
    """``value`` (a path, say) as a quoted string of Hydra's override grammar that reads back exactly: a
    quote, and the backslashes before a quote or the closing one, escaped with a backslash; ``${`` escaped
    so that OmegaConf does not read it as an interpolation. ``raw_suffix`` follows inside the quotes as
    written (``/${phase.name}``: an interpolation kept)."""
    text = re.sub(r"(\\*)(\$\{)", lambda m: m.group(1) * 2 + "\\${", value)
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    if not raw_suffix:
        text = re.sub(r"(\\*)$", lambda m: m.group(1) * 2, text)
    return f"'{text}{raw_suffix}'"


def literal(value: str) -> str:
    """``value`` (a resolved path, say) as a config node's text that OmegaConf reads back as it is: ``${``
    escaped, so that a folder named ``run ${x}`` is not read as an interpolation when set into a config."""
    return re.sub(r"(\\*)(\$\{)", lambda m: m.group(1) * 2 + "\\${", value)


def path_override(key: str, path: str | os.PathLike) -> str:
    """``key=<path>``, the path quoted (:func:`quoted`): any folder name reaches the stage as it is."""
    return f"{key}={quoted(str(path))}"


@dataclasses.dataclass(frozen=True)
class CommandBody:
    """The function ``name`` of the module ``module``, imported when first called: see :func:`command_body`."""

    module: str
    name: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.name)(*args, **kwargs)


def command_body(module: str, name: str) -> CommandBody:
    """A command's body (or a heavy part of it, e.g. a pre-flight that loads torch), named at the top of the
    command's module: ``module`` is imported when the command calls it, i.e. once :func:`run_command` has
    checked the command line, so a refused override never loads Lightning or the networks.
    tests/test_import_rules.py reads each such literal name as an import of ``module``."""
    return CommandBody(module, name)


def run_command(config_name: str, task: Callable[[DictConfig], T], hydra_main: Callable[[], None]) -> T | None:
    """The body of a command over the root config ``config_name``: the config of the command line
    (``sys.argv``) composed by :func:`compose_config` and handed to ``task``. A refused key, group or value
    (every job of a ``--multirun`` sweep checked), or a refusal of ``task``'s own checks, is one message
    and exit code 2, before anything is written. Hydra's own options (``--help``, ``--cfg job``,
    ``--multirun``, ...) and overrides of Hydra's settings (``hydra.*``) go on to ``hydra_main`` (the
    command's ``@hydra.main``) once checked; under ``--multirun`` Hydra writes its sweep folder before
    each job's own checks."""
    return exit_on_user_error(_run_command)(config_name, task, hydra_main, sys.argv[1:])


def _run_command(config_name: str, task: Callable[[DictConfig], T], hydra_main: Callable[[], None],
                 argv: list[str]) -> T | None:
    from hydra._internal.utils import get_args_parser  # @hydra.main's own command line

    register_configs()  # the schemas, for Hydra's composition too
    args = get_args_parser().parse_args(argv)
    if args.config_path or args.config_name or args.config_dir or args.experimental_rerun or args.shell_completion:
        return hydra_main()  # another config root or search path: Hydra's to compose
    if args.help:  # the groups a user chooses from, not the schemas registered for the files to build on
        sys.stdout.write(command_help(config_name))
        return None
    overrides, given = _without_search_path(args.overrides)
    hydra_settings = _sets_hydra(overrides)
    if args.multirun:  # each job checked (another sweeper's syntax, set in hydra/sweeper=, is Hydra's to read)
        jobs = [] if hydra_settings else sweep_jobs(overrides)
    else:
        jobs = [overrides]
    composed = [compose_config(config_name, job, given) for job in jobs]
    if _hydra_flag(args) or hydra_settings:  # Hydra composes again: with the command's search path too
        options = [a for a in argv if a not in set(args.overrides)]
        sys.argv = [sys.argv[0], *options, *overrides, search_path_override(config_name, given)]
        return hydra_main()
    return task(composed[0])
