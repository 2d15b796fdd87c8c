"""The wheel's package list (``pyproject.toml`` names the packages, since ``conf/`` is mapped into the package) holds
every package of ``hybridrl/`` and every folder of ``conf/``: one left off the list would be missing from
``pip install hybridrl`` (or warned about at every install)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

REPO = Path(__file__).resolve().parents[2]


def test_pyproject_lists_every_package_and_maps_conf_into_the_package():
    setuptools_table = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set(find_packages(str(REPO), include=["hybridrl", "hybridrl.*"]))
    conf_folders = {f"hybridrl.conf.{folder.name}" for folder in (REPO / "conf").iterdir() if folder.is_dir()}
    assert len(found) > 10 and len(conf_folders) >= 4
    expected = found | {"hybridrl.conf"} | conf_folders
    assert set(setuptools_table["packages"]) == expected, sorted(expected.symmetric_difference(
        setuptools_table["packages"]))
    assert setuptools_table["package-dir"] == {"hybridrl.conf": "conf"}
    assert (REPO / "conf" / "ppo_trainer.yaml").is_file() and not (REPO / "hybridrl" / "conf").exists()
