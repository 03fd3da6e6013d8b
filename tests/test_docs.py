"""The documentation: the README stays a landing page whose quick start is what CI runs, its links
resolve, the configuration reference lists every key of the schema with the schema's own comments, the
site builds with ``mkdocs build --strict``, and the text speaks of the project and its users only."""
from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from animegamer.config import schema

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 250
QUICK_START_COMMANDS = 2
# A relative markdown link or image: [text](target) where target is no URL and no in-page anchor.
LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")
# Text about how the project was worked on rather than about the project: tracker numbers, one lent
# machine's calls, time and transfer limits.
OFF_TOPIC = [re.compile(p, re.IGNORECASE) for p in (
    r"\bissues?\s+#?\d+", r"\bthe issue's\b", r"\(\w+ issue\)", r"\bdevice (call|time|budget|session)s?\b",
    r"\blent\b", r"\bcarry\s*\[", r"\bcall's 64 MiB\b", r"\bsessions? of device\b")]


def _hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _leaf_keys(path: str, cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        key = f"{path}.{f.name}" if path else f.name
        keys += _leaf_keys(key, hints[f.name]) if dataclasses.is_dataclass(hints[f.name]) else [key]
    return keys


def _first_bash_block_after(text: str, heading: str) -> list[str]:
    after = text[text.index(heading):]
    block = re.search(r"```bash\n(.*?)\n```", after, re.DOTALL).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_the_readme_is_a_landing_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
    assert lines[0] == "# AnimeGamer training framework"


def test_the_quick_start_is_two_commands_and_the_second_is_what_ci_runs():
    commands = _first_bash_block_after(README.read_text(), "## Quick start")
    assert len(commands) == QUICK_START_COMMANDS
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    ci_commands = {part.strip() for line in ci_lines for part in line.split(" && ")}
    steps = [part.strip() for part in commands[1].split(" && ")]
    # every step of command 2 is one CI runs, and its last, the test run, is CI's last command
    assert set(steps) <= ci_commands
    assert steps[-1] == ci_lines[-1].split(" && ")[-1].strip()
    # the getting-started page shows the same two commands
    assert _first_bash_block_after((ROOT / "docs" / "getting-started.md").read_text(), "## Quick start") == commands


def test_every_relative_link_of_the_readme_resolves():
    targets = LINK.findall(README.read_text())
    assert len(targets) >= 10
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert missing == []


def test_the_configuration_reference_lists_every_key_with_its_comment():
    page = _hooks().render_reference()
    page = page[page.index("## Top-level keys"):]  # the config groups' option tables come before
    rows = re.findall(r"^\| `([^`]+)` \|", page, re.MULTILINE)
    # every command's keys, each once (a node several commands read is described once)
    expected = sorted({k for command in schema.COMMANDS.values() for k in _leaf_keys("", command.schema)
                       if not k.startswith("phase.")})
    base = {f.name for f in dataclasses.fields(schema.PhaseConfig)}
    expected += [f"phase.{n}" for n in base]
    for cls in schema.PHASE_SCHEMAS.values():
        expected += [f"phase.{f.name}" for f in dataclasses.fields(cls) if f.name not in base]
    assert sorted(rows) == sorted(expected)
    assert len(rows) == len(expected) > 200
    # the comment above a field, the comment at its end and an inherited field's comment all reach its row
    row = {k: line for line in page.splitlines() for k in re.findall(r"^\| `([^`]+)` \|", line)}
    assert "bounds the probe" in row["pipeline.caption.probe_timeout_s"]
    assert "GET {url}/models" in row["pipeline.caption.probe"]
    assert "`20`" in row["pipeline.clips.qp"] and "Constant quantiser" in row["pipeline.clips.qp"]
    assert "per device" in row["phase.batch_size"]
    # a path in angle brackets is shown, not swallowed as an HTML tag
    assert "&lt;output_dir&gt;" in row["resume_with_changes"]


def test_the_configuration_reference_page_is_the_schemas():
    page = ROOT / "docs" / "configuration-reference.md"
    assert page.read_text() == _hooks().render_reference(), "rewrite it: python scripts/mkdocs_hooks.py"


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1",
                                                                           "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    reference = (site / "configuration-reference" / "index.html").read_text()
    assert "pipeline.caption.probe_timeout_s" in reference
    assert not (site / "plans").exists()


def test_the_text_speaks_of_the_project_only():
    files = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in files
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if any(p.search(line) for p in OFF_TOPIC)]
    assert found == []


def test_the_configuration_reference_lists_every_config_option():
    hooks = _hooks()
    root = hooks.configs_dir()
    page = hooks.render_reference()
    options = sorted(f"{p.parent.name}/{p.stem}" for p in root.glob("*/*.yaml") if p.parent.name != "hydra")
    options += [f"experiment/{p.stem}" for c in schema.COMMANDS.values()
                for p in (root / c.folder).glob("experiment/*.yaml")]
    options.sort()
    listed = []
    for group, body in re.findall(r"^### `([^`]+)`[^\n]*\n\n\| option \| what it is \|\n\|---\|---\|\n((?:\|.*\n)+)",
                                  page, re.MULTILINE):
        listed += [f"{group}/{name}" for name in re.findall(r"^\| `([^`]+)` \|", body, re.MULTILINE)]
    assert sorted(listed) == options and len(options) > 40
    # each option's first sentence of its leading comment, without Hydra's package line
    assert "| `gpu` | One GPU, bf16 autocast with float32 master weights. |" in page
    assert "@package" not in page
