"""The shipped configs as the tests compose them: every primary config of ``conf/`` and every option of its groups,
each with the overrides a user must add (a data source, a required key). ``tests/unit/config/test_loading.py``
composes them in the checkout, ``tests/e2e/test_wheel.py`` in a venv that has only the wheel."""

from __future__ import annotations

from pathlib import Path

# Folders of conf/ that hold files a config names (not Hydra config groups).
DATA_DIRS = {"tool_configs"}
# Group options that leave a required key to the user get it here.
GROUP_OVERRIDES = {("data", "files"): ["data.train_files=[prompts.parquet]"]}
# Primary configs that need a data source from the user get one here.
PRIMARY_OVERRIDES = {"sft_trainer": ["data.synthetic_task=arithmetic"], "rm_trainer": ["data.synthetic_task=arithmetic"],
                     "dpo_trainer": ["data.synthetic_task=arithmetic"]}


def group_options(conf: Path) -> list[tuple[str, str]]:
    """(group, option) for every option file of a config group under ``conf``."""
    return sorted((path.parent.name, path.stem) for path in conf.glob("*/*.yaml") if path.parent.name not in DATA_DIRS)


def every_composition(conf: Path) -> list[tuple[str, list[str]]]:
    """(config name, overrides) composing every shipped YAML once: the primary configs, then each group option on
    the default root."""
    primaries = [(path.stem, PRIMARY_OVERRIDES.get(path.stem, [])) for path in sorted(conf.glob("*.yaml"))]
    options = [("ppo_trainer", [f"{group}={option}", *GROUP_OVERRIDES.get((group, option), [])])
               for group, option in group_options(conf)]
    return primaries + options
