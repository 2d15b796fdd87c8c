"""verl's command lines in hybridrl: seven real verl launch scripts' overrides (``tests/data/verl_scripts``) load with
only their paths changed; every rule of the key table points at a real key; refusals, suggestions, conflicts, verl's
defaults and bare-string lists behave as documented; the generated table is current."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridrl.config import ConfigError, TrainConfig, load_config
from hybridrl.config.verl_keys import RULES, VERL_DEFAULTS, Moved, NoEffect, Unsupported
from hybridrl.config.verl_layout import _resolves, leaf_keys, translate_overrides, verl_table_markdown

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = REPO / "tests" / "data" / "verl_scripts"


def script_overrides(name: str, *, tensor_parallel: int | None = None) -> list[str]:
    """A verl script's overrides with the paths changed (and ``tensor_parallel``, if given, as the rollout's TP)."""
    overrides = []
    for line in (SCRIPTS / f"{name}.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        value = value.replace("/root/", "/")  # the paths: /root/models/... -> /models/..., /root/data -> /data
        if key.endswith("model.path"):
            value = "/models/tiny"
        elif key.endswith("tensor_model_parallel_size") and tensor_parallel is not None:
            value = str(tensor_parallel)
        overrides.append(f"{key}={value}")
    return overrides


def load(overrides: list[str]) -> TrainConfig:
    return load_config(overrides, check_paths=False)


def problems_of(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load(overrides)
    return str(caught.value)


# ------------------------------------------------------------------------------------------------ the six scripts
def test_grpo_script():
    config = load(script_overrides("grpo"))
    assert config.algorithm.adv_estimator == "grpo" and config.rollout.n == 5 and config.rollout.name == "vllm"
    assert config.actor.optim.lr == 1e-6 and config.actor.ppo_mini_batch_size == 256
    assert config.actor.ppo_micro_batch_size_per_gpu == 40 and config.actor.log_prob_micro_batch_size_per_gpu == 40
    assert config.actor.use_kl_loss and config.actor.kl_loss_type == "low_var_kl"
    assert config.ref.param_offload and not config.actor.fsdp.param_offload
    assert config.trainer.logger == ("console", "wandb") and config.trainer.n_gpus_per_node == 8
    assert config.data.train_files == ("/data/gsm8k/train.parquet",) and config.data.synthetic_task is None
    assert config.data.max_response_length == 1024 and config.trainer.total_epochs == 15


def test_ppo_script_with_a_critic_gets_verls_critic_defaults():
    config = load(script_overrides("ppo_critic"))
    assert config.algorithm.adv_estimator == "gae" and config.rollout.n == 1  # verl's default n
    assert config.critic.model_path == "/models/tiny" and config.critic.optim.lr == 1e-5
    assert config.critic.ppo_mini_batch_size == config.actor.ppo_mini_batch_size == 256  # follows the actor
    assert config.critic.ppo_micro_batch_size_per_gpu == 32 and config.actor.ppo_micro_batch_size_per_gpu == 16
    assert config.model.use_remove_padding and config.model.enable_gradient_checkpointing


def test_lora_script():
    config = load(script_overrides("grpo_lora"))
    assert config.model.lora.rank == 64 and config.model.lora.alpha == 32
    assert config.rollout.load_format == "safetensors" and not config.data.shuffle
    assert not config.trainer.val_before_train and config.trainer.n_gpus_per_node == 2


def test_reinforce_plus_plus_script_reads_two_file_lists():
    config = load(script_overrides("reinforce_plus_plus"))
    assert config.algorithm.adv_estimator == "reinforce_plus_plus" and config.algorithm.use_kl_in_reward
    assert config.actor.kl_loss_type == "mse" and config.rollout.n == 8
    assert config.data.train_files == ("/data/gsm8k/train.parquet", "/data/math/train.parquet")  # as the script quotes


def test_rloo_script():
    config = load(script_overrides("rloo"))
    assert config.algorithm.adv_estimator == "rloo" and config.algorithm.kl_penalty == "kl"
    assert config.algorithm.kl_ctrl.kl_coef == 0.001 and config.actor.log_prob_micro_batch_size_per_gpu == 160


def test_dapo_script_moves_the_overlong_buffer_and_keeps_the_generation_batch():
    config = load(script_overrides("dapo"))
    assert config.algorithm.overlong_buffer.enable and config.algorithm.overlong_buffer.len == 128
    assert config.algorithm.filter_groups.enable and config.algorithm.filter_groups.metric == "seq_reward"
    assert config.data.gen_batch_size == 1024 and config.data.train_batch_size == 256
    assert config.actor.clip_ratio_high == 0.28 and config.trainer.total_training_steps == 1


def test_the_multi_turn_tool_script_moves_its_tool_file_and_its_unset_variable_is_named():
    """verl's GSM8K multi-turn tool script (with its --config-name's four keys): the tool file and turns move; the
    script passes ``use_kl_loss=${use_kl_loss}`` with the variable unset: an empty value after the line that turned
    the KL loss on, refused by name rather than read as either."""
    overrides = script_overrides("gsm8k_multiturn")
    message = problems_of(overrides)
    assert "actor.use_kl_loss='': Value '' is not a valid bool" in message and "unset shell variable" in message
    config = load([override for override in overrides if override != "actor_rollout_ref.actor.use_kl_loss="])
    multi_turn = config.rollout.multi_turn
    assert multi_turn.enable and multi_turn.max_assistant_turns == 5 and config.rollout.name == "vllm"
    assert multi_turn.tool_config_path.endswith("/verl/examples/sglang_multiturn/config/tool_config/"
                                                "gsm8k_tool_config.yaml")
    assert multi_turn.builtin_tools() == [] and config.actor.use_kl_loss and config.rollout.n == 8


@pytest.mark.parametrize("name", ["grpo", "ppo_critic", "grpo_lora", "reinforce_plus_plus", "rloo", "dapo"])
def test_the_scripts_tensor_parallel_rollout_is_accepted_as_written(name):
    written = [line.partition("=")[2] for line in (SCRIPTS / f"{name}.txt").read_text().splitlines()
               if line.partition("=")[0].endswith("rollout.tensor_model_parallel_size")]
    config = load(script_overrides(name))
    assert written and config.rollout.tensor_model_parallel_size == int(written[0])
    assert config.rollout.name == "vllm"


# ------------------------------------------------------------------------------------------------ the table
def test_every_moved_key_lands_on_a_real_key():
    for rule in (rule for rule in RULES if isinstance(rule, Moved)):
        for target in rule.targets:
            probe = target + "enable" if target.endswith(".") else target
            exists = _resolves(target.rstrip("."), TrainConfig) if target.endswith(".") else _resolves(probe, TrainConfig)
            assert exists, f"{rule.verl} -> {target}: no such key in the schema"
    assert all(_resolves(key, TrainConfig) for key, _, _ in VERL_DEFAULTS)


def test_no_rule_shadows_a_key_spelt_alike():
    ours = set(leaf_keys(TrainConfig))
    exact = [rule.verl for rule in RULES if not rule.verl.endswith((".", "_"))]
    assert [key for key in exact if key in ours] == []


def test_the_generated_table_is_current():
    assert (REPO / "docs" / "verl.md").read_text() == verl_table_markdown(), "docs/verl.md is stale: run `make docs`"
    assert {type(rule) for rule in RULES} == {Moved, NoEffect, Unsupported}


# ------------------------------------------------------------------------------------------------ errors
def test_all_unknown_keys_at_once_with_suggestions_across_the_verl_prefix():
    message = problems_of(["actor_rollout_ref.actor.optim.lrr=1e-6", "actor.fsdp_config.param_offload=true",
                           "data.max_prompt_lenght=64"])
    assert message.startswith("invalid config (3 problems)")
    assert "actor_rollout_ref.actor.optim.lrr='1e-6': unknown config key (hybridrl: actor.optim.lrr) " \
           "(did you mean 'actor.optim.lr'?)" in message
    assert "did you mean 'actor.fsdp.param_offload'? verl's actor_rollout_ref.actor.fsdp_config.param_offload" \
        in message
    assert "did you mean 'data.max_prompt_length'?" in message


def test_keys_without_effect_accept_only_the_values_that_describe_hybridrl():
    accepted = translate_overrides(["reward_model.ulysses_sequence_parallel_size=1",
                                    "trainer.use_legacy_worker_impl=disable"], TrainConfig)
    assert not accepted.problems and [key for key, _, _ in accepted.no_effect] == [
        "reward_model.ulysses_sequence_parallel_size", "trainer.use_legacy_worker_impl"]
    message = problems_of(["reward_model.ulysses_sequence_parallel_size=2",
                           "actor_rollout_ref.rollout.multi_turn.interaction_config_path=interaction.yaml",
                           "trainer.default_hdfs_dir=/x"])
    assert "the reward model scores whole sequences on each rank" in message and "(accepted: 1)" in message
    assert "verl's interaction_config_path files and user turns are not read" in message
    assert "verl key hybridrl has no equivalent for: checkpoints go to trainer.default_local_dir" in message


def test_verl_sequence_parallel_keys_set_the_actors_and_critics():
    config = load(["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                   "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2",
                   "trainer.n_gpus_per_node=2"])
    assert config.actor.ulysses_sequence_parallel_size == config.critic.ulysses_sequence_parallel_size == 2


def test_two_verl_keys_that_are_one_hybridrl_key_must_agree():
    message = problems_of(["actor_rollout_ref.model.use_remove_padding=True", "critic.model.use_remove_padding=False"])
    assert "both hybridrl's model.use_remove_padding, one setting for both roles" in message
    assert load(["actor_rollout_ref.model.use_remove_padding=True", "critic.model.use_remove_padding=true"]) \
        .model.use_remove_padding


def test_a_later_override_wins_as_in_hydra():
    config = load(["rollout.n=5", "rollout.n=8", "actor_rollout_ref.actor.optim.lr=1e-6",
                   "actor_rollout_ref.actor.optim.lr=2e-6"])
    assert config.rollout.n == 8 and config.actor.optim.lr == 2e-6


def test_a_verl_key_and_its_hybridrl_twin_must_agree():
    """Spelt two ways, one setting: different values are refused naming both (neither is dropped unsaid)."""
    message = problems_of(["actor_rollout_ref.rollout.n=5", "rollout.n=8"])
    assert "actor_rollout_ref.rollout.n=5 (verl's spelling) and rollout.n=8 (hybridrl's) are one setting" in message
    assert load(["actor_rollout_ref.rollout.n=8", "rollout.n=8"]).rollout.n == 8


def test_verl_defaults_apply_only_to_a_verl_command_line():
    assert load([]).rollout.n == 4 and load([]).algorithm.adv_estimator == "grpo"
    verl = load(["actor_rollout_ref.actor.optim.lr=1e-6", "critic.model.path=/models/tiny"])
    assert verl.algorithm.adv_estimator == "gae" and verl.rollout.n == 1 and verl.trainer.total_epochs == 30
    assert verl.critic.ppo_epochs == verl.actor.ppo_epochs and not verl.data.filter_overlong_prompts


def test_moved_values_are_respelt_and_one_key_can_set_two():
    config = load(["actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.clip_ratio=0.25",
                   "actor_rollout_ref.rollout.load_format=dummy_dtensor",
                   "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"])
    assert config.actor.strategy == "fsdp2" and config.actor.clip_ratio_low == config.actor.clip_ratio_high == 0.25
    assert config.rollout.load_format == "dummy"


@pytest.mark.parametrize(("value", "expected"), [
    ("/root/data/gsm8k/train.parquet", ("/root/data/gsm8k/train.parquet",)),
    ("'/root/my data/it''s.parquet'", ("/root/my data/it''s.parquet",)),
    ("[a.parquet,b.parquet]", ("a.parquet", "b.parquet")),
])
def test_a_bare_string_is_a_one_element_list(value, expected):
    assert load([f"data.train_files={value}"]).data.train_files == expected


def test_a_bare_logger_name_is_a_list_too():
    assert load(["trainer.logger=console"]).trainer.logger == ("console",)


# ------------------------------------------------------------------------------------------------ sources and device
def test_train_files_replace_the_default_synthetic_task_and_its_sizes():
    config = load(["data.train_files=/data/train.parquet"])
    assert config.data.synthetic_task is None and config.data.max_prompt_length == 512
    message = problems_of(["data.train_files=/data/train.parquet", "data.synthetic_task=arithmetic"])
    assert "data.train_files=['/data/train.parquet']: and data.synthetic_task='arithmetic' are both set" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU default; this machine has a GPU")
def test_the_default_device_is_auto_and_means_two_cpu_ranks_here():
    config = load([])
    assert config.trainer.device == "auto" and config.trainer.n_gpus_per_node == 2
    assert load(["trainer.device=cpu"]).trainer.n_gpus_per_node == 2


def test_gen_batch_size_without_the_filter_is_refused_and_metrics_are_checked():
    assert "needs algorithm.filter_groups.enable=true" in problems_of(["data.gen_batch_size=64"])
    message = problems_of(["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_final_reward",
                           "algorithm.use_kl_in_reward=true"])
    assert "hybridrl filters groups before the KL-in-reward penalty" in message
    # verl's DAPO recipes filter on "acc", a value their reward functions return beside the score: accepted
    assert load(["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc", "rollout.n=2"]
                ).algorithm.filter_groups.metric == "acc"
    assert "or the name of a value the reward function returns" in problems_of(["algorithm.filter_groups.metric=a-b"])


def test_verl_multi_turn_keys_that_hybridrl_shares_move():
    config = load(["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.multi_turn.enable=True",
                   "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
                   "actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml",
                   "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2",
                   "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=strict",
                   "actor_rollout_ref.rollout.multi_turn.format=hermes"])
    multi_turn = config.rollout.multi_turn
    assert multi_turn.enable and multi_turn.max_assistant_turns == 3 and multi_turn.tool_config_path.endswith("/tools.yaml")
    assert multi_turn.max_tool_calls_per_turn == 2 and multi_turn.strict
    assert not load(["actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=disable"]) \
        .rollout.multi_turn.strict
    assert "Hermes format" in problems_of(["actor_rollout_ref.rollout.multi_turn.format=llama3_json"])
