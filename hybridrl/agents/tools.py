"""Tools for multi-turn tool-calling agents, built from plain Python functions.

Design:

- **A tool is a plain function.** ``tool_from_function`` reads its JSON schema from the signature (``int`` ->
  ``"integer"``, ``float`` -> ``"number"``, ``str`` -> ``"string"``, ``bool`` -> ``"boolean"``; a parameter with a
  default is optional) and its Google-style docstring (first paragraph -> description, ``Args:`` lines -> parameter
  descriptions). ``Tool.schema()`` is the form chat templates take (``apply_chat_template(..., tools=[...])``).
- **A call never raises into the agent loop.** ``Tool.call`` validates the arguments against the schema, runs the
  function in a worker thread with a per-call timeout and turns every failure (bad arguments, an exception, a
  timeout) into a ``ToolOutcome`` whose ``content`` starts with ``"error: "`` — text the model sees and can react
  to. A Python thread cannot be killed: a timed-out call is *abandoned* (its daemon thread runs on until the
  function returns). Tools that may run away should bound themselves; the built-in ``python`` tool
  (``builtin_tools.py``) does: its code runs in a sandboxed subprocess that is killed just before the tool's timeout.
- **A tool may pay a reward.** A function that returns a ``ToolResult(content, reward)`` gives its turn that
  reward (a per-turn reward, as verl's tools return one from ``execute``); anything else is converted with ``str()``.
- **Row arguments.** ``Tool.for_episode(kwargs)`` binds keyword arguments the model does not see (a row's
  ``extra_info.tools_kwargs[<tool>].create_kwargs``, verl's layout, e.g. the ground truth a checking tool needs).
- **Calls are in the Hermes format** that Qwen-style chat templates use: ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>``. ``parse_tool_calls`` reports the model's mistakes as one-line messages instead of raising;
  ``format_tool_call`` writes a call so that parsing it gives it back exactly.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import threading
import time
import typing
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional

__all__ = ["MAX_CONTENT_CHARS", "TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "ParsedToolCalls", "Tool", "ToolCall",
           "ToolOutcome", "ToolResult", "format_tool_call", "is_finite_number", "parse_tool_calls",
           "tool_from_function"]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
MAX_CONTENT_CHARS = 2000
"""Most characters of a tool message; longer ones keep their start and end with ``TRUNCATION_MARKER``."""
TRUNCATION_MARKER = "… [truncated]"

_JSON_TYPE_OF_ANNOTATION: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean"}


# ----------------------------------------------------------------------------------------------------- tool calls


@dataclass(frozen=True)
class ToolResult:
    """What a tool function may return instead of text: the text the model sees and a reward for this turn."""

    content: str
    reward: float = 0.0


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call gave back: ``content`` (the text the model will see as the tool's message), ``error``
    (None on success; else a one-line reason, and ``content`` is then ``"error: <reason>"``), ``timed_out``,
    ``seconds`` (wall time of the call, validation included), ``reward`` (the tool's reward; 0 unless the function
    returned a :class:`ToolResult`), ``raised`` (the tool's own code raised: ``error`` is its exception's type and
    text — the tool's fault, not the model's)."""

    content: str
    error: Optional[str] = None
    timed_out: bool = False
    seconds: float = 0.0
    reward: float = 0.0
    raised: bool = False


@dataclass(frozen=True)
class Tool:
    """A function the model may call. ``parameters`` is a JSON schema: ``{"type": "object", "properties": {arg:
    {"type": ..., "description": ...}}, "required": [...]}``; ``timeout_s`` bounds one call's wall time."""

    name: str
    description: str
    parameters: dict
    function: Callable[..., Any]
    timeout_s: float = 5.0

    def schema(self) -> dict:
        """The tool in the format chat templates take (``tokenizer.apply_chat_template(..., tools=[...])``):
        ``{"type": "function", "function": {"name": ..., "description": ..., "parameters": ...}}``."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def for_episode(self, row_arguments: Mapping[str, Any]) -> "Tool":
        """This tool with ``row_arguments`` bound as keyword arguments the model does not pass (itself if none)."""
        if not row_arguments:
            return self
        return replace(self, function=functools.partial(self.function, **row_arguments))

    def call(self, arguments: Mapping[str, Any]) -> ToolOutcome:
        """Validate ``arguments`` against ``parameters``, then run ``function(**arguments)`` in a daemon worker thread
        and wait at most ``timeout_s``. Never raises: a bad argument, an exception inside the function (its type and
        message) or a timeout becomes an error outcome. On a timeout the thread is abandoned, not stopped (a Python
        thread cannot be killed); the ``python`` tool's subprocess, by contrast, is killed by its own wall timeout.
        The result is converted with ``str()`` and cut to ``MAX_CONTENT_CHARS`` characters."""
        started = time.monotonic()
        problem = self._argument_problem(arguments)
        if problem is not None:
            return _error_outcome(problem, started)
        finished, result, failure = _run_with_timeout(self.function, dict(arguments), self.timeout_s, self.name)
        if not finished:
            return _error_outcome(f"timed out after {self.timeout_s:g} s", started, timed_out=True)
        if failure is not None:
            return replace(_error_outcome(failure, started), raised=True)
        if isinstance(result, ToolResult):
            if not is_finite_number(result.reward):
                return _error_outcome(f"the tool returned the reward {result.reward!r}: it must be a finite number",
                                      started)
            return ToolOutcome(_truncate(str(result.content)), seconds=time.monotonic() - started,
                               reward=float(result.reward))
        return ToolOutcome(_truncate(str(result)), seconds=time.monotonic() - started)

    def _argument_problem(self, arguments: Any) -> Optional[str]:
        """None if ``arguments`` fit the schema, else every problem found, joined by ``"; "``."""
        if not isinstance(arguments, Mapping):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        properties: dict = self.parameters.get("properties", {})
        problems = [f"missing required argument {name!r}" for name in self.parameters.get("required", [])
                    if name not in arguments]
        for name, value in arguments.items():
            if name not in properties:
                expected = ", ".join(properties) or "none"
                problems.append(f"unknown argument {name!r} (expected: {expected})")
                continue
            json_type = properties[name].get("type")
            if not _has_json_type(value, json_type):
                problems.append(f"argument {name!r} must be {json_type}, got {_json_type_name(value)}")
        return "; ".join(problems) or None


def _has_json_type(value: Any, json_type: Optional[str]) -> bool:
    """Whether ``value`` (a Python value decoded from JSON) is of JSON schema type ``json_type``; types this module
    does not know are accepted."""
    if json_type == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if json_type == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    checks = {"string": str, "boolean": bool, "array": list, "object": dict, "null": type(None)}
    return json_type not in checks or isinstance(value, checks[json_type])


def is_finite_number(value: Any) -> bool:
    """An int or float (not a bool) that is finite: what a reward must be."""
    return _has_json_type(value, "number") and math.isfinite(value)


def _json_type_name(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
             type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _run_with_timeout(function: Callable[..., Any], arguments: dict, timeout_s: float,
                      name: str) -> tuple[bool, Any, Optional[str]]:
    """Run ``function(**arguments)`` in a daemon thread for at most ``timeout_s`` seconds. Returns ``(finished,
    result, failure)``; ``failure`` is ``"<ExceptionType>: <message>"`` when it raised."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = function(**arguments)
        except BaseException as exception:  # noqa: BLE001 — everything is reported to the model, nothing escapes
            box["failure"] = f"{type(exception).__name__}: {exception}"

    worker = threading.Thread(target=work, name=f"tool-{name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return False, "", None
    return True, box.get("result", ""), box.get("failure")


def _error_outcome(reason: str, started: float, timed_out: bool = False) -> ToolOutcome:
    one_line = _truncate(" ".join(reason.split()), MAX_CONTENT_CHARS - len("error: "))
    return ToolOutcome(f"error: {one_line}", one_line, timed_out, time.monotonic() - started)


def _truncate(text: str, limit: int = MAX_CONTENT_CHARS) -> str:
    """``text`` if at most ``limit`` characters, else its first characters and ``TRUNCATION_MARKER`` (``limit`` in
    all)."""
    if len(text) <= limit:
        return text
    return text[:limit - len(TRUNCATION_MARKER)] + TRUNCATION_MARKER


# ------------------------------------------------------------------------------------------- tools from functions


def tool_from_function(function: Callable[..., Any], *, name: Optional[str] = None, timeout_s: float = 5.0) -> Tool:
    """A ``Tool`` whose schema comes from ``function``'s signature and Google-style docstring: description = the
    docstring's first paragraph; each parameter's description from its line in an ``Args:`` section (continuation
    lines indented further belong to it; a parameter without a line gets no ``"description"``). Annotations
    ``int``/``float``/``str``/``bool`` map to ``integer``/``number``/``string``/``boolean`` (string annotations are
    resolved with ``typing.get_type_hints``); a parameter with a default is not required. Raises ``TypeError`` naming
    the function (and parameter) for: no docstring, a parameter without annotation or with an unsupported one,
    ``*args``/``**kwargs``/positional-only parameters."""
    label = getattr(function, "__qualname__", repr(function))
    doc = inspect.getdoc(function)
    if not doc or not doc.strip():
        raise TypeError(f"tool function {label} has no docstring (its first paragraph becomes the tool description)")
    description, argument_docs = _parse_docstring(doc)
    hints = _type_hints(function, label)
    properties, required = {}, []
    for parameter in inspect.signature(function).parameters.values():
        properties[parameter.name] = _parameter_schema(parameter, hints, argument_docs, label)
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return Tool(name or function.__name__, description, parameters, function, timeout_s)


def _type_hints(function: Callable[..., Any], label: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function)
    except Exception as exception:  # noqa: BLE001 — an unresolvable annotation is the caller's TypeError
        raise TypeError(f"tool function {label}: cannot resolve its annotations ({exception})") from exception


def _parameter_schema(parameter: inspect.Parameter, hints: dict[str, Any], argument_docs: dict[str, str],
                      label: str) -> dict:
    """``{"type": ..., "description": ...}`` of one parameter, or ``TypeError`` if a model cannot pass it."""
    where = f"tool function {label}, parameter {parameter.name!r}"
    if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        raise TypeError(f"{where}: *args and **kwargs are not supported (tools are called with named arguments)")
    if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise TypeError(f"{where}: positional-only parameters are not supported (tools are called by name)")
    if parameter.name not in hints:
        raise TypeError(f"{where} has no type annotation (expected one of int, float, str, bool)")
    annotation = hints[parameter.name]
    if annotation not in _JSON_TYPE_OF_ANNOTATION:
        raise TypeError(f"{where}: unsupported annotation {annotation!r} (expected one of int, float, str, bool)")
    schema = {"type": _JSON_TYPE_OF_ANNOTATION[annotation]}
    if parameter.name in argument_docs:
        schema["description"] = argument_docs[parameter.name]
    return schema


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """``(description, {parameter: description})`` from a cleaned (``inspect.getdoc``) Google-style docstring."""
    lines = doc.splitlines()
    header = next((i for i, line in enumerate(lines) if line.strip() in ("Args:", "Arguments:")), len(lines))
    first_paragraph = []
    for line in lines[:header]:
        if not line.strip():
            if first_paragraph:
                break
            continue
        first_paragraph.append(line.strip())
    return " ".join(first_paragraph), _parse_args_section(lines, header)


def _parse_args_section(lines: list[str], header: int) -> dict[str, str]:
    """The entries of the ``Args:`` section starting at ``lines[header]``: ``name: text`` or ``name (type): text``
    at one indentation, continuation lines indented further; the section ends at a line indented no more than its
    header (the next section)."""
    if header >= len(lines):
        return {}
    header_indent = _indent(lines[header])
    entries: dict[str, list[str]] = {}
    entry_indent, current = None, None
    for line in lines[header + 1:]:
        if not line.strip():
            continue
        indent = _indent(line)
        if indent <= header_indent:
            break
        if entry_indent is None or indent <= entry_indent:
            entry_indent = indent
            key, _, text = line.strip().partition(":")
            current = key.split("(")[0].strip().lstrip("*")
            entries[current] = [text.strip()] if text.strip() else []
        elif current is not None:
            entries[current].append(line.strip())
    return {key: " ".join(parts) for key, parts in entries.items()}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


# ------------------------------------------------------------------------------------------ hermes-format calls


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the tool's ``name`` and its ``arguments`` (a JSON object)."""

    name: str
    arguments: dict


@dataclass(frozen=True)
class ParsedToolCalls:
    """The valid ``calls`` in a model message, in order, and one-line ``errors`` for the invalid blocks."""

    calls: list[ToolCall]
    errors: list[str]

    @property
    def found(self) -> bool:
        """Whether the text held any ``<tool_call>`` block at all (valid or not)."""
        return bool(self.calls or self.errors)


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Tool calls in the Hermes format: each ``<tool_call>`` ... ``</tool_call>`` block holds one JSON object
    ``{"name": <str>, "arguments": <object>}`` (``arguments`` may also be a JSON string holding an object; missing
    means ``{}``); whitespace around the JSON is ignored. The model's mistakes become one-line ``errors`` (calls
    numbered from 1), never exceptions: invalid JSON, not an object, a missing/empty/non-string name, arguments that
    are not an object, a ``<tool_call>`` without its closing tag (also when another ``<tool_call>`` opens first)."""
    calls, errors = [], []
    for number, body in enumerate(_tool_call_blocks(text), start=1):
        if body is None:
            errors.append(f"tool call {number} has no closing {TOOL_CALL_CLOSE}")
            continue
        call = _decode_call(body, number)
        if isinstance(call, ToolCall):
            calls.append(call)
        else:
            errors.append(call)
    return ParsedToolCalls(calls, errors)


def _tool_call_blocks(text: str) -> list[Optional[str]]:
    """The text inside each ``<tool_call>`` block, or None for a block that is never closed."""
    blocks: list[Optional[str]] = []
    start = text.find(TOOL_CALL_OPEN)
    while start != -1:
        body_start = start + len(TOOL_CALL_OPEN)
        close = text.find(TOOL_CALL_CLOSE, body_start)
        next_open = text.find(TOOL_CALL_OPEN, body_start)
        if close == -1 or (next_open != -1 and next_open < close):
            blocks.append(None)
            start = next_open
            continue
        blocks.append(text[body_start:close])
        start = text.find(TOOL_CALL_OPEN, close + len(TOOL_CALL_CLOSE))
    return blocks


def _decode_call(body: str, number: int) -> ToolCall | str:
    """The ``ToolCall`` in one block's text, or the one-line error that says why there is none."""
    prefix = f"tool call {number}"
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exception:
        return f"{prefix} is not valid JSON: {exception.msg} (char {exception.pos})"
    if not isinstance(payload, dict):
        return f"{prefix} is not a JSON object (got {_json_type_name(payload)})"
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        found = "missing" if "name" not in payload else f"got {_json_type_name(name)} {json.dumps(name)}"
        return f"{prefix} needs a non-empty string \"name\" ({found})"
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exception:
            return f"{prefix} ({name}) has string arguments that are not valid JSON: {exception.msg} " \
                   f"(char {exception.pos})"
    if not isinstance(arguments, dict):
        return f"{prefix} ({name}) needs \"arguments\" to be a JSON object (got {_json_type_name(arguments)})"
    return ToolCall(name, arguments)


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The text of one call as a model should write it: ``'<tool_call>\\n{"name": ..., "arguments": {...}}\\n
    </tool_call>'`` (``json.dumps`` with default separators). A ``<tool_call>``/``</tool_call>`` inside a string
    value is written with ``<`` escaped as ``\\u003c`` (still the same JSON string), so that
    ``parse_tool_calls(format_tool_call(n, a))`` always gives back exactly ``(n, a)``."""
    payload = json.dumps({"name": name, "arguments": dict(arguments)})
    for tag in (TOOL_CALL_CLOSE, TOOL_CALL_OPEN):  # only inside JSON strings: "<" is no JSON syntax
        payload = payload.replace(tag, "\\u003c" + tag[1:])
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"
