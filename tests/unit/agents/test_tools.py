"""Tools from plain functions: schema from signature and docstring, validated calls with timeouts that never raise,
Hermes-format tool-call parsing and formatting, the calculator and the sandboxed python tool."""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import replace

import pytest

from hybridrl.agents.builtin_tools import (BUILTIN_TOOLS, calculator, python_tool, run_python_program,
                                          sandbox_timeout)
from hybridrl.agents.tools import (MAX_CONTENT_CHARS, TRUNCATION_MARKER, ToolCall, format_tool_call, parse_tool_calls,
                                   tool_from_function)


def scale(count: int, factor: float, label: str, verbose: bool = False) -> str:
    """Scale a count by a factor.

    The label is shown in front of the result.

    Args:
        count: how many items there are.
        factor: what to multiply by; a value below one
            shrinks the count.
        label: text shown in front of the result.
        verbose: whether to show the inputs too.

    Returns:
        The labelled result.
    """
    result = f"{label}: {count * factor:g}"
    return f"{result} ({count} x {factor:g})" if verbose else result


def failing(reason: str) -> str:
    """Always fail.

    Args:
        reason: the message of the exception.
    """
    raise KeyError(reason)


GATE = threading.Event()
FINISHED: list[str] = []


def sleepy(seconds: float) -> str:
    """Wait for the test's gate, at most ``seconds``.

    Args:
        seconds: how long to wait at most.
    """
    GATE.wait(seconds)
    FINISHED.append("awake")
    return "awake"


def chatty(repeat: int) -> str:
    """Return a long text.

    Args:
        repeat: how many characters.
    """
    return "x" * repeat


# -------------------------------------------------------------------------------------------------------- schema


def test_schema_from_signature_and_docstring():
    tool = tool_from_function(scale, timeout_s=2.5)
    assert tool.name == "scale" and tool.timeout_s == 2.5 and tool.function is scale
    assert tool.schema() == {"type": "function", "function": {
        "name": "scale",
        "description": "Scale a count by a factor.",
        "parameters": {
            "type": "object",
            "properties": {
                "count": {"type": "integer", "description": "how many items there are."},
                "factor": {"type": "number",
                           "description": "what to multiply by; a value below one shrinks the count."},
                "label": {"type": "string", "description": "text shown in front of the result."},
                "verbose": {"type": "boolean", "description": "whether to show the inputs too."},
            },
            "required": ["count", "factor", "label"],
        },
    }}


def test_name_override_and_undocumented_parameter():
    def add(a: int, b: int = 1) -> int:
        """Add two numbers.

        Args:
            a: the first.
        """
        return a + b

    tool = tool_from_function(add, name="plus")
    assert tool.name == "plus"
    assert tool.parameters["properties"] == {"a": {"type": "integer", "description": "the first."},
                                             "b": {"type": "integer"}}
    assert tool.parameters["required"] == ["a"]


def no_docstring(x: int) -> int:
    return x


def no_annotation(x) -> int:  # type: ignore[no-untyped-def]
    """Doc.

    Args:
        x: a value.
    """
    return x


def star_args(*values: int) -> int:
    """Doc."""
    return sum(values)


def star_kwargs(**values: int) -> int:
    """Doc."""
    return len(values)


def list_parameter(items: list) -> int:
    """Doc.

    Args:
        items: some items.
    """
    return len(items)


@pytest.mark.parametrize("function, words", [
    (no_docstring, ["no_docstring", "docstring"]),
    (no_annotation, ["no_annotation", "'x'", "annotation"]),
    (star_args, ["star_args", "'values'", "*args"]),
    (star_kwargs, ["star_kwargs", "'values'", "**kwargs"]),
    (list_parameter, ["list_parameter", "'items'", "unsupported"]),
])
def test_unusable_functions_raise_type_error_naming_function_and_parameter(function, words):
    with pytest.raises(TypeError) as caught:
        tool_from_function(function)
    assert all(word in str(caught.value) for word in words), str(caught.value)


# ---------------------------------------------------------------------------------------------------------- calls


def test_call_runs_the_function():
    outcome = tool_from_function(scale).call({"count": 3, "factor": 0.5, "label": "half", "verbose": True})
    assert outcome.content == "half: 1.5 (3 x 0.5)"
    assert outcome.error is None and not outcome.timed_out and outcome.seconds >= 0


def test_number_accepts_int():
    assert tool_from_function(scale).call({"count": 3, "factor": 2, "label": "n"}).content == "n: 6"


@pytest.mark.parametrize("arguments, expected", [
    ({"factor": 1.0, "label": "a"}, "missing required argument 'count'"),
    ({"count": 1, "factor": 1.0, "label": "a", "colour": "red"}, "unknown argument 'colour'"),
    ({"count": "3", "factor": 1.0, "label": "a"}, "argument 'count' must be integer, got string"),
    ({"count": True, "factor": 1.0, "label": "a"}, "argument 'count' must be integer, got boolean"),
    ({"count": 1, "factor": False, "label": "a"}, "argument 'factor' must be number, got boolean"),
    ({"count": 1, "factor": 1.0, "label": 7}, "argument 'label' must be string, got integer"),
    ({"count": 1, "factor": 1.0, "label": "a", "verbose": 1}, "argument 'verbose' must be boolean, got integer"),
])
def test_bad_arguments_give_error_outcomes(arguments, expected):
    outcome = tool_from_function(scale).call(arguments)
    assert expected in outcome.error
    assert outcome.content == f"error: {outcome.error}" and not outcome.timed_out


def test_several_problems_are_all_reported_and_non_mappings_are_refused():
    outcome = tool_from_function(scale).call({"count": 1.5, "other": 1})
    assert outcome.error.count(";") == 3  # factor and label missing, other unknown, count not an integer
    assert tool_from_function(scale).call(["count"]).error == "arguments must be a JSON object, got list"


def test_exception_inside_the_function_becomes_an_error():
    outcome = tool_from_function(failing).call({"reason": "no such key"})
    assert outcome.error == "KeyError: 'no such key'"
    assert outcome.content == "error: KeyError: 'no such key'"


def test_timeout_abandons_the_call():
    """The call returns at its timeout while the function is still blocked (the gate opens only afterwards)."""
    GATE.clear()
    FINISHED.clear()
    tool = tool_from_function(sleepy, timeout_s=0.2)
    outcome = tool.call({"seconds": 30.0})
    assert not FINISHED  # returned before the function did: abandoned, not awaited
    assert outcome.timed_out and outcome.error == "timed out after 0.2 s"
    assert outcome.content == "error: timed out after 0.2 s"
    GATE.set()
    assert tool.call({"seconds": 0.0}).content == "awake"


def test_long_content_is_truncated():
    tool = tool_from_function(chatty)
    assert tool.call({"repeat": MAX_CONTENT_CHARS}).content == "x" * MAX_CONTENT_CHARS
    content = tool.call({"repeat": 5000}).content
    assert len(content) == MAX_CONTENT_CHARS
    assert content == "x" * (MAX_CONTENT_CHARS - len(TRUNCATION_MARKER)) + "… [truncated]"


# ------------------------------------------------------------------------------------------------ parsing calls


def test_text_without_calls():
    parsed = parse_tool_calls("The answer is 42. </tool_call> is just text here")
    assert parsed.calls == [] and parsed.errors == [] and not parsed.found


def test_two_calls_with_surrounding_text_and_whitespace():
    text = ('Let me compute.\n<tool_call>\n  {"name": "calculator", "arguments": {"expression": "1+1"}}  \n'
            '</tool_call>\nand <tool_call>{"name": "python"}</tool_call> done')
    parsed = parse_tool_calls(text)
    assert parsed.calls == [ToolCall("calculator", {"expression": "1+1"}), ToolCall("python", {})]
    assert parsed.errors == [] and parsed.found


def test_arguments_as_a_json_string():
    parsed = parse_tool_calls('<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"2*3\\"}"}</tool_call>')
    assert parsed.calls == [ToolCall("calc", {"expression": "2*3"})] and parsed.errors == []


@pytest.mark.parametrize("body, expected", [
    ("not json", "tool call 1 is not valid JSON: Expecting value (char 0)"),
    ('["calc"]', "tool call 1 is not a JSON object (got array)"),
    ('{"arguments": {}}', 'tool call 1 needs a non-empty string "name" (missing)'),
    ('{"name": 3}', 'tool call 1 needs a non-empty string "name" (got integer 3)'),
    ('{"name": "calc", "arguments": [1, 2]}', 'tool call 1 (calc) needs "arguments" to be a JSON object (got array)'),
    ('{"name": "calc", "arguments": "[1]"}', 'tool call 1 (calc) needs "arguments" to be a JSON object (got array)'),
])
def test_malformed_calls_are_reported(body, expected):
    parsed = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert parsed.calls == [] and parsed.errors == [expected] and parsed.found


def test_unclosed_tags_are_reported_and_numbered():
    text = ('<tool_call>{"name": "a"}</tool_call> <tool_call>{"name": "b"} '
            '<tool_call>{"name": "c"}</tool_call> <tool_call>{"name": "d"}')
    parsed = parse_tool_calls(text)
    assert parsed.calls == [ToolCall("a", {}), ToolCall("c", {})]
    assert parsed.errors == ["tool call 2 has no closing </tool_call>", "tool call 4 has no closing </tool_call>"]


@pytest.mark.parametrize("name, arguments", [
    ("calculator", {"expression": "17*23"}),
    ("python", {"code": "print('</tool_call> <tool_call>')\n", "n": [1, 2.5, None, {"k": True}], "é": "ü"}),
    ("noop", {}),
])
def test_format_then_parse_round_trips(name, arguments):
    text = format_tool_call(name, arguments)
    assert text.startswith("<tool_call>\n{") and text.endswith("}\n</tool_call>")
    assert parse_tool_calls(text).calls == [ToolCall(name, arguments)]


def test_format_uses_default_json_separators():
    assert format_tool_call("f", {"a": 1}) == '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'


# --------------------------------------------------------------------------------------------------- calculator


@pytest.mark.parametrize("expression, expected", [
    ("17*23", "391"), ("2**10", "1024"), ("(1+2)*3", "9"), ("7/2", "3.5"), ("4/2", "2"), ("-3+5", "2"),
    ("7 // 2 + 7 % 2", "4"), ("+1.5 * 2", "3"), ("1/4", "0.25"), ("2**-1", "0.5"),
    ("1e15 * 2", "2000000000000000.0"), ("1e16 * 2", "2e+16"), ("10**20", "100000000000000000000"),
])
def test_calculator_evaluates_arithmetic(expression, expected):
    assert calculator(expression) == expected


@pytest.mark.parametrize("expression, words", [
    ("__import__('os')", "function call"), ("a+1", "'a'"), ("(1).real", "attribute"), ("'a' * 3", "'a'"),
    ("1 < 2", "Compare"), ("True + 1", "True"), ("3 & 1", "BitAnd"), ("2**1000", "exponent"),
    ("1/0", "division by zero"), ("5 % 0", "division by zero"), ("99**100", "exceeds"), ("1e101", "exceeds"),
    ("(-8) ** 0.5", "not a real number"), ("1 +", "not a valid expression"),
])
def test_calculator_rejects(expression, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        calculator(expression)


def test_calculator_tool():
    tool = BUILTIN_TOOLS["calculator"]
    schema = tool.schema()
    assert schema["type"] == "function" and schema["function"]["name"] == "calculator"
    assert schema["function"]["description"].startswith("Evaluate an arithmetic expression")
    assert schema["function"]["parameters"]["required"] == ["expression"]
    assert schema["function"]["parameters"]["properties"]["expression"]["type"] == "string"
    assert tool.call({"expression": "17*23"}).content == "391"
    assert tool.call({"expression": "1/0"}).content == "error: ValueError: division by zero"


# ------------------------------------------------------------------------------------------------------- python


def test_python_tool_returns_stdout_without_the_final_newline():
    tool = BUILTIN_TOOLS["python"]
    assert tool.timeout_s == 10.0 and tool.schema()["function"]["parameters"]["required"] == ["code"]
    assert tool.call({"code": "print(6*7)"}).content == "42"
    assert tool.call({"code": "print('a')\nprint()"}).content == "a\n"


def test_python_tool_reports_the_exception():
    outcome = BUILTIN_TOOLS["python"].call({"code": "x = 1\nprint(x / 0)"})
    assert outcome.content == "error: RuntimeError: error: ZeroDivisionError: division by zero"
    assert not outcome.timed_out


def test_python_tool_kills_a_runaway_program():
    """The sandbox kills the program before the tool's own timeout: a normal error outcome, not an abandoned call.
    The tool's sandbox stops a quarter (at most 1 s) before the tool's timeout; the end-to-end call below gives the
    kill 7 s of margin (a 1 s sandbox inside an 8 s tool), because at load 10 in the parallel suite a 1 s margin
    (3 s sandbox, 4 s tool) was once not enough to start the interpreter, kill it and return."""
    assert python_tool(timeout_s=4.0).function.keywords["wall_timeout_s"] == sandbox_timeout(4.0) == 3.0
    assert sandbox_timeout(40.0) == 39.0 and sandbox_timeout(2.0) == 1.5
    tool = python_tool(timeout_s=8.0)
    tool = replace(tool, function=functools.partial(run_python_program, wall_timeout_s=1.0))
    outcome = tool.call({"code": "while True:\n    pass"})
    assert not outcome.timed_out
    assert outcome.error is not None and "ran longer than 1 s and was killed" in outcome.error
