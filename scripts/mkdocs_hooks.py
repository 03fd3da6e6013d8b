"""The configuration reference page, ``docs/configuration-reference.md``, written from the typed schema.

Every key of the config tree is a field of a dataclass in ``animegamer.config.schema``; each command has
its own root (``schema.COMMANDS``). This lists each command's keys, then walks every root's nodes and
writes one table per node with each key's type, default, the commands that read it and the comment or
docstring that explains it in the schema. The page is kept in the repository, so that it reads on any
checkout, and rewritten from the schema by

    python scripts/mkdocs_hooks.py

``mkdocs.yml`` names this file under ``hooks``: the strict docs build fails when the page differs from what
the schema gives, as does a test, so the page cannot drift from the code.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib.resources
import inspect
import io
import logging
import tokenize
import typing
from pathlib import Path

from omegaconf import MISSING

PAGE = "configuration-reference.md"

logger = logging.getLogger("mkdocs.hooks.config_reference")

INTRO = """# Configuration reference

Each command (`animegamer train`, `animegamer eval`, `animegamer pipeline`) composes its own root config
and reads only its own keys: a key another command reads is refused naming that command. This page lists
every config group with its options (each command's experiments apart), each command's keys, then every
key with its type, its default in the schema, the commands that read it and what it means. It is
written from the config files and the dataclasses in `animegamer.config.schema` (`python
scripts/mkdocs_hooks.py`; the docs build and the tests fail when it is out of date): a group's option
(a model preset, a phase, a trainer, an experiment) overrides the schema's defaults. How the tree is
composed and checked: [Configuration](configuration.md).

"""


def configs_dir() -> Path:
    """The config folder: package data of ``animegamer`` where it is installed there, else the repository's."""
    packaged = importlib.resources.files("animegamer") / "configs"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[1] / "configs"


def _yaml_description(path: Path) -> str:
    """The first sentence of a config file's leading comment (Hydra's ``# @package`` line left out)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if not text.startswith("@package"):
            lines.append(text)
    text = " ".join(" ".join(lines).split())
    return text.split(". ", 1)[0].rstrip(".") + "." if text else ""


def _group_table(title: str, folder: Path) -> list[str]:
    out = [title, "", "| option | what it is |", "|---|---|"]
    out += [f"| `{f.stem}` | {_cell(_yaml_description(f))} |" for f in sorted(folder.glob("*.yaml"))]
    return out + [""]


def render_groups(root: Path) -> str:
    """One table per config group: each option (file name) with its leading comment; each command's own
    experiments (``<folder>/experiment/``) in a table of their own."""
    from animegamer.config.schema import COMMANDS

    folders = {c.folder for c in COMMANDS.values()}
    out = ["## Config groups", "",
           "Roots (each command's own config): " +
           ", ".join(f"`{p.stem}`" for p in sorted(root.glob("*.yaml"))) + ". "
           "Choose a group's option with `GROUP=OPTION` on the command line (e.g. `trainer=fsdp`).", ""]
    for group in sorted(p for p in root.iterdir() if p.is_dir() and any(p.glob("*.yaml"))):
        if group.name != "hydra" and group.name not in folders:
            readers = _readers(group.name)
            out += _group_table(f"### `{group.name}`" + (f" (read by {readers})" if readers else ""), group)
    for name, command in COMMANDS.items():
        experiments = root / command.folder / "experiment"
        if any(experiments.glob("*.yaml")):
            out += _group_table(f"### `experiment` of `animegamer {command.verb}` (`{command.folder}/experiment/`)",
                                experiments)
    return "\n".join(out) + "\n"


def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class body: the lines right above it and the one at its end."""
    source = inspect.getsource(cls)
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    result = {}
    [class_node] = ast.parse(source).body
    for node in class_node.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above = []
        line = node.lineno - 1
        while line in comments and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        trailing = [comments[n] for n in range(node.lineno, node.end_lineno + 1)
                    if n in comments and not lines[n - 1].lstrip().startswith("#")]
        result[node.target.id] = " ".join(above + trailing)
    return result


def _docstring(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    # a dataclass without a docstring gets its generated signature as __doc__
    return "" if doc.startswith(cls.__name__ + "(") else " ".join(doc.split())


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return MISSING


def _type_name(annotation) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else repr(annotation)
    return text.replace("typing.", "")


def _cell(text: str) -> str:
    """Text safe inside a table cell: no column breaks, and no angle brackets read as HTML tags."""
    return (text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " "))


def _value(value) -> str:
    if value is MISSING:
        return "(required)"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else "`''`"
    return f"`{value}`"


def _readers(path: str) -> str:
    """The commands whose root has the node or key ``path`` (its first part decides: a node is read whole)."""
    from animegamer.config.schema import COMMANDS

    top = path.split(".", 1)[0]
    return ", ".join(f"`{c.verb}`" for c in COMMANDS.values() if top in {f.name for f in dataclasses.fields(c.schema)})


def _node_section(path: str, cls: type, skip: frozenset[str] = frozenset()) -> tuple[list[str], list[tuple[str, type]]]:
    """Markdown for one node (its leaf keys) and the nested nodes to describe after it."""
    hints = typing.get_type_hints(cls)
    comments = _field_comments_all(cls)
    rows, children = [], []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        key = f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(hints[f.name]):
            children.append((key, hints[f.name]))
            continue
        rows.append(f"| `{key}` | {_cell(_type_name(hints[f.name]))} | {_cell(_value(_default(f)))} | "
                    f"{_readers(key)} | {_cell(comments.get(f.name, ''))} |")
    lines = []
    doc = _docstring(cls)
    if doc:
        lines += [doc, ""]
    if rows:
        lines += ["| key | type | default | read by | meaning |", "|---|---|---|---|---|", *rows, ""]
    return lines, children


def _field_comments_all(cls: type) -> dict[str, str]:
    """Comments of a class's own fields and of the fields it inherits from dataclass bases."""
    comments: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base) and base is not object:
            comments.update(_field_comments(base))
    return comments


def _walk(path: str, cls: type, out: list[str], level: int) -> None:
    lines, children = _node_section(path, cls)
    out += [f"{'#' * level} `{path}`", "", *lines]
    for child_path, child in children:
        _walk(child_path, child, out, min(level + 1, 4))


def render_commands() -> str:
    """Each command's root config and its keys (a node is read with every key under it)."""
    from animegamer.config.schema import COMMANDS

    out = ["## Each command's keys", "", "| command | root config | schema | keys |", "|---|---|---|---|"]
    for name, command in COMMANDS.items():
        hints = typing.get_type_hints(command.schema)
        keys = ", ".join(f"`{f.name}.*`" if dataclasses.is_dataclass(hints[f.name]) else f"`{f.name}`"
                         for f in dataclasses.fields(command.schema))
        out.append(f"| `animegamer {command.verb}` | `{name}.yaml` | `{command.schema.__name__}` | {keys} |")
    return "\n".join(out) + "\n\n"


def _roots_union() -> tuple[list[tuple[str, object, dataclasses.Field]], dict[str, str]]:
    """One dataclass with every command's top-level keys, each described once, in the order the roots list
    them (their comments read from the schema each comes from)."""
    from animegamer.config.schema import COMMANDS

    fields, comments, seen = [], {}, set()
    for command in COMMANDS.values():
        hints = typing.get_type_hints(command.schema)
        own = _field_comments_all(command.schema)
        for f in dataclasses.fields(command.schema):
            if f.name not in seen:
                seen.add(f.name)
                fields.append((f.name, hints[f.name], f))
                comments[f.name] = own.get(f.name, "")
    return fields, comments


def render_reference() -> str:
    """The whole page: the groups, each command's keys, the roots' own keys, then each node of the tree in
    schema order."""
    from animegamer.config import schema

    out = [INTRO, render_groups(configs_dir()), render_commands()]
    fields, comments = _roots_union()
    rows = [f"| `{name}` | {_cell(_type_name(kind))} | {_cell(_value(_default(f)))} | {_readers(name)} | "
            f"{_cell(comments[name])} |" for name, kind, f in fields if not dataclasses.is_dataclass(kind)]
    out += ["## Top-level keys", "", "| key | type | default | read by | meaning |", "|---|---|---|---|---|", *rows, ""]
    for name, kind, _ in fields:
        if dataclasses.is_dataclass(kind) and name != "phase":
            _walk(name, kind, out, 2)
    # phase/ has one schema per phase; the shared fields first, then each phase's own.
    base = schema.PhaseConfig
    lines, _ = _node_section("phase", base)
    out += ["## `phase`", "", *lines]
    for name, cls in schema.PHASE_SCHEMAS.items():
        own = frozenset(f.name for f in dataclasses.fields(base))
        lines, _ = _node_section("phase", cls, skip=own)
        out += [f"### `phase` with `{cls.__name__}` (`{name}`)", "", *lines]
    return "\n".join(out).rstrip() + "\n"


def reference_path(docs_dir: str | Path | None = None) -> Path:
    """Where the page lives: ``docs/`` of the repository, or the docs folder the build names."""
    return Path(docs_dir or Path(__file__).resolve().parents[1] / "docs") / PAGE


def on_files(files, config):
    """The strict build stops (a warning) when the committed page differs from the schema's."""
    path = reference_path(config["docs_dir"])
    if not path.is_file() or path.read_text() != render_reference():
        logger.warning("%s differs from animegamer.config.schema: run python scripts/mkdocs_hooks.py", path)
    return files


if __name__ == "__main__":
    target = reference_path()
    target.write_text(render_reference())
    print(f"wrote {target}")
