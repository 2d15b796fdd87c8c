"""``pip install hybridrl`` works: the wheel built from this tree carries the configs (the tree's ``conf/`` as the
package's ``hybridrl/conf/``), and from a fresh venv outside the source tree every shipped config and group option
composes, ``hybridrl config`` prints one, and a 1-step ``hybridrl train`` runs.

The fresh venv gets the wheel alone (``--no-deps``, no index: nothing is downloaded); its dependencies come from the test
venv through a path entry added *after* the install (the test venv's own ``.pth`` files, the editable hybridrl among
them, are not processed there), so the ``hybridrl`` that runs is the wheel's, which the test checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from shipped_configs import every_composition

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of the tree (the build writes ``build/`` and ``*.egg-info`` where it runs)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    for tree in ("hybridrl", "conf"):
        shutil.copytree(REPO / tree, source / tree, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out),
          str(source)])
    (built,) = out.glob("hybridrl-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index",
          str(wheel)])
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    (purelib / "_test_venv_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_the_wheel_carries_every_config_of_the_tree(wheel):
    """The tree's ``conf/`` goes into the wheel as the package's ``hybridrl/conf/``."""
    names = set(zipfile.ZipFile(wheel).namelist())
    tree = {f"hybridrl/{path.relative_to(REPO).as_posix()}" for path in (REPO / "conf").rglob("*.yaml")}
    assert len(tree) > 20 and tree <= names, sorted(tree - names)


# test-long (CI runs it): 41 s in the parallel suite, whose 15 minutes it outgrew on a slower VM (2026-12-06)
@pytest.mark.long
def test_installed_wheel_composes_configs_and_trains_a_step(fresh_venv, tmp_path):
    from hybridrl.utils.tiny_model import save_tiny_model

    workdir = tmp_path / "elsewhere"      # not the source tree: nothing may be found through the working directory
    workdir.mkdir()
    hybridrl = str(fresh_venv / "bin" / "hybridrl")
    where = _run([str(fresh_venv / "bin" / "python"), "-c", "import hybridrl; print(hybridrl.__file__)"], workdir)
    assert Path(where.strip()).is_relative_to(fresh_venv), where

    printed = _run([hybridrl, "config", "--no-check-paths", "algorithm=rloo"], workdir)
    assert "adv_estimator: rloo" in printed and "# actor:" in printed
    compositions = every_composition(REPO / "conf")
    composed = _run([str(fresh_venv / "bin" / "python"), "-c", COMPOSE_EVERY_CONFIG, json.dumps(compositions)], workdir)
    assert composed.split() == [name for name, _ in compositions], composed

    model = save_tiny_model(tmp_path / "tiny")
    _run([hybridrl, "train", f"model.path={model}", "trainer.total_training_steps=1", "trainer.test_freq=-1",
          "trainer.val_before_train=false", "trainer.ray.num_cpus=4", "trainer.default_local_dir=run"], workdir)
    assert (workdir / "run" / "config.yaml").is_file() and (workdir / "run" / "metrics.jsonl").is_file()


# Run in the wheel's venv: compose each (config name, overrides) with the configs the wheel carries.
COMPOSE_EVERY_CONFIG = """
import json, sys
from hybridrl.config import config_dir, load_config
assert "site-packages" in str(config_dir()), config_dir()
for name, overrides in json.loads(sys.argv[1]):
    load_config(overrides, name, check_paths=False)
    print(name)
"""


def _run(command: list[str], cwd: Path | None = None) -> str:
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command[:3]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout

