"""Bad configs: each gets one clear ConfigError that names the offending key (the table below is the catalogue)."""

from __future__ import annotations

import pytest

from hybridrl.config import ConfigError, load_config

# (overrides, key the error must name, a phrase the message must contain)
BAD_CONFIGS = [
    (["data.train_batch_size=0"], "data.train_batch_size", "positive"),
    (["data.train_batch_size=-4"], "data.train_batch_size", "positive"),
    (["data.max_response_length=0"], "data.max_response_length", "positive"),
    (["actor.ppo_mini_batch_size=0"], "actor.ppo_mini_batch_size", "positive"),
    (["actor.ppo_mini_batch_size=32"], "actor.ppo_mini_batch_size", "exceeds data.train_batch_size"),
    (["actor.ppo_mini_batch_size=6"], "actor.ppo_mini_batch_size", "must divide data.train_batch_size"),
    (["actor.ppo_micro_batch_size_per_gpu=3"], "actor.ppo_micro_batch_size_per_gpu", "micro × accumulation × world"),
    (["actor.ppo_micro_batch_size_per_gpu=null"], "actor.ppo_micro_batch_size_per_gpu", "use_dynamic_bsz"),
    (["trainer.n_gpus_per_node=3"], "actor.ppo_mini_batch_size", "data-parallel ranks"),
    (["rollout.n=0"], "rollout.n", "positive"),
    (["rollout.n=1"], "rollout.n", "needs rollout.n >= 2"),
    (["algorithm=rloo", "rollout.n=1"], "rollout.n", "needs rollout.n >= 2"),
    (["algorithm.adv_estimator=ppo2"], "algorithm.adv_estimator", "expected one of"),
    (["actor.policy_loss=clipped"], "actor.policy_loss", "expected one of"),
    (["actor.loss_agg_mode=mean"], "actor.loss_agg_mode", "expected one of"),
    (["actor.kl_loss_type=k4"], "actor.kl_loss_type", "expected one of"),
    (["algorithm.kl_ctrl.type=pid"], "algorithm.kl_ctrl.type", "expected one of"),
    (["rollout.name=sglang"], "rollout.name", "expected one of"),
    (["model.dtype=float64"], "model.dtype", "expected one of"),
    (["critic.fsdp.grad_sync=layer"], "critic.fsdp.grad_sync", "expected one of"),
    (["actor.fsdp.fsdp_size=3"], "actor.fsdp.fsdp_size", "must be -1 (shard over all 2 ranks) or divide them"),
    (["critic.fsdp.fsdp_size=0"], "critic.fsdp.fsdp_size", "must be -1"),
    (["data.truncation=middle"], "data.truncation", "expected one of"),
    (["trainer.logger=[console,neptune]"], "trainer.logger", "expected one of"),
    (["actor.clip_ratio_c=1.0"], "actor.clip_ratio_c", "> 1"),
    (["actor.clip_ratio_low=-0.1"], "actor.clip_ratio_low", ">= 0"),
    (["rollout.temperature=0"], "rollout.temperature", "> 0"),
    (["rollout.top_p=1.5"], "rollout.top_p", "(0, 1]"),
    (["algorithm.gamma=1.5"], "algorithm.gamma", "[0, 1]"),
    (["actor.optim.lr=0"], "actor.optim.lr", "positive"),
    (["actor.optim.betas=[0.9]"], "actor.optim.betas", "two numbers"),
    (["rollout.tensor_model_parallel_size=4"], "rollout.tensor_model_parallel_size", "must divide the 2 devices"),
    (["rollout.n_gpus=-1"], "rollout.n_gpus", ">= 0"),
    (["rollout.n_gpus=1"], "rollout.n_gpus", "needs rollout.name=vllm"),
    (["rollout.name=vllm", "rollout.n_gpus=3", "rollout.tensor_model_parallel_size=2"], "rollout.n_gpus",
     "multiple of rollout.tensor_model_parallel_size=2"),
    (["rollout.name=vllm", "rollout.n_gpus=1", "trainer.nnodes=2", "rollout.weight_transfer=shared_memory"],
     "rollout.weight_transfer", "reaches replicas on the trainer's host only"),
    (["rollout.name=vllm", "rollout.n_gpus=1", "rollout.weight_transfer=by_pigeon"], "rollout.weight_transfer",
     "expected one of auto, shared_memory, plan, gather, object_store, collective"),
    (["rollout.name=vllm", "rollout.n_gpus=1", "trainer.nnodes=2", "async_training.mode=one_step_off",
      "async_training.partial_rollout=true"], "async_training.partial_rollout", "object_store weight transport"),
    (["rollout.name=vllm", "rollout.n_gpus=1", "rollout.weight_transfer=collective",
      "async_training.mode=one_step_off", "async_training.partial_rollout=true"], "async_training.partial_rollout",
     "the collective weight transport does not use"),
    (["rollout.name=vllm", "rollout.n_gpus=1", "rollout.weight_transfer=collective",
      "rollout.weight_transfer_timeout_s=0"], "rollout.weight_transfer_timeout_s", "> 0"),
    (["rollout.name=vllm", "rollout.n_gpus=1", "rollout.weight_transfer=shared_memory", "rollout.weight_delta=true"],
     "rollout.weight_delta", "needs rollout.weight_transfer=object_store or collective"),
    (["rollout.name=vllm", "rollout.n_gpus=1", "rollout.weight_delta=true"], "rollout.weight_delta",
     "no bytes travel to save"),  # auto: shared_memory on one host
    (["rollout.name=vllm", "rollout.weight_delta=true"], "rollout.weight_delta",
     "applies to replicas in processes of their own"),
    (["rollout.name=vllm", "rollout.n_gpus=1", "rollout.weight_transfer=object_store", "rollout.weight_delta=true",
      "rollout.weight_delta_full_every=0"], "rollout.weight_delta_full_every", ">= 1"),
    (["rollout.multi_turn.enable=true"], "rollout.multi_turn.enable", "set rollout.name=vllm"),
    (["rollout.name=vllm", "rollout.multi_turn.enable=true", "rollout.multi_turn.max_assistant_turns=0"],
     "rollout.multi_turn.max_assistant_turns", ">= 1"),
    (["rollout.name=vllm", "rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[browser]"],
     "rollout.multi_turn.tools", "expected one of"),
    (["rollout.name=vllm", "rollout.multi_turn.enable=true", "rollout.multi_turn.tool_prompt=xml"],
     "rollout.multi_turn.tool_prompt", "expected one of"),
    (["rollout.multi_turn.environment=gym"], "rollout.multi_turn.environment", "expected one of"),
    (["rollout.name=vllm", "rollout.multi_turn.enable=true", "rollout.multi_turn.env_step_timeout_s=0"],
     "rollout.multi_turn.env_step_timeout_s", "> 0"),
    (["rollout.multi_turn.agent=my_agent:agent"], "rollout.multi_turn.agent", "set rollout.multi_turn.enable=true"),
    (["rollout.name=vllm", "rollout.multi_turn.enable=true", "rollout.multi_turn.agent=my_agent:agent",
      "rollout.multi_turn.tools=[calculator]"], "rollout.multi_turn.tools", "the agent offers its tools itself"),
    (["rollout.name=vllm", "rollout.multi_turn.enable=true", "rollout.multi_turn.agent=my_agent:agent",
      "rollout.multi_turn.agent_timeout_s=0"], "rollout.multi_turn.agent_timeout_s", "> 0"),
    (["rollout.weight_transfer=ipc"], "rollout.weight_transfer", "expected one of"),
    (["rollout.weight_transfer=shared_memory", "trainer.device=cuda"], "rollout.weight_transfer",
     "on a GPU use plan"),
    (["rollout.weight_transfer=shared_memory", "trainer.device=cpu", "trainer.nnodes=2"], "rollout.weight_transfer",
     "one host"),
    (["rollout.name=vllm", "rollout.tensor_model_parallel_size=2", "rollout.weight_transfer=gather"],
     "rollout.weight_transfer", "tensor_model_parallel_size=1"),
    (["rollout.name=vllm", "rollout.weight_transfer=collective"], "rollout.weight_transfer",
     "engines in the actor's processes are resharded in place"),
    (["rollout.name=vllm", "rollout.n_gpus=1", "rollout.weight_transfer=plan"], "rollout.weight_transfer",
     "take one of auto, shared_memory, object_store, collective"),
    (["rollout.weight_sync_method=plan"], "rollout.weight_sync_method", "replaced by rollout.weight_transfer"),
    (["rollout.weight_transport=collective"], "rollout.weight_transport", "replaced by rollout.weight_transfer"),
    (["rollout.weight_transport_timeout_s=5"], "rollout.weight_transport_timeout_s",
     "replaced by rollout.weight_transfer_timeout_s"),
    (["async_training.mode=eventually"], "async_training.mode", "expected one of"),
    (["async_training.mode=bounded", "async_training.max_staleness=-1"], "async_training.max_staleness", ">= 0"),
    (["async_training.mode=bounded"], "async_training.mode", "set rollout.n_gpus > 0"),
    (["async_training.mode=one_step_off", "async_training.max_staleness=2"], "async_training.max_staleness",
     "set async_training.mode=bounded"),
    (["async_training.partial_rollout=true"], "async_training.partial_rollout", "max_staleness >= 1"),
    (["rollout.name=vllm", "rollout.n_gpus=1", "async_training.mode=one_step_off", "async_training.partial_rollout=true",
      "algorithm=remax"], "async_training.partial_rollout", "greedy baseline"),
    (["rollout.name=vllm", "rollout.n_gpus=2", "rollout.tensor_model_parallel_size=2",
      "async_training.mode=one_step_off", "async_training.partial_rollout=true"], "async_training.partial_rollout",
     "tensor_model_parallel_size=1"),
    (["algorithm.off_policy_correction.kind=vtrace"], "algorithm.off_policy_correction.kind", "expected one of"),
    (["algorithm.off_policy_correction.level=batch"], "algorithm.off_policy_correction.level", "expected one of"),
    (["algorithm.off_policy_correction.kind=tis", "algorithm.off_policy_correction.cap=0"],
     "algorithm.off_policy_correction.cap", "> 0"),
    (["algorithm.off_policy_correction.kind=mis", "algorithm.off_policy_correction.high=0.9"],
     "algorithm.off_policy_correction.high", ">= 1"),
    (["algorithm=gae", "critic.enable=false"], "critic.enable", "needs a critic"),
    (["actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=16"], "actor.ppo_max_token_len_per_gpu",
     "one whole sequence"),
    (["trainer.save_freq=0"], "trainer.save_freq", "-1 (off)"),
    (["trainer.resume_mode=resume_path"], "trainer.resume_from_path", "is required"),
    (["data.synthetic_task=null"], "data.train_files", "at least one"),
    (["reward_model.enable=true"], "reward_model.model_path", "is required"),
    (["trainer.ray.object_store_memory_mb=10"], "trainer.ray.object_store_memory_mb", "at least"),
    (["trainer.device=cpu", "model.dtype=float16"], "model.dtype", "not supported on CPU"),
    (["model.lora.rank=-1"], "model.lora.rank", ">= 0"),
    (["model.lora.rank=4", "model.lora.dropout=1.0"], "model.lora.dropout", "[0, 1)"),
    (["model.lora.rank=4", "model.lora.target_modules=[]"], "model.lora.target_modules", "at least one"),
    (["actor.ptx.coef=-0.1"], "actor.ptx.coef", ">= 0"),
    (["actor.ptx.coef=0.5", "actor.ptx.batch_size=6"], "actor.ptx.batch_size", "devices (2) × optimizer steps per epoch (2)"),
    (["actor.ptx.coef=0.5", "actor.ptx.batch_size=4", "data.synthetic_task=null"], "actor.ptx.train_files",
     "set data.synthetic_task"),
    (["actor.ptx.coef=0.5", "actor.ptx.batch_size=4", "actor.adaptive_accumulation.enable=true"], "actor.ptx.coef",
     "adaptive_accumulation"),
    (["actor.ewc.coef=-1"], "actor.ewc.coef", ">= 0"),
    (["actor.ewc.fisher_batches=0"], "actor.ewc.fisher_batches", "positive"),
    (["actor.ewc.coef=1", "actor.ewc.fisher_batches=5"], "actor.ewc.fisher_batches", "must divide the 32 rollout rows"),
    (["data.replay.capacity=0"], "data.replay.capacity", "positive"),
    (["data.replay.alpha=-1"], "data.replay.alpha", ">= 0"),
    (["data.replay.enable=true", "data.replay.fraction=1.0"], "data.replay.fraction", "(0, 1)"),
    (["data.replay.enable=true", "data.replay.fraction=0.01"], "data.replay.fraction", "at least one"),
    (["reward_fusion.weighting=by_magic"], "reward_fusion.weighting", "inverse_std"),
    # type and key errors come from the schema merge
    (["data.train_batch_size=lots"], "data.train_batch_size", ""),
    (["actor.ppo_mini_batch_sizee=4"], "actor.ppo_mini_batch_sizee", "did you mean 'actor.ppo_mini_batch_size'"),
    (["+trainer.nonsense=1"], "trainer.nonsense", "unknown config key"),
]


@pytest.mark.parametrize(("overrides", "key", "phrase"), BAD_CONFIGS, ids=[" ".join(case[0]) for case in BAD_CONFIGS])
def test_bad_config_names_the_key(overrides, key, phrase):
    with pytest.raises(ConfigError) as caught:
        load_config(overrides, check_paths=False)
    message = str(caught.value)
    assert key in caught.value.keys or key in message, message
    assert phrase in message, message


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as caught:
        load_config(["data.train_batch_size=0", "rollout.temperature=-1", "rollout.name=nope"], check_paths=False)
    assert {"data.train_batch_size", "rollout.temperature", "rollout.name"} <= set(caught.value.keys)


def test_a_delta_weight_sync_through_the_object_store_is_accepted():
    config = load_config(["rollout.name=vllm", "rollout.n_gpus=1", "rollout.weight_transfer=object_store",
                          "rollout.weight_delta=true", "rollout.weight_delta_full_every=1"], check_paths=False)
    assert config.rollout.weight_delta and config.rollout.weight_delta_full_every == 1


@pytest.mark.parametrize(
    ("overrides", "key", "phrase"),
    [
        (["model.path=/definitely/not/here"], "model.path", "does not exist"),
        (["data.synthetic_task=null", "data.train_files=[/nope/train.parquet]"], "data.train_files", "does not exist"),
        (["custom_reward_function.path=/nope/reward.py"], "custom_reward_function.path", "existing .py file"),
        (["actor.ptx.train_files=[/nope/sft.jsonl]"], "actor.ptx.train_files", "does not exist"),
    ],
)
def test_missing_files_are_named(overrides, key, phrase):
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    assert key in caught.value.keys
    assert phrase in str(caught.value)


def test_directory_without_config_json_is_not_a_model(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        load_config([f"model.path={tmp_path}"])


def test_data_file_with_unknown_suffix(tmp_path):
    data_file = tmp_path / "train.csv"
    data_file.write_text("question,answer\n")
    with pytest.raises(ConfigError, match="unsupported format"):
        load_config(["data.synthetic_task=null", f"data.train_files=[{data_file}]"], check_paths=True)


def test_unknown_config_name():
    with pytest.raises(ConfigError, match="no does_not_exist.yaml"):
        load_config([], config_name="does_not_exist", check_paths=False)


def test_unknown_group_option_is_a_config_error():
    with pytest.raises(ConfigError, match="overrides"):
        load_config(["algorithm=ppo_but_better"], check_paths=False)


# Reward-model training configs (conf/rm_trainer.yaml): (overrides, key the error must name, phrase).
BAD_RM_CONFIGS = [
    ([], "data.train_files", "preference pairs"),
    (["data.synthetic_task=arithmetic", "data.train_batch_size=20", "data.micro_batch_size_per_gpu=8"],
     "data.train_batch_size", "micro × accumulation × world"),
    (["data.synthetic_task=arithmetic", "data.synthetic_preference=longer"], "data.synthetic_preference",
     "expected one of"),
    (["data.synthetic_task=arithmetic", "data.val_fraction=1.0"], "data.val_fraction", "[0, 1)"),
    (["data.synthetic_task=arithmetic", "loss.center_coef=-0.1"], "loss.center_coef", ">= 0"),
    (["data.synthetic_task=arithmetic", "trainer.resume_mode=resume_path"], "trainer.resume_mode", "expected one of"),
    (["data.synthetic_task=arithmetic", "fsdp.optimizer_offload=true"], "fsdp.optimizer_offload", "fsdp.param_offload=true"),
    (["data.synthetic_task=arithmetic", "fsdp.grad_sync=never"], "fsdp.grad_sync", "expected one of"),
    (["data.synthetic_task=arithmetic", "fsdp.fsdp_size=4"], "fsdp.fsdp_size", "divide them"),
]


@pytest.mark.parametrize(("overrides", "key", "phrase"), BAD_RM_CONFIGS, ids=lambda v: str(v))
def test_bad_reward_model_configs_name_the_key(overrides, key, phrase):
    with pytest.raises(ConfigError) as caught:
        load_config(overrides, "rm_trainer", check_paths=False)
    assert key in caught.value.keys, str(caught.value)
    assert phrase in str(caught.value)


def test_reward_model_data_files_are_checked(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_config([f"model.path={tmp_path}", "data.train_files=[/nope/prefs.jsonl]"], "rm_trainer")
    assert {"model.path", "data.train_files"} <= set(caught.value.keys)


MULTI_TURN = ["rollout.name=vllm", "rollout.multi_turn.enable=true"]


def test_the_tool_config_file_is_checked_before_any_worker_starts(tmp_path):
    from hybridrl.config.multi_turn_checks import check_tool_config

    missing = tmp_path / "none.yaml"
    with pytest.raises(ConfigError) as caught:  # with the machine checks (other keys fail too: no model here)
        load_config([*MULTI_TURN, f"rollout.multi_turn.tool_config_path={missing}"])
    assert "rollout.multi_turn.tool_config_path" in caught.value.keys and "no such file" in str(caught.value)
    clash = tmp_path / "tools.yaml"
    clash.write_text("tools:\n  - class_name: hybridrl.agents.builtin_tools:calculator\n    tool_schema:\n"
                     "      function: {name: calculator, parameters: {properties: {expression: {type: string}}}}\n")

    def problems(*overrides):
        error = ConfigError()
        check_tool_config(load_config([*MULTI_TURN, *overrides], check_paths=False), error)
        return error

    refused = problems(f"rollout.multi_turn.tool_config_path={clash}", "rollout.multi_turn.tools=[calculator]")
    assert refused.keys == ["rollout.multi_turn.tool_config_path"]
    assert "its tool(s) ['calculator'] are also built-in tools" in str(refused)
    assert not problems(f"rollout.multi_turn.tool_config_path={clash}")   # the file's tools replace the default
    config = load_config([*MULTI_TURN, f"rollout.multi_turn.tool_config_path={clash}"], check_paths=False)
    assert config.rollout.multi_turn.builtin_tools() == []
    assert load_config(MULTI_TURN, check_paths=False).rollout.multi_turn.builtin_tools() == ["calculator"]


def test_reward_placement_is_a_choice():
    with pytest.raises(ConfigError, match="rollout.multi_turn.reward_placement"):
        load_config([*MULTI_TURN, "rollout.multi_turn.reward_placement=middle"], check_paths=False)


def test_an_architecture_vllm_does_not_serve_is_refused_before_workers_start(tmp_path):
    """Read from the installed vLLM's own registry (without importing vLLM); the same model with rollout=hf is fine."""
    import json

    from hybridrl.utils.tiny_model import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    settings = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**settings, "architectures": ["MadeUpForCausalLM"]}))
    with pytest.raises(ConfigError, match=r"rollout.name='vllm': the installed vLLM does not serve MadeUpForCausalLM"):
        load_config([f"model.path={model}", "rollout=vllm_cpu"])
    assert load_config([f"model.path={model}", "rollout=hf"]).rollout.name == "hf"


@pytest.mark.parametrize("agent, phrase", [
    ("json:loads", "not an async function"),
    ("no_such_module_x:agent", "importing 'no_such_module_x' failed"),
    ("missing_file.py:agent", "does not exist"),
    ("{file}:missing", "has no function or class 'missing'"),
    ("{file}:two_arguments_short", "must take (row, client)"),
])
def test_a_bad_agent_is_refused_at_start_naming_the_key(tmp_path, agent, phrase):
    """``rollout.multi_turn.agent`` is imported and checked before any worker starts."""
    file = tmp_path / "my_agent.py"
    file.write_text("async def two_arguments_short(row):\n    return 1.0\n")
    overrides = ["rollout.name=vllm", "rollout.multi_turn.enable=true",
                 f"rollout.multi_turn.agent={agent.format(file=file)}"]
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    assert "rollout.multi_turn.agent" in str(caught.value) and phrase in str(caught.value)


def test_an_agent_interpreter_is_checked_at_start_naming_the_key(tmp_path, monkeypatch):
    """``rollout.multi_turn.agent_python``: an executable that imports hybridrl and loads the agent, with the agent
    process on."""
    from other_python import make_venv

    from hybridrl.utils.tiny_model import save_tiny_model

    file = tmp_path / "my_agent.py"
    file.write_text("async def agent(row, client):\n    return 1.0\n")
    base = ["rollout.name=vllm", "rollout.multi_turn.enable=true", f"rollout.multi_turn.agent={file}:agent"]
    monkeypatch.chdir(tmp_path)  # not from the checkout: a bare interpreter must not find hybridrl in the cwd
    bare = make_venv(tmp_path / "bare", sees_this_environment=False)
    cases = [([f"rollout.multi_turn.agent_python={tmp_path / 'nope'}"], "is not an executable file"),
             ([f"rollout.multi_turn.agent_python={bare}"], "cannot import hybridrl: install it there too"),
             ([f"rollout.multi_turn.agent_python={bare}", "rollout.multi_turn.agent_process=false"],
              "rollout.multi_turn.agent_process=false")]
    for overrides, phrase in cases:
        with pytest.raises(ConfigError) as caught:
            load_config([*base, *overrides])
        assert "rollout.multi_turn.agent_python" in str(caught.value) and phrase in str(caught.value), overrides
    seeing = make_venv(tmp_path / "seeing", sees_this_environment=True)
    model = save_tiny_model(tmp_path / "model", tool_chat=True)
    config = load_config([*base, f"model.path={model}",
                          f"rollout.multi_turn.agent_python={seeing.relative_to(tmp_path)}"])
    assert config.rollout.multi_turn.agent_python == str(seeing)  # absolute, the venv's own link kept
    file.write_text("def agent(row, client):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=r"rollout.multi_turn.agent=.*does not load in .*seeing/bin/python: .*not "
                                          r"an async function"):
        load_config([*base, f"rollout.multi_turn.agent_python={seeing}"])


def test_several_sequences_per_episode_need_one_advantage_per_sequence_and_size_the_batch(tmp_path):
    """``rollout.multi_turn.agent_max_sequences``: an agent's key (refused without one), an estimator that gives a
    sequence one advantage, no KL in the reward; the batch plan counts ``n`` × it rows per prompt."""
    from hybridrl.config.plan_report import batch_plan_report
    from hybridrl.config.sizes import role_plan, trained_rows_per_prompt

    file = tmp_path / "my_agent.py"
    file.write_text("async def agent(row, client):\n    return 1.0\n")
    agent = [*MULTI_TURN, f"rollout.multi_turn.agent={file}:agent", "algorithm.adv_estimator=grpo", "rollout.n=2",
             "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2"]
    cases = [(["rollout.multi_turn.agent_max_sequences=2", "algorithm.adv_estimator=gae"], "gives each token its own"),
             (["rollout.multi_turn.agent_max_sequences=2", "algorithm.use_kl_in_reward=true"],
              "use_kl_in_reward=true makes it depend"),
             (["rollout.multi_turn.agent_max_sequences=2", "algorithm.adv_estimator=reinforce_plus_plus"],
              "reinforce_plus_plus gives each token its own"),
             (["rollout.multi_turn.agent_max_sequences=0"], "must be >= 1")]
    for overrides, phrase in cases:
        with pytest.raises(ConfigError) as caught:
            load_config([*agent, *overrides], check_paths=False)
        assert "rollout.multi_turn.agent_max_sequences" in str(caught.value) and phrase in str(caught.value), overrides
    for key, value in (("agent_max_sequences", 2), ("agent_python", "/usr/bin/python3")):
        for multi_turn in (MULTI_TURN, []):
            with pytest.raises(ConfigError, match=f"rollout.multi_turn.{key}.*read only with rollout.multi_turn.agent"):
                load_config([*multi_turn, f"rollout.multi_turn.{key}={value}"], check_paths=False)
    config = load_config([*agent, "rollout.multi_turn.agent_max_sequences=3"], check_paths=False)
    assert trained_rows_per_prompt(config) == 6 and role_plan(config, "actor").mini_batch_sequences == 12
    assert "4 prompts × n=2 × 3 sequences per episode = 24 sequences per step" in batch_plan_report(config, False)
    assert trained_rows_per_prompt(load_config(agent, check_paths=False)) == 2


def test_a_distillation_teacher_needs_the_policys_vocabulary_and_a_weight(tmp_path):
    """``algorithm.distillation``: a missing teacher directory, a teacher whose tokenizer maps tokens otherwise (two
    digits swapped), and both weights at 0 are refused before any worker starts, naming the key."""
    import json
    import shutil

    from hybridrl.utils.tiny_model import save_tiny_model

    policy = save_tiny_model(tmp_path / "policy")
    teacher = tmp_path / "teacher"
    shutil.copytree(policy, teacher)
    base = [f"model.path={policy}", "rollout=hf", "trainer.device=cpu"]
    config = load_config([*base, f"algorithm.distillation.teacher_path={teacher}"])
    assert config.algorithm.distillation.teacher_path == str(teacher)
    tokenizer = json.loads((teacher / "tokenizer.json").read_text())
    vocabulary = tokenizer["model"]["vocab"]
    vocabulary["0"], vocabulary["1"] = vocabulary["1"], vocabulary["0"]
    (teacher / "tokenizer.json").write_text(json.dumps(tokenizer))
    cases = [([f"algorithm.distillation.teacher_path={teacher}"], "the teacher's vocabulary is not the policy's"),
             ([f"algorithm.distillation.teacher_path={tmp_path / 'none'}"], "does not exist"),
             ([f"algorithm.distillation.teacher_path={policy}", "algorithm.distillation.kl_coef=0",
               "algorithm.distillation.task_weight=0"], "both 0: nothing would be learned"),
             (["algorithm.distillation.kl_coef=0.5"], "is read only with algorithm.distillation.teacher_path")]
    for overrides, phrase in cases:
        with pytest.raises(ConfigError) as caught:
            load_config([*base, *overrides])
        assert "algorithm.distillation" in str(caught.value) and phrase in str(caught.value), overrides
