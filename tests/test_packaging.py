"""setup.cfg lists its packages explicitly (two source roots): every package folder must be listed."""
from __future__ import annotations

import configparser

from conftest import REPO


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
