"""Bad input, round 2: more mistakes real users make — config values, choices, plugins, synthetic-task options,
models, tokenizers, data files (RL, SFT, preference), run directories, YAML files, the wrong trainer's config, plan
arguments. Each case is refused before any worker starts, with a message that names the culprit (the key, the file,
the row); the ones that reach the command line exit 2 with one message and no traceback.

Cases run in-process (``load_config`` and the trainer's constructor: what ``hybridrl train`` does before Ray); the
command-line checks at the end run ``hybridrl``'s ``main`` in this process (the console script's code), and a whole
run in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bad_input_cases import copy_model, encoded, good_rows, jsonl_lines, run_overrides, train_files

from hybridrl.cli import main
from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.trainers.rm_trainer import RMTrainer
from hybridrl.trainers.sft_trainer import SFTTrainer

# ---------------------------------------------------------------------------------------------- config values
VALUE_CASES = {  # overrides -> phrases the one message must hold
    "negative_lr": (["actor.optim.lr=-1"], ["actor.optim.lr=-1", "positive"]),
    "one_beta": (["actor.optim.betas=[0.9]"], ["actor.optim.betas", "two numbers in [0, 1)"]),
    "clip_low_above_one": (["actor.clip_ratio_low=1.5"], ["actor.clip_ratio_low=1.5", "must be < 1"]),
    "dual_clip_below_one": (["actor.clip_ratio_c=0.5"], ["actor.clip_ratio_c=0.5", "must be > 1"]),
    "top_p_zero": (["rollout.top_p=0"], ["rollout.top_p=0", "(0, 1]"]),
    "temperature_zero": (["rollout.temperature=0"], ["rollout.temperature=0", "> 0"]),
    "top_k_zero": (["rollout.top_k=0"], ["rollout.top_k=0", "-1 (off) or positive"]),
    "block_size_zero": (["rollout=vllm_cpu", "rollout.block_size=0"], ["rollout.block_size=0", "positive"]),
    "block_size_off_the_cpu_kernels_multiple": (["rollout=vllm_cpu", "rollout.block_size=48"],
                                                ["rollout.block_size=48", "multiple of 32"]),
    "gamma_above_one": (["algorithm.gamma=1.5"], ["algorithm.gamma=1.5", "[0, 1]"]),
    "save_freq_zero": (["trainer.save_freq=0"], ["trainer.save_freq=0", "-1 (off)"]),
    "test_freq_zero": (["trainer.test_freq=0"], ["trainer.test_freq=0", "-1 (off)"]),
    "negative_critic_warmup": (["trainer.critic_warmup=-1"], ["trainer.critic_warmup=-1", ">= 0"]),
    "negative_restarts": (["trainer.max_restarts=-1"], ["trainer.max_restarts=-1", ">= 0"]),
    "zero_epochs": (["actor.ppo_epochs=0"], ["actor.ppo_epochs=0", "positive"]),
    "negative_lora_rank": (["model.lora.rank=-1"], ["model.lora.rank=-1", ">= 0"]),
    "lora_alpha_zero": (["model.lora.rank=4", "model.lora.alpha=0"], ["model.lora.alpha=0", "> 0"]),
    "lora_dropout_one": (["model.lora.rank=4", "model.lora.dropout=1.0"], ["model.lora.dropout=1.0", "[0, 1)"]),
    "negative_ptx": (["actor.ptx.coef=-0.1"], ["actor.ptx.coef=-0.1", ">= 0"]),
    "replay_fraction_above_one": (["data.replay.enable=true", "data.replay.fraction=1.5"],
                                  ["data.replay.fraction=1.5", "(0, 1)"]),
    "sequence_parallel_not_dividing_the_ranks": (["critic.ulysses_sequence_parallel_size=3", "algorithm=gae"],
                                                ["critic.ulysses_sequence_parallel_size=3", "must divide the 2 devices"]),
    "noise_scale_with_split_sequences": (["trainer.n_gpus_per_node=2", "actor.ulysses_sequence_parallel_size=2",
                                          "actor.log_grad_noise_scale=true"],
                                         ["actor.log_grad_noise_scale=True", "partial sums when ranks split"]),
    "compile_with_split_sequences": (["trainer.n_gpus_per_node=2", "critic.ulysses_sequence_parallel_size=2",
                                      "algorithm=gae", "model.use_torch_compile=true"],
                                     ["model.use_torch_compile=True", "not combined with sequence parallelism"]),
    "router_replay_unknown_mode": (["actor.router_replay.mode=R2"], ["actor.router_replay.mode='R2'", "R3"]),
    "router_replay_on_vllm": (["rollout=vllm_cpu", "actor.router_replay.mode=R3"],
                              ["actor.router_replay.mode='R3'", "only rollout.name=hf returns"]),
    "sequence_parallel_zero": (["actor.ulysses_sequence_parallel_size=0"],
                               ["actor.ulysses_sequence_parallel_size=0", "whole number ≥ 1"]),
    "token_budget_below_a_sequence": (["actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=8"],
                                      ["actor.ppo_max_token_len_per_gpu=8", "must hold one whole sequence"]),
    "grpo_with_one_response": (["rollout.n=1"], ["rollout.n=1", "needs rollout.n >= 2"]),
    "gae_without_a_critic": (["algorithm=gae", "critic.enable=false"], ["critic.enable=False", "needs a critic"]),
    "critic_warmup_without_critic": (["trainer.critic_warmup=2"], ["trainer.critic_warmup=2", "has none"]),
    "gspo_with_ppo_clip": (["actor.policy_loss=gspo"], ["actor.clip_ratio_high", "GSPO clips a sequence-level ratio"]),
    "overlong_buffer_zero": (["algorithm.overlong_buffer.enable=true", "algorithm.overlong_buffer.len=0"],
                             ["algorithm.overlong_buffer.len=0", "(0, data.max_response_length"]),
    "filter_groups_no_batches": (["algorithm.filter_groups.enable=true",
                                  "algorithm.filter_groups.max_num_gen_batches=0"],
                                 ["algorithm.filter_groups.max_num_gen_batches=0", ">= 1"]),
    "tensor_parallel_with_hf_rollout": (["rollout.tensor_model_parallel_size=2"],
                                        ["rollout.tensor_model_parallel_size=2", "needs rollout.name=vllm"]),
    "resume_path_without_path": (["trainer.resume_mode=resume_path"], ["trainer.resume_from_path", "is required"]),
    "reward_model_without_path": (["reward_model.enable=true"], ["reward_model.model_path", "is required"]),
    "negative_reward_model_gpus": (["reward_model.n_gpus=-1"], ["reward_model.n_gpus=-1", ">= 0"]),
    "adaptive_lr_scaling_unknown": (["actor.adaptive_accumulation.enable=true",
                                     "actor.adaptive_accumulation.lr_scaling=cubic", "actor.ppo_micro_batch_size_per_gpu=1"],
                                    ["actor.adaptive_accumulation.lr_scaling='cubic'", "unknown"]),
    "ray_num_cpus_zero": (["trainer.ray.num_cpus=0"], ["trainer.ray", "num_cpus"]),
    "object_store_beyond_memory": (["trainer.ray.object_store_memory_mb=100000000"],
                                   ["trainer.ray.object_store_memory_mb=100000000", "more than this machine's memory"]),
    "prometheus_port_out_of_range": (["trainer.monitoring.prometheus_port=70000"],
                                     ["trainer.monitoring.prometheus_port=70000", "[0, 65535]"]),
    "sequence_beyond_model_positions": (["data.max_prompt_length=200", "data.max_response_length=100"],
                                        ["data.max_prompt_length + data.max_response_length = 300", "256 positions"]),
}
# ---------------------------------------------------------------------------------------------- choices and keys
CHOICE_CASES = {
    "unknown_logger": (["trainer.logger=[console,wandbx]"], ["trainer.logger='wandbx'", "unknown"]),
    "unknown_resume_mode": (["trainer.resume_mode=sometimes"], ["trainer.resume_mode='sometimes'", "unknown"]),
    "unknown_truncation": (["data.truncation=middle"], ["data.truncation='middle'", "unknown"]),
    "dtype_typo": (["model.dtype=fp16"], ["model.dtype='fp16'", "unknown"]),
    "attention_typo": (["model.attn_implementation=flash"], ["model.attn_implementation='flash'", "unknown"]),
    "grad_sync_unknown": (["actor.fsdp.grad_sync=layer"], ["actor.fsdp.grad_sync='layer'", "unknown"]),
    "gather_once_unknown": (["actor.fsdp.gather_once=maybe"], ["actor.fsdp.gather_once='maybe'", "true, false or auto"]),
    "scheduler_unknown": (["actor.optim.lr_scheduler=linear"], ["actor.optim.lr_scheduler='linear'", "unknown"]),
    "reduce_dtype_fp16": (["actor.fsdp.reduce_dtype=float16"], ["actor.fsdp.reduce_dtype='float16'", "unknown"]),
    "kl_type_unknown": (["actor.kl_loss_type=k4"], ["actor.kl_loss_type='k4'", "unknown"]),
    "key_typo_suggests": (["actor.ppo_mini_batchsize=2"], ["actor.ppo_mini_batchsize", "did you mean",
                                                            "actor.ppo_mini_batch_size"]),
    "wrong_type": (["data.train_batch_size=abc"], ["data.train_batch_size", "abc"]),
    "unknown_synthetic_task": (["data.synthetic_task=nope"], ["data.synthetic_task='nope'", "unknown"]),
    "synthetic_option_typo": (["data.synthetic_task_kwargs={max_digit: 1}"],
                              ["data.synthetic_task_kwargs.max_digit=1", "no such option", "did you mean 'max_digits'"]),
    "synthetic_option_type": (["data.synthetic_task_kwargs={max_digits: two}"],
                              ["data.synthetic_task_kwargs.max_digits='two'", "must be int"]),
    "synthetic_option_value": (["data.synthetic_task_kwargs={max_digits: 12}"], ["max_digits=12"]),
}


def _plugin(tmp: Path, code: str) -> str:
    (tmp / "plugin.py").write_text(code)
    return str(tmp / "plugin.py")


# ---------------------------------------------------------------------------------------------- files on disk
def plugin_missing(tmp, model):
    return [f"trainer.plugins=[{tmp / 'nope.py'}]"], ["trainer.plugins=", "nope.py", "does not exist"]


def plugin_raises(tmp, model):
    plugin = _plugin(tmp, "raise RuntimeError('broken plugin')")
    return [f"trainer.plugins=[{plugin}]"], [
        "trainer.plugins=", "plugin.py", "importing it failed: RuntimeError: broken plugin"]


def plugin_module_missing(tmp, model):
    return ["trainer.plugins=[no_such_module_anywhere]"], ["trainer.plugins='no_such_module_anywhere'",
                                                           "importing it failed"]


def unknown_model_type(tmp, model):
    path = copy_model(model, tmp / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "llama9000"}))
    return [f"model.path={path}"], ["model.path", "model_type='llama9000'", "does not know"]


def truncated_weights(tmp, model):
    path = copy_model(model, tmp / "m")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    return [f"model.path={path}"], ["model.path", "model.safetensors is truncated"]


def weights_not_safetensors(tmp, model):
    path = copy_model(model, tmp / "m")
    (path / "model.safetensors").write_bytes(b"\x10\x00")
    return [f"model.path={path}"], ["model.path", "model.safetensors is not a safetensors file"]


def vocabulary_smaller_than_the_tokenizer(tmp, model):
    path = copy_model(model, tmp / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "vocab_size": 40}))  # the tokenizer has 80 ids
    return [f"model.path={path}"], ["model.path", "vocabulary has 40 ids but its tokenizer produces 80"]


def _with_heads(tmp, model, **heads):
    path = copy_model(model, tmp / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **heads}))
    return path


def tensor_parallel_not_dividing_the_heads(tmp, model):
    path = _with_heads(tmp, model, num_attention_heads=3, num_key_value_heads=1)
    return [f"model.path={path}", "rollout=vllm_cpu", "rollout.tensor_model_parallel_size=2"], [
        "rollout.tensor_model_parallel_size=2", "must divide the model's 3 attention heads"]


def tensor_parallel_not_fitting_the_kv_heads(tmp, model):
    path = _with_heads(tmp, model, num_attention_heads=6, num_key_value_heads=3)
    return [f"model.path={path}", "rollout=vllm_cpu", "rollout.tensor_model_parallel_size=2"], [
        "rollout.tensor_model_parallel_size=2", "must divide the model's 3 KV heads"]


def sequence_parallel_not_dividing_the_heads(tmp, model):
    path = _with_heads(tmp, model, num_attention_heads=3, num_key_value_heads=1)
    return [f"model.path={path}", "trainer.n_gpus_per_node=2", "actor.ulysses_sequence_parallel_size=2"], [
        "actor.ulysses_sequence_parallel_size=2", "must divide the 3 attention heads"]


def sequence_parallel_not_dividing_a_critics_heads(tmp, model):
    path = _with_heads(tmp, model, num_attention_heads=3, num_key_value_heads=1)  # the critic's own model
    return ["algorithm=gae", f"critic.model_path={path}", "critic.ppo_micro_batch_size_per_gpu=2",
            "trainer.n_gpus_per_node=2", "critic.ulysses_sequence_parallel_size=2"], [
        "critic.ulysses_sequence_parallel_size=2", "must divide the 3 attention heads", str(path)]


def router_replay_on_a_dense_model(tmp, model):
    return [f"model.path={model}", "actor.router_replay.mode=R3"], [
        "actor.router_replay.mode='R3'", "needs a mixture-of-experts model", "is dense"]


def router_replay_on_deepseek_style_routers(tmp, model):
    path = _with_heads(tmp, model, n_routed_experts=8)  # DeepSeek's key: its router returns scores, not a choice
    return [f"model.path={path}", "actor.router_replay.mode=R3"], [
        "actor.router_replay.mode='R3'", "DeepSeek-style routers"]


def _vlm(tmp: Path, drop: tuple[str, ...] = ()) -> Path:
    from hybridrl.utils.tiny_vlm import save_tiny_vlm

    path = save_tiny_vlm(tmp / "vlm")
    for name in drop:
        (path / name).unlink()
    return path


def _image_rows(tmp: Path, image: str) -> list[str]:
    row = {"data_source": "shapes", "prompt": [{"role": "user", "content": "<image>What colour?"}],
           "images": [{"bytes": None, "path": image}], "reward_model": {"ground_truth": "red"}}
    return train_files(jsonl_lines(tmp / "images.jsonl", [encoded(row)] * 8))


def image_missing(tmp, model):
    return [f"model.path={_vlm(tmp)}", *_image_rows(tmp, str(tmp / "gone.png"))], [
        "images.jsonl: row 0", "image 0", "gone.png' does not exist"]


def image_unreadable(tmp, model):
    (tmp / "bad.png").write_bytes(b"not an image")
    return [f"model.path={_vlm(tmp)}", *_image_rows(tmp, str(tmp / "bad.png"))], [
        "images.jsonl: row 0", "image 0", "cannot be decoded"]


def image_rows_for_a_text_model(tmp, model):
    from PIL import Image

    Image.new("RGB", (56, 56), "red").save(tmp / "red.png")
    return _image_rows(tmp, str(tmp / "red.png")), [
        "images.jsonl: row 0", "has 1 image(s)", "text-only model"]


def vision_model_without_its_image_processor(tmp, model):
    return [f"model.path={_vlm(tmp, drop=('preprocessor_config.json',))}"], [
        "model.path", "without its image processor", "preprocessor_config.json"]


def vision_model_on_vllm(tmp, model):
    return [f"model.path={_vlm(tmp)}", "rollout=vllm_cpu"], ["rollout.name='vllm'", "takes images"]


def vision_model_with_a_critic(tmp, model):
    return [f"model.path={_vlm(tmp)}", "algorithm=gae", "critic.ppo_micro_batch_size_per_gpu=2"], [
        "critic.enable=True", "does not read images"]


def vision_model_with_prompt_replay(tmp, model):
    return [f"model.path={_vlm(tmp)}", "data.replay.enable=true"], ["data.replay.enable=True", "without their images"]


def vision_model_of_an_unsupported_type(tmp, model):
    path = _vlm(tmp)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "llava"}))
    return [f"model.path={path}"], ["model.path", "vision-language model of type 'llava'", "qwen2_vl"]


def literal_image_token_in_a_prompt(tmp, model):
    row = {"data_source": "shapes", "prompt": [{"role": "user", "content": "<|image_pad|> what colour?"}],
           "reward_model": {"ground_truth": "red"}}
    return [f"model.path={_vlm(tmp)}", *train_files(jsonl_lines(tmp / "pad.jsonl", [encoded(row)] * 8))], [
        "pad.jsonl: row 0", "holds the model's image pad token itself", "<image>"]


def frozen_vision_tower_of_a_text_model(tmp, model):
    return ["actor.freeze_vision_tower=true"], ["actor.freeze_vision_tower=True", "text-only model"]


def tokenizer_path_not_a_directory(tmp, model):
    return [f"model.tokenizer_path={tmp / 'nope'}"], ["model.tokenizer_path", "is not a directory"]


def critic_model_missing(tmp, model):
    return ["algorithm=gae", f"critic.model_path={tmp / 'nope'}", "critic.ppo_micro_batch_size_per_gpu=2"], [
        "critic.model_path", "does not exist"]


def prompt_with_an_unknown_character(tmp, model):
    rows = good_rows()
    rows[5]["prompt"] = [{"role": "user", "content": "1+2=☃"}]
    return train_files(jsonl_lines(tmp / "train.jsonl", [encoded(row) for row in rows])), [
        "train.jsonl: row 5", "the tokenizer cannot encode this prompt"]


def prompt_is_a_number(tmp, model):
    rows = good_rows()
    rows[2]["prompt"] = 12
    return train_files(jsonl_lines(tmp / "train.jsonl", [encoded(row) for row in rows])), [
        "train.jsonl: row 2", "'prompt' must be chat messages or text"]


def data_file_is_a_directory(tmp, model):
    (tmp / "data.jsonl").mkdir()
    return train_files(tmp / "data.jsonl"), ["data.train_files", "data.jsonl", "file does not exist"]


def run_dir_is_a_file(tmp, model):
    (tmp / "run_file").write_text("x")
    return [f"trainer.default_local_dir={tmp / 'run_file'}"], ["trainer.default_local_dir", "regular file"]


def run_dir_under_a_file(tmp, model):
    (tmp / "run_file").write_text("x")
    return [f"trainer.default_local_dir={tmp / 'run_file' / 'run'}"], [
        "trainer.default_local_dir", "cannot be created", "run_file is a regular file"]


FILE_CASES = [plugin_missing, plugin_raises, plugin_module_missing, unknown_model_type, truncated_weights,
              weights_not_safetensors, vocabulary_smaller_than_the_tokenizer, tensor_parallel_not_dividing_the_heads,
              tensor_parallel_not_fitting_the_kv_heads, sequence_parallel_not_dividing_the_heads,
              sequence_parallel_not_dividing_a_critics_heads, router_replay_on_a_dense_model,
              router_replay_on_deepseek_style_routers,
              image_missing, image_unreadable, image_rows_for_a_text_model, vision_model_without_its_image_processor,
              vision_model_on_vllm, vision_model_with_a_critic, vision_model_with_prompt_replay,
              vision_model_of_an_unsupported_type, literal_image_token_in_a_prompt,
              frozen_vision_tower_of_a_text_model,
              tokenizer_path_not_a_directory,
              critic_model_missing, prompt_with_an_unknown_character,
              prompt_is_a_number, data_file_is_a_directory, run_dir_is_a_file, run_dir_under_a_file]


def refused(model_dir, tmp_path, overrides) -> str:
    """The one message a GRPO run with ``overrides`` is refused with, before any worker starts."""
    with pytest.raises(ValueError) as caught:
        RLTrainer(load_config(run_overrides(model_dir, tmp_path / "run", *overrides)))
    return str(caught.value)


@pytest.mark.parametrize("name", sorted(VALUE_CASES) + sorted(CHOICE_CASES))
def test_config_mistake_is_named(name, model_dir, tmp_path):
    overrides, phrases = {**VALUE_CASES, **CHOICE_CASES}[name]
    message = refused(model_dir, tmp_path, overrides)
    for phrase in phrases:
        assert phrase in message, message


@pytest.mark.parametrize("case", FILE_CASES, ids=[case.__name__ for case in FILE_CASES])
def test_file_mistake_is_named_before_workers_start(case, model_dir, tmp_path):
    overrides, phrases = case(tmp_path, model_dir)
    message = refused(model_dir, tmp_path, overrides)
    for phrase in phrases:
        assert phrase in message, message


@pytest.mark.parametrize("case", FILE_CASES, ids=[case.__name__ for case in FILE_CASES])
def test_hybridrl_config_refuses_what_train_refuses(case, model_dir, tmp_path, capsys):
    """`hybridrl config` runs the trainer's start-up checks too: the same refusal, exit 2, no config printed."""
    overrides, phrases = case(tmp_path, model_dir)
    trainer_message = refused(model_dir, tmp_path, overrides)
    capsys.readouterr()
    assert main(["config", *run_overrides(model_dir, tmp_path / "run", *overrides)]) == 2
    output = capsys.readouterr()
    assert trainer_message.splitlines()[-1] in output.err and "model:" not in output.out, output.err
    for phrase in phrases:
        assert phrase in output.err


# ---------------------------------------------------------------------------------------------- SFT and RM data
def sft_file(tmp: Path, rows: list[dict]) -> str:
    return str(jsonl_lines(tmp / "sft.jsonl", [encoded(row) for row in rows]))


def sft_rows() -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"{i}+1="}], "reward_model": {"ground_truth": str(i + 1)}}
            for i in range(8)]


SFT_CASES = {
    "prompt_is_a_number": (lambda rows: rows[3].update(prompt=7), ["sft.jsonl: row 3", "'prompt' must be chat"]),
    "prompt_is_a_single_dict": (lambda rows: rows[4].update(prompt={"role": "user", "content": "1+1="}),
                                ["sft.jsonl: row 4", "'prompt' must be chat messages or text, got dict"]),
    "target_too_long": (lambda rows: rows[6].update(reward_model={"ground_truth": "9" * 40}),
                        ["sft.jsonl: row 6", "target of 41 tokens", "data.max_response_length=8"]),
    "no_target": (lambda rows: rows[1].pop("reward_model"), ["sft.jsonl: row 1", "not an SFT row"]),
    "target_with_an_unknown_character": (lambda rows: rows[2].update(reward_model={"ground_truth": "3☃"}),
                                         ["sft.jsonl: row 2", "the tokenizer cannot encode this example"]),
}


@pytest.mark.parametrize("name", sorted(SFT_CASES))
def test_sft_row_mistake_is_named_before_any_step(name, model_dir, tmp_path):
    change, phrases = SFT_CASES[name]
    rows = sft_rows()
    change(rows)
    config = load_config([f"model.path={model_dir}", f"trainer.default_local_dir={tmp_path / 'run'}",
                          f"data.train_files=[{sft_file(tmp_path, rows)}]", "data.max_response_length=8",
                          "data.micro_batch_size_per_gpu=2", "data.train_batch_size=4"], "sft_trainer")
    with pytest.raises(ValueError) as caught:
        SFTTrainer(config)
    for phrase in phrases:
        assert phrase in str(caught.value), str(caught.value)


def test_preference_row_with_a_non_finite_margin_is_named(model_dir, tmp_path):
    rows = [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2), "margin": 1.0} for i in range(8)]
    rows[5]["margin"] = float("nan")
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")  # json writes NaN, and reads it back
    config = load_config([f"model.path={model_dir}", f"trainer.default_local_dir={tmp_path / 'run'}",
                          f"data.train_files=[{path}]", "data.train_batch_size=4", "data.micro_batch_size_per_gpu=2"],
                         "rm_trainer")
    with pytest.raises(ValueError, match=r"pairs.jsonl: row 5 .*'margin' must be a finite number, got nan"):
        RMTrainer(config)


# ---------------------------------------------------------------------------------------------- files the CLI reads
def test_a_user_yaml_with_a_syntax_error_names_the_file_and_line(tmp_path):
    conf = Path(__file__).resolve().parents[2] / "conf"
    shutil.copytree(conf, tmp_path / "conf")
    (tmp_path / "conf" / "mine.yaml").write_text("defaults:\n  - ppo_trainer\n  - _self_\nactor:\n  optim: {lr: 1e-5\n")
    with pytest.raises(ValueError, match=r"mine.yaml, line 6, column 1 is not valid YAML"):
        load_config([], "mine", conf_dir=tmp_path / "conf", check_paths=False)


def hybridrl_in_process(capsys, monkeypatch, *args: str) -> subprocess.CompletedProcess:
    """``hybridrl <args>`` through the command's ``main`` in this process (the console script's code; a refusal
    never reaches workers), as a finished process."""
    from hybridrl.cli import main

    monkeypatch.delenv("HYBRIDRL_TRACEBACK", raising=False)
    capsys.readouterr()
    status = main(list(args))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["hybridrl", *args], status, captured.out, captured.err)


def hybridrl(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    env.pop("HYBRIDRL_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "hybridrl.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=cwd)


@pytest.mark.parametrize("args, phrases", [
    (["train", "--no-check-paths", "--config-name", "sft_trainer", "data.synthetic_task=arithmetic"],
     ["--config-name=sft_trainer is a config of `hybridrl sft`", "not of `hybridrl train`"]),
    (["sft", "--no-check-paths", "--config-name", "ppo_trainer"], ["--config-name=ppo_trainer is a config of "
                                                                   "`hybridrl train`"]),
    (["plan", "--no-check-paths", "--steps", "-5"], ["--steps=-5: must be a positive count"]),
    (["plan", "--no-check-paths", "--price-per-gpu-hour", "-2"], ["--price-per-gpu-hour=-2.0: must be >= 0"]),
    (["config", "--config-name", "no_such_config"], ["--config-name='no_such_config'", "no no_such_config.yaml"]),
], ids=["sft_config_to_train", "rl_config_to_sft", "plan_negative_steps", "plan_negative_price",
        "unknown_config_name"])
def test_command_line_mistakes_exit_2_with_one_message(args, phrases, capsys, monkeypatch):
    process = hybridrl_in_process(capsys, monkeypatch, *args)
    assert process.returncode == 2 and "Traceback" not in process.stderr, process.stderr[-3000:]
    for phrase in phrases:
        assert phrase in process.stderr, process.stderr[-3000:]


def test_plan_refuses_a_decoder_it_does_not_model(tmp_path, capsys, monkeypatch):
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=64, n_head=2).save_pretrained(tmp_path / "gpt2")
    process = hybridrl_in_process(capsys, monkeypatch, "plan", "--no-check-paths", f"model.path={tmp_path / 'gpt2'}")
    assert process.returncode == 2 and "Traceback" not in process.stderr, process.stderr[-3000:]
    assert "model_type='gpt2'" in process.stderr and "Llama-style decoders" in process.stderr


def test_demo_refuses_a_grpo_mistake_before_its_sft_stage(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the demo writes under runs/ of where it runs
    process = hybridrl_in_process(capsys, monkeypatch, "demo", "rollout.n=1")
    assert process.returncode == 2 and "Traceback" not in process.stderr, process.stderr[-3000:]
    assert "rollout.n=1" in process.stderr and "needs rollout.n >= 2" in process.stderr
    assert "SFT done" not in process.stdout  # refused before the SFT stage ran


@pytest.mark.e2e
@pytest.mark.distributed
@pytest.mark.long
def test_a_run_logging_to_the_console_only_finishes_with_its_summary(model_dir, tmp_path):
    """``trainer.logger=[console]`` writes no metrics.jsonl; the end-of-run summary comes from the run itself."""
    process = hybridrl("train", "--no-check-paths", *run_overrides(model_dir, tmp_path / "run", "trainer.logger=[console]",
                                                                   "trainer.total_training_steps=2"))
    assert process.returncode == 0, process.stderr[-3000:]
    assert "== hybridrl train ==" in process.stdout and "step time breakdown" in process.stdout
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and (tmp_path / "run" / "learning_curves.png").is_file()
