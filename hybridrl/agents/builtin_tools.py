"""The built-in tools: ``calculator`` (safe arithmetic, no ``eval``) and ``python`` (a sandboxed subprocess).

Both are plain functions made into tools by ``tools.tool_from_function``; ``BUILTIN_TOOLS`` is what
``rollout.multi_turn.tools`` names.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from dataclasses import replace
from typing import Any, Callable

from hybridrl.agents.tools import Tool, tool_from_function
from hybridrl.rewards.sandbox import SandboxLimits, run_untrusted_python

__all__ = ["BUILTIN_TOOLS", "calculator", "python", "python_tool", "run_python_program", "sandbox_timeout"]


# --------------------------------------------------------------------------------------------------- calculator

MAX_EXPONENT = 100
MAX_MAGNITUDE = 1e100
_BINARY_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY_OPERATORS: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / // % ** and parentheses, e.g. "(17 * 23) / 2".

    Args:
        expression: the arithmetic expression to evaluate, for example "2 ** 10 - 24".
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exception:
        raise ValueError(f"not a valid expression: {exception.msg}") from None
    except (RecursionError, MemoryError):
        raise ValueError("expression is nested too deeply") from None
    try:
        value = _evaluate(tree.body)
    except RecursionError:
        raise ValueError("expression is nested too deeply") from None
    return _format_number(value)


def _evaluate(node: ast.AST) -> int | float:
    """The value of one node of an arithmetic expression; ValueError for anything that is not arithmetic."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPERATORS:
        return _checked(_UNARY_OPERATORS[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
        return _checked(_apply_binary(node.op, _evaluate(node.left), _evaluate(node.right)))
    raise ValueError(f"{_describe(node)} is not allowed (only numbers, + - * / // % ** and parentheses)")


def _apply_binary(op: ast.operator, left: int | float, right: int | float) -> Any:
    if isinstance(op, ast.Pow) and abs(right) > MAX_EXPONENT:
        raise ValueError(f"exponent {_format_number(right)} is too large (at most {MAX_EXPONENT} in absolute value)")
    try:
        return _BINARY_OPERATORS[type(op)](left, right)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError(f"a result exceeds {MAX_MAGNITUDE:g} in absolute value") from None


def _checked(value: Any) -> int | float:
    """``value`` if it is a real number of at most ``MAX_MAGNITUDE`` in absolute value, else ValueError."""
    if not isinstance(value, (int, float)):  # e.g. complex, from a negative base and a fractional exponent
        raise ValueError("the result is not a real number")
    if (isinstance(value, float) and math.isnan(value)) or abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"a result exceeds {MAX_MAGNITUDE:g} in absolute value")
    return value


def _describe(node: ast.AST) -> str:
    """A few words naming what ``node`` is, for the error message."""
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Call):
        return "a function call"
    if isinstance(node, ast.Attribute):
        return f"the attribute access .{node.attr}"
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r}"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return f"the operator {type(node.op).__name__}"
    return f"a {type(node).__name__} expression"


def _format_number(value: int | float) -> str:
    """``"391"`` for ints and for integral floats below 1e15 (``4/2`` -> ``"2"``), else the shortest float repr."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


# ------------------------------------------------------------------------------------------------------- python

PYTHON_TOOL_TIMEOUT_S = 10.0


def python(code: str) -> str:
    """Run a Python program and return what it prints to standard output (without the final newline).

    Args:
        code: the complete program; print the values you want to see.
    """
    return run_python_program(code, sandbox_timeout(PYTHON_TOOL_TIMEOUT_S))


def python_tool(timeout_s: float = PYTHON_TOOL_TIMEOUT_S) -> Tool:
    """The ``python`` tool with a tool timeout of ``timeout_s``; its subprocess is killed a little before that
    (``sandbox_timeout``), so that a runaway program ends as an error outcome and leaves nothing running."""
    tool = tool_from_function(python, timeout_s=timeout_s)
    return replace(tool, function=functools.partial(run_python_program, wall_timeout_s=sandbox_timeout(timeout_s)))


def sandbox_timeout(tool_timeout_s: float) -> float:
    """The sandbox's wall timeout for a tool timeout: a quarter (at most one second) less, to start and kill."""
    return tool_timeout_s - min(1.0, tool_timeout_s / 4)


def run_python_program(code: str, wall_timeout_s: float) -> str:
    """``code``'s stdout with one trailing newline removed; RuntimeError with the sandbox status and the last line
    of stderr unless it exited cleanly."""
    result = run_untrusted_python(code, stdin="", limits=SandboxLimits(timeout_s=wall_timeout_s))
    if result.status != "ok":
        if result.status == "timeout":
            raise RuntimeError(f"timeout: the program ran longer than {wall_timeout_s:g} s and was killed")
        last_line = next((line.strip() for line in reversed(result.stderr.splitlines()) if line.strip()), "")
        raise RuntimeError(f"{result.status}: {last_line}" if last_line else
                           f"{result.status} (exit code {result.returncode})")
    return result.stdout.removesuffix("\n")


BUILTIN_TOOLS: dict[str, Tool] = {"calculator": tool_from_function(calculator),
                                  "python": tool_from_function(python, timeout_s=PYTHON_TOOL_TIMEOUT_S)}
