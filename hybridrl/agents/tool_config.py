"""Tools from a tool config file in verl's format (``rollout.multi_turn.tool_config_path``).

The file (verl's ``tool_config_path`` files load unchanged)::

    tools:
      - class_name: "my_tools:check_answer"         # what runs the tool (below)
        config: {timeout_s: 5}                       # optional; handed to a class, timeout_s bounds a call
        tool_schema:                                 # what the model sees, OpenAI's function format
          type: function
          function:
            name: check_answer
            description: "Check an answer to the question."
            parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}

``class_name`` is ``module.Name``, ``module:Name`` or ``path/to/file.py:Name`` (a relative path is taken from the
config file's directory) and names

- **a function**: called with the model's arguments and the row's own keyword arguments (its
  ``extra_info.tools_kwargs[<tool name>].create_kwargs``, verl's layout) — the parameters not in the schema;
- **a class**: one instance per episode, ``cls(config, **create_kwargs)`` (verl's ``create``), called with the
  model's arguments (``execute``), its ``close()`` if it has one when the episode ends (``release``);
- **one of verl's own tool classes** that hybridrl has an equivalent of (:data:`VERL_EQUIVALENTS`, in
  ``verl_tools.py``); any other ``verl.`` class is refused by name (hybridrl does not import verl).

Either returns text, or a ``ToolResult(text, reward)`` whose reward goes to the turn (per-turn rewards). Every
problem is a :class:`ToolConfigError` naming the file, the entry and the field.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from hybridrl.agents.tools import Tool, is_finite_number
from hybridrl.utils.user_files import import_named

__all__ = ["VERL_EQUIVALENTS", "EpisodeTool", "ToolConfigError", "ToolInstanceError", "load_tool_config", "timeout_of"]

VERL_EQUIVALENTS = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "hybridrl.agents.verl_tools:Gsm8kAnswerCheck",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "hybridrl.agents.verl_tools:LocalCodeInterpreter",
}
"""verl's tool classes → hybridrl's classes that do the same (see ``verl_tools.py`` for how each differs)."""

DEFAULT_TIMEOUT_S = 30.0
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A function name OpenAI's function-calling format accepts (``get-weather`` is one); the model writes it as a
JSON string in its call, so it need not be a Python identifier."""
VERL_TOOL_METHODS = ("create", "execute", "release")
"""verl's ``BaseTool`` interface (async methods), which hybridrl does not call (see :func:`_check_accepts`)."""


class ToolConfigError(ValueError):
    """A tool config file that cannot be used; the message names the file, the entry and the field."""


class ToolInstanceError(ValueError):
    """A tool class's constructor raised while an episode was starting; the message quotes its exception."""


@dataclass(frozen=True)
class EpisodeTool:
    """A tool with one instance per episode: ``template.function`` is the class, built by :meth:`for_episode`."""

    template: Tool
    config: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.template.name

    def schema(self) -> dict:
        return self.template.schema()

    def for_episode(self, row_arguments: Mapping[str, Any]) -> Tool:
        """The episode's tool: ``cls(config, **row_arguments)`` answers the calls. A constructor that raises is a
        :class:`ToolInstanceError` naming the tool and the class and quoting the exception (it ends the episode)."""
        cls = self.template.function
        try:
            instance = cls(dict(self.config), **row_arguments)
        except Exception as error:  # noqa: BLE001 - the user's constructor: its text goes into the episode's failure
            arguments = ", ".join(["config", *(f"{key}=…" for key in sorted(row_arguments))])
            raise ToolInstanceError(f"tool {self.name!r}: {getattr(cls, '__name__', cls)}({arguments}) raised "
                                    f"{type(error).__name__}: {error}") from error
        return replace(self.template, function=instance)


def load_tool_config(path: str | Path) -> list[Tool | EpisodeTool]:
    """The tools of the file at ``path`` (module docstring), in its order; :class:`ToolConfigError` if unusable."""
    file = Path(path)
    where = str(path)
    if not file.is_file():
        raise ToolConfigError(f"{where}: no such file")
    try:
        content = yaml.safe_load(file.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ToolConfigError(f"{where}: not valid YAML: {error}") from None
    entries = content.get("tools") if isinstance(content, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ToolConfigError(f"{where}: expected a top-level `tools:` list with at least one entry")
    tools = [_entry_tool(entry, f"{where}: tools[{index}]", file.parent) for index, entry in enumerate(entries)]
    names = [tool.name for tool in tools]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ToolConfigError(f"{where}: tool name(s) {repeated} appear more than once")
    return tools


def _entry_tool(entry: Any, where: str, base: Path) -> Tool | EpisodeTool:
    if not isinstance(entry, dict):
        raise ToolConfigError(f"{where}: expected a mapping with class_name and tool_schema")
    class_name = entry.get("class_name")
    if not isinstance(class_name, str) or not class_name.strip():
        raise ToolConfigError(f"{where}.class_name: missing (the function or class that runs the tool)")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ToolConfigError(f"{where}.config: expected a mapping, got {type(config).__name__}")
    name, description, parameters = _schema_parts(entry.get("tool_schema"), f"{where}.tool_schema")
    target = _resolve(class_name.strip(), f"{where}.class_name", base)
    _check_accepts(target, parameters, f"{where}.class_name={class_name!r}")
    timeout = timeout_of(config, f"{where}.config")
    tool = Tool(name, description, parameters, target, timeout)
    return EpisodeTool(tool, config) if inspect.isclass(target) else tool


def _schema_parts(schema: Any, where: str) -> tuple[str, str, dict]:
    """``(name, description, parameters)`` of an OpenAI function schema, checked."""
    if not isinstance(schema, dict) or schema.get("type", "function") != "function":
        raise ToolConfigError(f"{where}: expected {{type: function, function: {{name, description, parameters}}}}")
    function = schema.get("function")
    if not isinstance(function, dict):
        raise ToolConfigError(f"{where}.function: missing (name, description, parameters)")
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise ToolConfigError(f"{where}.function.name: {name!r} is not a function name a model can call (OpenAI's "
                              "rule: 1 to 64 letters, digits, '_' or '-')")
    description = function.get("description", "")
    if not isinstance(description, str):
        raise ToolConfigError(f"{where}.function.description: expected text")
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    properties = parameters.get("properties", {}) if isinstance(parameters, dict) else None
    if not isinstance(properties, dict) or parameters.get("type", "object") != "object":
        raise ToolConfigError(f"{where}.function.parameters: expected {{type: object, properties: {{...}}}}")
    required = parameters.get("required", [])
    unknown = [item for item in required if item not in properties] if isinstance(required, list) else required
    if unknown:
        raise ToolConfigError(f"{where}.function.parameters.required: {unknown} are not among the properties "
                              f"{sorted(properties)}")
    return name, description, {"type": "object", "properties": dict(properties), "required": list(required)}


def _resolve(class_name: str, where: str, base: Path) -> Callable[..., Any]:
    """The function or class ``class_name`` names (verl's classes through :data:`VERL_EQUIVALENTS`)."""
    if class_name.startswith("verl."):
        if class_name not in VERL_EQUIVALENTS:
            raise ToolConfigError(
                f"{where}: {class_name!r} is one of verl's own tool classes, which hybridrl does not run (it does not "
                f"import verl); those with an equivalent: {sorted(VERL_EQUIVALENTS)}. Write the tool as a function "
                "or class (hybridrl/agents/tool_config.py says how) and name it here")
        class_name = VERL_EQUIVALENTS[class_name]
    try:
        return import_named(class_name, where, base)
    except ValueError as error:
        raise ToolConfigError(str(error)) from None


def _check_accepts(target: Callable[..., Any], parameters: dict, where: str) -> None:
    """The function (a class: its ``__call__``, which it must define) must take every argument of the schema by
    name. A class written for verl's tool interface (async ``create``/``execute``/``release``) is refused here,
    at start-up, rather than failing in every episode."""
    if inspect.isclass(target) and not _defines_call(target):
        verl_style = all(callable(getattr(target, method, None)) for method in VERL_TOOL_METHODS)
        what = ("is written for verl's tool interface (async create/execute/release), which hybridrl does not call"
                if verl_style else "defines no __call__, so its instances cannot answer a tool call")
        raise ToolConfigError(
            f"{where}: class {target.__name__} {what}. hybridrl builds one instance per episode as "
            "cls(config, **create_kwargs) (verl's create), calls it with the model's arguments as "
            "__call__(self, **arguments) returning text or a ToolResult (verl's execute), and calls its close() if "
            "it has one when the episode ends (verl's release): give the class those methods, or name a function")
    call = target.__call__ if inspect.isclass(target) else target
    signature = inspect.signature(call)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        return
    missing = [name for name in parameters["properties"] if name not in signature.parameters]
    if missing:
        raise ToolConfigError(f"{where}: takes no parameter(s) {missing} of its tool_schema")


def _defines_call(cls: type) -> bool:
    """Whether instances of ``cls`` are callable: ``__call__`` defined by the class or a base (not ``object``)."""
    return any("__call__" in vars(base) for base in cls.__mro__ if base is not object)


def timeout_of(config: dict, where: str = "config") -> float:
    """``timeout_s`` (or verl's ``default_timeout``) of an entry's config, seconds: a call's wall-time bound."""
    value = config.get("timeout_s", config.get("default_timeout", DEFAULT_TIMEOUT_S))
    if not is_finite_number(value) or value <= 0:
        raise ToolConfigError(f"{where}.timeout_s: {value!r} must be a number of seconds > 0")
    return float(value)
