"""``VLLMRollout`` on the real vLLM CPU build (in-process), against plain transformers on the same tiny model.

One engine serves the module (fp32, so greedy tokens match transformers exactly). Tests that change its weights
restore the original ones before they end.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys

import pytest
import torch
from vllm_helpers import engine, hf_model, model_dir, tokenizer  # noqa: F401 (fixtures)

from hybridrl.config.rollout_schema import CPU_KV_BLOCK_SIZE
from hybridrl.config.schema import RolloutConfig
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.kv_budget import kv_bytes_per_token, kv_cache_blocks, kv_cache_mb_for, sequences_held
from hybridrl.rollout.vllm_engine import VLLMRollout
from hybridrl.utils.tiny_model import encode_chat
from hybridrl.modeling.sequences import response_log_probs

pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[cpu]')")
pytestmark = pytest.mark.distributed

PROMPTS = ["12+34=", "what is 7*8?", "hello there", "x"]
# Longer than one KV block (32 tokens on CPU; 128 at vLLM's own default), so the prefix cache holds prompt KV.
LONG_PROMPTS = ["the quick brown fox jumps over the lazy dog " * 3 + f"number {i}" for i in range(3)]
# Between one and four 32-token blocks: shared by a prompt's samples at hybridrl's CPU block size, not at vLLM's.
MEDIUM_PROMPTS = [f"the quick brown fox number {i} jumps over the lazy dog" for i in range(3)]
MAX_NEW_TOKENS = 12
LD_PRELOAD_BEFORE = os.environ.get("LD_PRELOAD")  # read before the module's engine starts
LOG_PROB_TOLERANCE = 1e-4  # fp32 engine vs fp32 trainer; measured max ≈ 5e-7 nats


def prompt_batch(tokenizer, prompts) -> Batch:
    encoded = tokenizer.pad({"input_ids": encode_chat(tokenizer, prompts)}, return_tensors="pt")
    return Batch(tensors={Fields.INPUT_IDS: encoded["input_ids"], Fields.ATTENTION_MASK: encoded["attention_mask"]},
                 non_tensors={Fields.UID: [f"p{i}" for i in range(len(prompts))]})


def transformers_greedy(model, tokenizer, prompts, max_new_tokens=MAX_NEW_TOKENS) -> torch.Tensor:
    """``[B, R]`` greedy responses of plain ``generate``, one unpadded prompt at a time, pad-filled after EOS."""
    rows = []
    for ids in encode_chat(tokenizer, prompts):
        output = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id)[0, len(ids):]
        padding = output.new_full((max_new_tokens - len(output),), tokenizer.pad_token_id)
        rows.append(torch.cat([output, padding]))
    return torch.stack(rows)


@torch.no_grad()
def trainer_log_probs(model, rollout: Batch, temperature: float) -> torch.Tensor:
    """``[B·n, R]`` the trainer's log-probs of the rollout's responses (``workers.sequences``)."""
    log_probs, _ = response_log_probs(model, rollout[Fields.INPUT_IDS], rollout[Fields.ATTENTION_MASK],
                                      MAX_NEW_TOKENS, temperature=temperature)
    return log_probs


def greedy(engine, tokenizer, prompts) -> torch.Tensor:
    return engine.generate(prompt_batch(tokenizer, prompts),
                           SamplingParams(max_new_tokens=MAX_NEW_TOKENS, do_sample=False))[Fields.RESPONSES]


def perturbed(model, scale=0.05, seed=1):
    """A copy of ``model`` with Gaussian noise on every weight (a stand-in for an optimizer update)."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return other


def test_greedy_matches_transformers_and_layout(engine, tokenizer, hf_model):
    prompts = prompt_batch(tokenizer, PROMPTS)
    rollout = engine.generate(prompts, SamplingParams(max_new_tokens=MAX_NEW_TOKENS, do_sample=False))
    assert torch.equal(rollout[Fields.RESPONSES], transformers_greedy(hf_model, tokenizer, PROMPTS))
    assert torch.equal(rollout[Fields.PROMPTS], prompts[Fields.INPUT_IDS])
    assert torch.equal(rollout[Fields.INPUT_IDS], torch.cat([prompts[Fields.INPUT_IDS], rollout[Fields.RESPONSES]], 1))
    assert rollout[Fields.ROLLOUT_LOG_PROBS].shape == (len(PROMPTS), MAX_NEW_TOKENS)
    gap = (trainer_log_probs(hf_model, rollout, 1.0) - rollout[Fields.ROLLOUT_LOG_PROBS]).abs()  # greedy: T = 1
    assert float(gap.max()) < LOG_PROB_TOLERANCE


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_rollout_log_probs_match_trainer(engine, tokenizer, hf_model, temperature):
    rollout = engine.generate(prompt_batch(tokenizer, PROMPTS),
                              SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=temperature, seed=5))
    trainer = trainer_log_probs(hf_model, rollout, temperature)
    mask = rollout[Fields.RESPONSE_MASK].bool()
    gap = (trainer - rollout[Fields.ROLLOUT_LOG_PROBS]).abs()[mask]
    print(f"T={temperature}: |rollout - trainer| max {gap.max():.2e} mean {gap.mean():.2e} over {mask.sum()} tokens")
    assert float(gap.max()) < LOG_PROB_TOLERANCE


def test_samples_of_a_prompt_share_its_whole_kv_blocks_and_match_the_trainer(engine, tokenizer, hf_model):
    """On CPU the engine's KV blocks are 32 tokens (``rollout.block_size`` unset; vLLM's own CPU default, 128, would
    share nothing of these prompts): each prompt's first sample prefills it, the other three take its whole blocks
    from the prefix cache — and their log-probs still match the trainer's (the numerics gate)."""
    assert kv_cache_blocks(engine.llm)[1] == CPU_KV_BLOCK_SIZE
    prompts = prompt_batch(tokenizer, MEDIUM_PROMPTS)
    lengths = [len(ids) for ids in encode_chat(tokenizer, MEDIUM_PROMPTS)]
    assert all(CPU_KV_BLOCK_SIZE < length < 128 for length in lengths), lengths
    engine.llm.reset_prefix_cache()
    ids = [[engine.requests.submit(encode_chat(tokenizer, [text])[0], SamplingParams(max_new_tokens=4, seed=sample),
                                   request_id=f"shared-{index}-{sample}") for sample in range(4)]
           for index, text in enumerate(MEDIUM_PROMPTS)]
    cached = {completion.request_id: completion.cached_prompt_tokens for completion in engine.requests.run()}
    for prompt_ids, length in zip(ids, lengths):
        whole_blocks = length // CPU_KV_BLOCK_SIZE * CPU_KV_BLOCK_SIZE
        assert cached[prompt_ids[0]] == 0, cached
        assert [cached[request] for request in prompt_ids[1:]] == [whole_blocks] * 3, (length, cached)
    rollout = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=9))
    mask = rollout[Fields.RESPONSE_MASK].bool()
    gap = (trainer_log_probs(hf_model, rollout, 1.0) - rollout[Fields.ROLLOUT_LOG_PROBS]).abs()[mask]
    assert float(gap.max()) < LOG_PROB_TOLERANCE


def test_top_p_log_probs_are_of_the_truncated_distribution(engine, tokenizer, hf_model):
    """vLLM reports log-probs renormalised over the nucleus: never below the trainer's, above it somewhere."""
    rollout = engine.generate(prompt_batch(tokenizer, PROMPTS),
                              SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=0.7, top_p=0.8, seed=5))
    trainer = trainer_log_probs(hf_model, rollout, 0.7)
    excess = (rollout[Fields.ROLLOUT_LOG_PROBS] - trainer)[rollout[Fields.RESPONSE_MASK].bool()]
    assert float(excess.min()) > -LOG_PROB_TOLERANCE and float(excess.max()) > 0.01


def test_n_samples_are_grouped_and_seeded(engine, tokenizer):
    prompts = prompt_batch(tokenizer, PROMPTS[:3])
    params = SamplingParams(n=3, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=11)
    first, again = engine.generate(prompts, params), engine.generate(prompts, params)
    other = engine.generate(prompts, params.with_seed(12))
    assert len(first) == 9 and list(first[Fields.UID]) == ["p0"] * 3 + ["p1"] * 3 + ["p2"] * 3
    assert torch.equal(first[Fields.PROMPTS], prompts[Fields.INPUT_IDS].repeat_interleave(3, dim=0))
    assert torch.equal(first[Fields.RESPONSES], again[Fields.RESPONSES])
    assert torch.equal(first[Fields.ROLLOUT_LOG_PROBS], again[Fields.ROLLOUT_LOG_PROBS])
    assert not torch.equal(first[Fields.RESPONSES], other[Fields.RESPONSES])
    group = first[Fields.RESPONSES][:3]
    assert not (torch.equal(group[0], group[1]) and torch.equal(group[1], group[2]))  # samples of a prompt differ


def test_greedy_with_n_repeats_the_greedy_response(engine, tokenizer):
    """vLLM refuses greedy n > 1; the engine repeats the one greedy response n times (what HF ``generate`` gives)."""
    rollout = engine.generate(prompt_batch(tokenizer, PROMPTS[:2]),
                              SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, do_sample=False))
    responses = rollout[Fields.RESPONSES]
    assert torch.equal(responses[0], responses[1]) and torch.equal(responses[2], responses[3])
    assert torch.equal(responses[::2], greedy(engine, tokenizer, PROMPTS[:2]))


def test_weight_sync_follows_new_weights_and_restores(engine, tokenizer, hf_model):
    updated = perturbed(hf_model)
    before = greedy(engine, tokenizer, LONG_PROMPTS)  # also fills the prefix cache with the old weights' KV
    assert torch.equal(before, transformers_greedy(hf_model, tokenizer, LONG_PROMPTS))
    try:
        stats = engine.update_weights(updated.named_parameters())
        assert stats.num_tensors == len(list(updated.parameters()))
        assert stats.num_bytes == sum(p.numel() * 4 for p in updated.parameters())
        after = greedy(engine, tokenizer, LONG_PROMPTS)
        assert torch.equal(after, transformers_greedy(updated, tokenizer, LONG_PROMPTS))
        assert not torch.equal(after, before)
        engine.update_weights(updated.named_parameters())  # syncing the same weights again changes nothing
        assert torch.equal(greedy(engine, tokenizer, LONG_PROMPTS), after)
    finally:
        engine.update_weights(hf_model.named_parameters())
    assert torch.equal(greedy(engine, tokenizer, LONG_PROMPTS), before)


def test_stale_prefix_cache_without_reset_gives_wrong_tokens(engine, tokenizer, hf_model):
    """Why ``update_weights`` resets the prefix cache: loading weights alone leaves the old prompt KV in use."""
    updated = perturbed(hf_model, seed=2)
    expected = transformers_greedy(updated, tokenizer, LONG_PROMPTS)
    greedy(engine, tokenizer, LONG_PROMPTS)  # cache the prompts' KV under the current weights
    try:
        engine.llm.collective_rpc("hybridrl_load_weights", args=(iter(list(updated.named_parameters())),))
        assert not torch.equal(greedy(engine, tokenizer, LONG_PROMPTS), expected)
        engine.llm.reset_prefix_cache()
        assert torch.equal(greedy(engine, tokenizer, LONG_PROMPTS), expected)
    finally:
        engine.update_weights(hf_model.named_parameters())


def test_responses_end_at_eos(engine, tokenizer, hf_model):
    """Weights that make EOS likely: responses stop at it, are pad-filled after it, and match transformers."""
    eos_prone = copy.deepcopy(hf_model)
    frequent = int(greedy(engine, tokenizer, PROMPTS).flatten().mode().values)
    with torch.no_grad():  # EOS scores like the most frequent greedy token, a little higher where that one wins
        eos_prone.lm_head.weight[tokenizer.eos_token_id] = 1.2 * eos_prone.lm_head.weight[frequent]
    try:
        engine.update_weights(eos_prone.named_parameters())
        rollout = engine.generate(prompt_batch(tokenizer, PROMPTS),
                                  SamplingParams(max_new_tokens=MAX_NEW_TOKENS, do_sample=False))
    finally:
        engine.update_weights(hf_model.named_parameters())
    responses, mask = rollout[Fields.RESPONSES], rollout[Fields.RESPONSE_MASK]
    assert torch.equal(responses, transformers_greedy(eos_prone, tokenizer, PROMPTS))
    lengths = mask.sum(dim=1)
    ended = lengths < MAX_NEW_TOKENS
    assert bool(ended.any())
    for row in torch.nonzero(ended).flatten().tolist():
        assert int(responses[row, lengths[row] - 1]) == tokenizer.eos_token_id
        assert bool((responses[row, lengths[row]:] == tokenizer.pad_token_id).all())
        assert bool((rollout[Fields.ROLLOUT_LOG_PROBS][row, lengths[row]:] == 0).all())


def test_tensor_parallel_refused_outside_a_process_group(model_dir):
    rollout = RolloutConfig(name="vllm", tensor_model_parallel_size=2, kv_cache_memory_mb=64)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2 needs a process group"):
        VLLMRollout(str(model_dir), pad_token_id=0, eos_token_ids=[1], rollout=rollout, max_model_len=64,
                    dtype="float32", seed=0)


def test_engine_leaves_process_settings_alone(engine):
    """vLLM's CPU start-up disables torch.set_num_threads and adds libgomp to LD_PRELOAD; the engine undoes both."""
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    assert torch.get_num_threads() == threads + 1
    torch.set_num_threads(threads)
    assert os.environ.get("LD_PRELOAD") == LD_PRELOAD_BEFORE


def test_the_engine_binds_no_memory_on_a_machine_of_one_memory_node(engine, capfd):
    """vLLM's bind (a C++ warning on every rank: 'NUMA binding: Using MEMBIND policy ...') is skipped where the process
    may use one memory node, so ``make demo`` does not print it; vLLM's own op still warns when called."""
    from vllm.v1.worker.cpu_worker import get_visible_memory_node

    nodes = get_visible_memory_node()
    if len(nodes) != 1:
        pytest.skip(f"this machine has memory nodes {nodes}: vLLM binds there, as it should")
    bind = torch.ops._C.init_cpu_memory_env
    assert bind._hybridrl_one_node  # the engine's start-up patched it
    capfd.readouterr()
    bind(list(nodes))
    assert "NUMA binding" not in capfd.readouterr().err
    bind.__wrapped__(list(nodes))
    assert "NUMA binding" in capfd.readouterr().err


def test_a_model_class_vllms_transformers_backend_rewrote_keeps_the_process_from_serving_again(monkeypatch):
    """vLLM serves a model it has no implementation of (OLMo-2) by decorating the Hugging Face class in place; its
    ``__init__`` then needs a vLLM config, so a parked process that did this cannot build that model again. The
    decorator here is vLLM's own, on a subclass in a throwaway module (the real class stays as it is)."""
    import types

    from transformers.models.olmo2.modeling_olmo2 import Olmo2Model
    from vllm.compilation.decorators import support_torch_compile

    from hybridrl.runtime.reuse import classes_rewritten_by_vllm

    module = types.ModuleType("transformers.models.hybridrl_probe")
    probe = type("ProbeModel", (Olmo2Model,), {"__module__": module.__name__})
    module.ProbeModel = probe
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert "ProbeModel" not in classes_rewritten_by_vllm()
    support_torch_compile(probe)
    assert "ProbeModel" in classes_rewritten_by_vllm()


def test_release_and_resume_are_noops_on_cpu(engine, tokenizer):
    before = greedy(engine, tokenizer, PROMPTS)
    engine.release_memory()
    engine.resume()
    assert torch.equal(greedy(engine, tokenizer, PROMPTS), before)


def test_an_unset_cpu_budget_holds_max_num_seqs_sequences_in_vllms_own_blocks(engine, model_dir, caplog):
    """The module's engine leaves ``rollout.kv_cache_memory_mb`` unset: vLLM's real cache must hold
    ``max_num_seqs`` (32) sequences of ``max_model_len`` (200) tokens, with blocks of the bytes counted here."""
    num_blocks, block_size = kv_cache_blocks(engine.llm)
    per_token = kv_bytes_per_token(str(model_dir), torch.float32)
    assert engine.kv_cache_mb == kv_cache_mb_for(32, 200, per_token, block_size)
    assert num_blocks == (engine.kv_cache_mb << 20) // (block_size * per_token)  # vLLM's page = our bytes
    assert sequences_held(num_blocks, 200, block_size) >= 32
    with caplog.at_level("WARNING", logger="hybridrl.rollout.vllm_engine"):
        engine._warn_if_cache_runs_waves(32)
        engine._warn_if_cache_runs_waves(1000)  # split by max_num_seqs (32), which the cache holds: not its fault
    assert caplog.text == "" and "waves" not in engine._noted
    configured = engine.rollout  # the same engine under a scheduler cap above what its cache holds: the cache splits
    engine.rollout = dataclasses.replace(configured, max_num_seqs=2000)
    try:
        with caplog.at_level("WARNING", logger="hybridrl.rollout.vllm_engine"):
            engine._warn_if_cache_runs_waves(1000)
    finally:
        engine.rollout = configured
        engine._noted.discard("waves")
    needed = kv_cache_mb_for(1000, 200, per_token, block_size)
    assert "but this generation has 1000" in caplog.text and f"kv_cache_memory_mb >= {needed}" in caplog.text
