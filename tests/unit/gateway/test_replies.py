"""The gateway's text side without an engine: tool calls read from the model's text, what a stream may send before a
stop string or a tool call could still begin, templates' argument objects, and when two conversations are the same."""

from __future__ import annotations

import json

from hybridrl.gateway.replies import cut_at_stop, for_template, reply_message, streamable
from hybridrl.gateway.sessions import same_messages


def test_a_reply_with_hermes_blocks_becomes_tool_calls_and_the_text_before_them():
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
    reply, calls_tools = reply_message(text, with_tools=True)
    assert calls_tools and reply["content"] == "Let me compute."
    [call] = reply["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "12*7"}
    assert reply_message(text, with_tools=False) == ({"role": "assistant", "content": text}, False)
    broken = "<tool_call>{not json</tool_call>"
    assert reply_message(broken, with_tools=True) == ({"role": "assistant", "content": broken}, False)


def test_a_stream_holds_back_what_could_still_become_a_stop_string_or_a_tool_call():
    holds = ["STOP", "<tool_call>"]
    assert streamable("hello", holds) == "hello"
    assert streamable("hello ST", holds) == "hello "
    assert streamable("hello <tool", holds) == "hello "
    assert streamable("hello <tool_call>{", holds) == "hello "
    assert streamable("a STOP b", holds) == "a "
    assert cut_at_stop("a STOP b <x>", ["<x>", "STOP"]) == "a "
    assert cut_at_stop("nothing", ["STOP"]) is None


def test_templates_get_argument_objects_and_sessions_compare_arguments_as_json():
    sent = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}]}
    [rendered] = for_template([sent])
    assert rendered["tool_calls"][0]["function"]["arguments"] == {"b": 1, "a": 2}
    echoed = {**sent, "content": "", "refusal": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 2, "b": 1}'}}]}
    assert same_messages([sent], [echoed])
    renamed = {**echoed, "tool_calls": [{**echoed["tool_calls"][0], "id": "call_2"}]}
    assert same_messages([sent], [renamed])  # ids name calls; the model's text of them is what was sampled
    other = {**echoed, "tool_calls": [{**echoed["tool_calls"][0], "function": {"name": "f", "arguments": "{}"}}]}
    assert not same_messages([sent], [other])
    assert not same_messages([sent], [sent, sent])

