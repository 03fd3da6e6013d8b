"""setup.cfg lists its packages explicitly (two source roots): every package folder must be listed."""
from __future__ import annotations

import configparser
from pathlib import Path

from conftest import REPO

SOURCE_FILES = ("setup.cfg", "pyproject.toml", "README.md", "src", "data_pipeline")  # what a wheel is built from


def test_every_package_is_listed_in_setup_cfg():
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    listed = set(parser["options"]["packages"].split())
    on_disk = {".".join(p.parent.relative_to(REPO / "src").parts) for p in (REPO / "src").rglob("__init__.py")}
    on_disk |= {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "data_pipeline").rglob("__init__.py")}
    # folders of package data alone (templates): listed so that setuptools ships them without warning
    data_only = {name for name in parser["options.package_data"] if name not in on_disk}
    assert all((REPO / "src" / name.replace(".", "/")).is_dir() for name in data_only), data_only
    assert listed == on_disk | data_only


def test_a_built_wheel_ships_every_config_file(tmp_path):
    """The configs are package data: a wheel (what a non-editable `pip install .` installs) holds each file."""
    import shutil
    import subprocess
    import sys
    import zipfile

    from animegamer.config.compose import config_dir

    source = tmp_path / "source"  # a copy: setuptools' build folder stays out of the checkout, and no stale one helps
    source.mkdir()
    for name in SOURCE_FILES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("animegamer-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("animegamer/configs/")}
    expected = {f"animegamer/configs/{p.relative_to(config_dir()).as_posix()}"
                for p in config_dir().rglob("*.yaml")}
    assert len(expected) > 40 and shipped == expected


def test_the_configs_are_found_inside_the_package_unless_the_environment_names_a_folder(monkeypatch, tmp_path):
    import animegamer
    from animegamer.config.compose import CONFIG_DIR_ENV, config_dir

    monkeypatch.delenv(CONFIG_DIR_ENV, raising=False)
    assert config_dir() == Path(animegamer.__file__).resolve().parent / "configs"
    assert (config_dir() / "train.yaml").is_file()
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path))
    assert config_dir() == tmp_path
