"""The OpenAI-compatible gateway (``hybridrl/gateway``) over a real vLLM engine (CPU build, tiny fp32 model with a
tool-calling chat template), called with the real ``openai`` client: what it answers is exactly what the engine
samples for the template's prompt ids; streaming, ``n``, stop strings and log-probs; OpenAI-style errors; sessions
stitched token for token, continued or split."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from transformers import AutoTokenizer
from vllm_helpers import cpu_engine

from hybridrl.agents.trajectory import ChatRenderer
from hybridrl.gateway.app import Gateway
from hybridrl.gateway.episodes import AgentResult, check_agent, run_episodes
from hybridrl.gateway.service import GatewayBackend, GatewayService
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.server import ReplicaServer
from hybridrl.utils.tiny_model import save_tiny_model

openai = pytest.importorskip("openai", reason="needs the openai client (pip install 'hybridrl[test]')")
pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[cpu]')")
pytestmark = pytest.mark.distributed

MAX_MODEL_LEN = 256
USER = [{"role": "user", "content": "12*7="}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("gateway") / "model", tool_chat=True)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def stack(model_dir, tokenizer):
    """The engine, its replica server, the gateway service and its HTTP server."""
    engine = cpu_engine(model_dir, tokenizer, max_model_len=MAX_MODEL_LEN)
    server = ReplicaServer(engine.requests, version=lambda: engine.policy_version)
    service = GatewayService(GatewayBackend(server, tokenizer, engine.eos_token_ids, MAX_MODEL_LEN,
                                            model_name="tiny", max_tokens=64))
    gateway = Gateway(service)
    yield engine, server, service, gateway
    gateway.close()
    server.close()
    engine.close()


@pytest.fixture
def client(stack):
    return openai.OpenAI(base_url=stack[3].base_url, api_key="unused", max_retries=0)


def direct(server, prompt_ids, params):
    return asyncio.run(server.generate(prompt_ids, params))


def test_a_chat_reply_is_what_the_engine_samples_for_the_templates_prompt(stack, client, tokenizer):
    _, server, _, _ = stack
    response = client.chat.completions.create(model="anything", messages=USER, max_tokens=16, seed=5,
                                              temperature=0.9, logprobs=True)
    prompt = ChatRenderer(tokenizer).prompt_ids(USER)
    expected = direct(server, prompt, SamplingParams(max_new_tokens=16, temperature=0.9, seed=5))
    choice = response.choices[0]
    assert response.model == "tiny" and response.model_extra["prompt_token_ids"] == prompt
    assert choice.model_extra["token_ids"] == expected.token_ids
    assert [entry.logprob for entry in choice.logprobs.content] == expected.log_probs
    stop_dropped = expected.token_ids[:-1] if expected.finish_reason == "stop" else expected.token_ids
    assert choice.message.content == tokenizer.decode(stop_dropped, skip_special_tokens=False)
    assert choice.finish_reason == ("length" if expected.finish_reason == "length" else "stop")
    assert response.usage.prompt_tokens == len(prompt)
    assert response.usage.completion_tokens == len(expected.token_ids)
    assert [model.id for model in client.models.list()] == ["tiny"]


def test_a_stream_adds_up_to_the_whole_reply_and_n_choices_are_seeded_in_turn(client):
    whole = client.chat.completions.create(model="m", messages=USER, max_tokens=24, seed=11)
    chunks = list(client.chat.completions.create(model="m", messages=USER, max_tokens=24, seed=11, stream=True))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    several = client.chat.completions.create(model="m", messages=USER, max_tokens=24, seed=11, n=3)
    assert [choice.index for choice in several.choices] == [0, 1, 2]
    assert several.choices[0].model_extra["token_ids"] == whole.choices[0].model_extra["token_ids"]
    second = client.chat.completions.create(model="m", messages=USER, max_tokens=24, seed=12)
    assert several.choices[1].model_extra["token_ids"] == second.choices[0].model_extra["token_ids"]


def test_a_stop_string_cuts_the_text_and_ends_the_choice(client):
    free = client.chat.completions.create(model="m", messages=USER, max_tokens=40, seed=3, temperature=1.0)
    text = free.choices[0].message.content
    assert len(text) >= 6, text
    stop = text[3:5]
    cut = client.chat.completions.create(model="m", messages=USER, max_tokens=40, seed=3, stop=[stop])
    assert cut.choices[0].message.content == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model="m", messages=USER, max_tokens=40, seed=3, stop=stop, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed) == text[:text.index(stop)]


@pytest.mark.parametrize(("body", "status", "names"), [
    ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
    ({"model": "m", "messages": []}, 400, "messages"),
    ({"model": "m", "messages": USER, "max_tokens": 65}, 400, "over the gateway's limit of 64"),
    ({"model": "m", "messages": USER, "top_logprobs": 3}, 400, "top_logprobs > 0 is not supported"),
    ({"model": "m", "messages": USER, "tool_choice": "required"}, 400, "tool_choice"),
    ({"model": "m", "messages": USER, "n": 0}, 400, "n:"),
    ({"model": "m", "messages": [{"role": "user", "content": "1" * 400}]}, 400, "context is 256"),
    ({"model": "m", "prompt": [1, 99999]}, 400, "token id 99999 is outside the vocabulary"),
    ({"model": "m", "messages": [*USER, {"role": "tool", "tool_call_id": "call_9", "content": "4"}]}, 400,
     "messages[1].tool_call_id='call_9' answers no tool call"),
], ids=["role", "no_messages", "max_tokens", "top_logprobs", "tool_choice", "n", "too_long", "bad_token",
        "tool_answering_no_call"])
def test_bad_requests_get_an_openai_error_body_naming_the_field(stack, body, status, names):
    path = "/completions" if "prompt" in body else "/chat/completions"
    response = httpx.post(stack[3].base_url + path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert names in error["message"] and error["type"] == "invalid_request_error"
    assert "Traceback" not in response.text


def test_a_served_gateway_refuses_another_model_name_with_openais_404(stack, client):
    """``hybridrl serve`` answers only its own model name (OpenAI and vLLM say 404 otherwise); a trainer's gateway
    answers whatever name the agent sends (every other test here sends ``m``)."""
    service = stack[2]
    service.only_its_model_name = True
    try:
        with pytest.raises(openai.NotFoundError) as refused:
            client.chat.completions.create(model="gpt-4o", messages=USER, max_tokens=4)
        assert refused.value.body["code"] == "model_not_found" and "`gpt-4o` does not exist" in refused.value.message
        assert client.chat.completions.create(model="tiny", messages=USER, max_tokens=4).choices
    finally:
        service.only_its_model_name = False


def test_a_refused_streamed_request_gets_its_4xx_before_any_event(stack):
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "1" * 400}]}
    response = httpx.post(stack[3].base_url + "/chat/completions", json=body)
    assert response.status_code == 400 and "context is 256" in response.json()["error"]["message"]


def test_malformed_json_and_the_openai_client_see_a_400(stack, client):
    response = httpx.post(stack[3].base_url + "/chat/completions", content=b"{not json",
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and "error" in response.json()
    with pytest.raises(openai.BadRequestError, match="messages.0.role"):
        client.chat.completions.create(model="m", messages=[{"role": "robot", "content": "x"}])


def test_a_gateway_with_a_key_refuses_requests_without_it_and_off_loopback_needs_one(stack):
    _, _, service, _ = stack
    with pytest.raises(ValueError, match="set an api key"):
        Gateway(service, host="0.0.0.0")
    with Gateway(service, api_key="s3cret") as keyed:
        assert httpx.get(keyed.base_url + "/models").status_code == 401
        good = openai.OpenAI(base_url=keyed.base_url, api_key="s3cret", max_retries=0)
        assert good.models.list().data[0].id == "tiny"


def test_a_session_over_three_turns_is_one_training_sequence_exactly_as_sampled(stack, tokenizer):
    """Each call continues the last one's ids (the agent's copy of a reply is never encoded again); the stitched
    sequence is every call's sampled ids with the template's ids for the tool results between them (no loss)."""
    _, _, service, gateway = stack
    client = openai.OpenAI(base_url=gateway.session_url("episode-1"), api_key="unused", max_retries=0)
    messages = list(USER)
    for turn in range(3):
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=12, seed=turn)
        messages += [reply.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "content": f"result {turn}"}]
    record = service.take_session("episode-1")
    assert [call.parent for call in record.calls] == [None, 0, 1]
    assert (record.continued, record.split) == (2, 0)
    for call in record.calls[1:]:
        parent = record.calls[call.parent]
        assert call.prompt_ids == parent.prompt_ids + parent.completion_ids + call.observation_ids
    [sequence] = record.sequences()
    calls = record.calls
    assert sequence.prompt_ids == calls[0].prompt_ids
    assert sequence.prompt_ids + sequence.response_ids == calls[2].prompt_ids + calls[2].completion_ids
    sampled = [token for token, mask in zip(sequence.response_ids, sequence.response_mask) if mask]
    assert sampled == calls[0].completion_ids + calls[1].completion_ids + calls[2].completion_ids
    assert [lp for lp, mask in zip(sequence.log_probs, sequence.response_mask) if mask] == \
        calls[0].log_probs + calls[1].log_probs + calls[2].log_probs
    # the tool result's ids are the template's: "<|tool|>result 0<|assistant|>" after the model's stop token
    expected = tokenizer.encode("<|tool|>result 0<|assistant|>", add_special_tokens=False)
    assert calls[1].observation_ids[-len(expected):] == expected


def test_an_edited_conversation_starts_a_new_sequence_never_a_retokenised_one(stack):
    _, _, service, gateway = stack
    client = openai.OpenAI(base_url=gateway.session_url("episode-2"), api_key="unused", max_retries=0)
    first = client.chat.completions.create(model="m", messages=USER, max_tokens=8, seed=1)
    edited = [{"role": "user", "content": "summary: 12*7"}, first.choices[0].message.model_dump(exclude_none=True),
              {"role": "user", "content": "go on"}]
    client.chat.completions.create(model="m", messages=edited, max_tokens=8, seed=2)
    record = service.take_session("episode-2")
    assert [call.parent for call in record.calls] == [None, None]
    assert (record.continued, record.split) == (0, 1)
    assert [sequence.calls for sequence in record.sequences()] == [[0], [1]]


def test_concurrent_sessions_are_recorded_apart(stack):
    _, _, service, gateway = stack

    async def episode(index: int) -> None:
        client = openai.AsyncOpenAI(base_url=gateway.session_url(f"many-{index}"), api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": f"{index}+{index}="}]
        for turn in range(2):
            reply = await client.chat.completions.create(model="m", messages=messages, max_tokens=6, seed=turn)
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": "ok"}]
        await client.close()

    async def everyone():
        await asyncio.gather(*(episode(index) for index in range(8)))
    asyncio.run(everyone())
    for index in range(8):
        record = service.take_session(f"many-{index}")
        assert [call.parent for call in record.calls] == [None, 0]
        assert len(record.sequences()) == 1


async def two_turn_agent(row, client):
    """Plain OpenAI-client agent code: ask, feed a tool result back, ask again; reward from the row."""
    messages = [{"role": "user", "content": row["question"]}]
    for turn in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8, seed=turn)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "content": "42"}]
    return AgentResult(reward=row["reward"], info={"turns": 2.0})


def test_users_agent_functions_run_as_episodes_and_their_failures_end_only_their_own(stack):
    _, _, _, gateway = stack

    async def raises(row, client):
        await client.chat.completions.create(model="policy", messages=USER, max_tokens=4)
        raise KeyError("no such tool")

    async def hangs(row, client):
        await asyncio.sleep(30)

    async def by_row(row, client):
        return await {"ok": two_turn_agent, "raises": raises, "hangs": hangs}[row["kind"]](row, client)

    async def bad_reward(row, client):
        return "high"

    rows = [{"kind": "ok", "question": f"{i}*3=", "reward": float(i)} for i in range(6)]
    rows[2], rows[4] = {"kind": "raises"}, {"kind": "hangs"}
    episodes = asyncio.run(run_episodes(by_row, rows, gateway, timeout_s=5.0))
    for index, episode in enumerate(episodes):
        if index == 2:
            assert episode.failure == "the agent raised KeyError: 'no such tool'" and episode.reward is None
            assert len(episode.record.calls) == 1
        elif index == 4:
            assert episode.failure == "the agent took longer than 5 s"
        else:
            assert episode.failure is None and episode.reward == float(index) and episode.info == {"turns": 2.0}
            assert [call.parent for call in episode.record.calls] == [None, 0]
            [sequence] = episode.record.sequences()
            assert sum(sequence.response_mask) == sum(len(call.completion_ids) for call in episode.record.calls)
    [bad] = asyncio.run(run_episodes(bad_reward, [{}], gateway))
    assert bad.failure == "the agent returned 'high': a reward must be a finite number, None or an AgentResult"


def test_an_agent_that_is_not_an_async_function_of_row_and_client_is_refused_naming_it():
    def sync_agent(row, client):
        return 1.0

    async def one_argument(row):
        return 1.0
    with pytest.raises(TypeError, match="rollout.agent: expected `async def agent"):
        check_agent(sync_agent, "rollout.agent")
    with pytest.raises(TypeError, match="`one_argument` must take \\(row, client\\)"):
        check_agent(one_argument)
