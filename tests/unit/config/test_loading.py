"""Composition of every YAML in conf/, typed loading, freezing, dumping, and the generated config reference."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from hybridrl.config import (
    FrozenConfigError,
    TrainConfig,
    config_dir,
    config_to_yaml,
    dump_config,
    load_config,
    to_schema,
)
from hybridrl.config.docs import iter_fields, render_markdown
from hybridrl.config.dpo_schema import DPOConfig
from hybridrl.config.rm_schema import RMConfig
from hybridrl.config.sft_schema import SFTConfig

from shipped_configs import DATA_DIRS, GROUP_OVERRIDES, PRIMARY_OVERRIDES, group_options

CONF = config_dir()
REPO = Path(__file__).resolve().parents[3]


def test_conf_dir_is_at_the_top_of_the_checkout():
    assert CONF == REPO / "conf" and (CONF / "ppo_trainer.yaml").is_file()
    assert {"algorithm", "rollout", "data", "trainer"} <= {group for group, _ in group_options(CONF)}


@pytest.mark.parametrize(("group", "option"), group_options(CONF), ids=lambda v: str(v))
def test_every_group_option_composes_and_validates(group, option):
    config = load_config([f"{group}={option}", *GROUP_OVERRIDES.get((group, option), [])], check_paths=False)
    assert isinstance(config, TrainConfig)
    assert config.is_frozen


@pytest.mark.parametrize("config_file", sorted(CONF.glob("*.yaml")), ids=lambda p: p.name)
def test_every_primary_config_composes(config_file):
    config = load_config(PRIMARY_OVERRIDES.get(config_file.stem, []), config_file.stem, check_paths=False)
    assert isinstance(config, (TrainConfig, SFTConfig, RMConfig, DPOConfig)) and config.is_frozen


def test_presets_select_what_they_say():
    gae = load_config(["algorithm=gae"], check_paths=False)
    assert gae.algorithm.adv_estimator == "gae" and gae.algorithm.lam == 0.95 and gae.algorithm.use_kl_in_reward
    drgrpo = load_config(["algorithm=drgrpo"], check_paths=False)
    assert drgrpo.algorithm.norm_adv_by_std_in_grpo is False
    assert drgrpo.actor.loss_agg_mode == "seq-mean-token-sum-norm"


def test_overrides_are_typed():
    config = load_config(["rollout.n=8", "actor.optim.lr=3e-6", "trainer.logger=[console]"], check_paths=False)
    assert config.rollout.n == 8 and isinstance(config.rollout.n, int)
    assert config.actor.optim.lr == pytest.approx(3e-6)
    assert tuple(config.trainer.logger) == ("console",)


def test_interpolation_is_resolved():
    config = load_config(["trainer.project_name=p", "trainer.experiment_name=e"], check_paths=False)
    assert config.trainer.default_local_dir == "runs/p/e"


def test_frozen_after_load():
    config = load_config([], check_paths=False)
    with pytest.raises(FrozenConfigError, match="dataclasses.replace"):
        config.rollout.n = 16
    with pytest.raises(FrozenConfigError):
        config.trainer.ray.address = "auto"
    changed = dataclasses.replace(config.rollout, n=16)
    assert changed.n == 16 and config.rollout.n == 4


def test_python_api_builds_and_validates_without_yaml():
    from hybridrl.config import validate_config

    config = TrainConfig()
    config.data.synthetic_task = "arithmetic"
    config.data.train_batch_size = 8
    config.rollout.n = 2
    config.actor.ppo_mini_batch_size = 4
    config.actor.ppo_micro_batch_size_per_gpu = 8
    validate_config(config, check_paths=False)  # 4 prompts × 2 = 8 sequences on 1 rank = 1 × 8


def test_dump_round_trips_and_redacts(tmp_path):
    config = load_config(["+extra.wandb_api_key=sk-secret", "+extra.note=keep"], check_paths=False)
    path = dump_config(config, tmp_path / "run")
    text = path.read_text()
    assert "sk-secret" not in text and "***" in text and "keep" in text
    reloaded = to_schema(yaml.safe_load(text), TrainConfig).freeze()
    assert reloaded.actor == load_config([], check_paths=False).actor


def test_every_field_is_documented_and_the_reference_is_current():
    undocumented = [key for root in (TrainConfig, SFTConfig, RMConfig) for key, _, doc, _ in iter_fields(root) if not doc]
    assert undocumented == []
    reference = REPO / "docs" / "config.md"
    assert reference.read_text() == render_markdown(), "docs/config.md is stale: run `make docs`"


def test_config_yaml_lists_every_section():
    text = config_to_yaml(load_config([], check_paths=False))
    tree = yaml.safe_load(text)
    assert set(tree) == {f.name for f in dataclasses.fields(TrainConfig)}


def test_recipe_configs_are_not_forgotten():
    """Every YAML under conf/ is reached by one of the composition tests above."""
    covered = {Path(CONF / group / f"{option}.yaml") for group, option in group_options(CONF)}
    covered |= set(CONF.glob("*.yaml")) | {path for name in DATA_DIRS for path in (CONF / name).glob("*.yaml")}
    assert covered == set(CONF.rglob("*.yaml"))


def test_free_form_dict_fields_accept_new_keys_from_the_command_line():
    config = load_config(["data.synthetic_task_kwargs={max_digits: 1, operators: '+'}", "extra.note=kept",
                          "trainer.ray.worker_env.MY_FLAG=1"], check_paths=False)
    assert dict(config.data.synthetic_task_kwargs) == {"max_digits": 1, "operators": "+"}
    assert config.extra["note"] == "kept" and config.trainer.ray.worker_env["MY_FLAG"] == "1"


def test_recipe_scripts_name_existing_configs():
    import re

    scripts = sorted((REPO / "recipes").glob("*.sh"))
    assert scripts
    for script in scripts:
        for name in re.findall(r"--config-name\s+(\S+)", script.read_text()):
            assert (CONF / f"{name}.yaml").is_file(), f"{script.name} names a missing config {name}"


def test_sft_fsdp_settings_reach_the_policy_worker():
    from hybridrl.config import ConfigError
    from hybridrl.trainers.sft_trainer import worker_config

    sft = load_config(["data.synthetic_task=arithmetic", "fsdp.grad_sync=micro_batch"], "sft_trainer",
                      check_paths=False)
    assert worker_config(sft).actor.fsdp.grad_sync == "micro_batch"
    with pytest.raises(ConfigError, match="fsdp.grad_sync"):
        load_config(["data.synthetic_task=arithmetic", "fsdp.grad_sync=sometimes"], "sft_trainer", check_paths=False)
