"""The wheel's package list (``pyproject.toml`` names the packages, since ``conf/`` is mapped into the package) holds
every package of ``hybridrl/``: a new subpackage left off the list would be missing from ``pip install hybridrl``."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

REPO = Path(__file__).resolve().parents[2]


def test_pyproject_lists_every_package_and_maps_conf_into_the_package():
    setuptools_table = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set(find_packages(str(REPO), include=["hybridrl", "hybridrl.*"]))
    assert len(found) > 10
    assert set(setuptools_table["packages"]) == found | {"hybridrl.conf"}, \
        sorted(found.symmetric_difference(setuptools_table["packages"]) - {"hybridrl.conf"})
    assert setuptools_table["package-dir"] == {"hybridrl.conf": "conf"}
    assert (REPO / "conf" / "ppo_trainer.yaml").is_file() and not (REPO / "hybridrl" / "conf").exists()
