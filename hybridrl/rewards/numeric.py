"""Finding and comparing numbers in model responses (pure Python, shared by the rule-based reward functions).

A number is an optional minus sign, digits — either plain (``1080``) or grouped in threes by commas (``1,080``) —
and an optional decimal part (``2.50``). Numbers are compared exactly as :class:`decimal.Decimal`, so ``1,080``,
``1080`` and ``1080.00`` are equal, and no float rounding can make two different answers match.

A minus sign directly after a digit is read as subtraction, not as a sign: the numbers in ``"5-3"`` are ``5`` and
``3``, not ``5`` and ``-3``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["NUMBER_PATTERN", "find_numbers", "last_number", "parse_number", "numbers_equal"]

NUMBER_PATTERN = r"(?:(?<!\d)-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
"""Regex of one number: optional sign, plain or comma-grouped digits, optional decimals (no exponent)."""

_NUMBER_RE = re.compile(NUMBER_PATTERN)
_FULL_NUMBER_RE = re.compile(rf"\s*\$?\s*({NUMBER_PATTERN})\.?\s*")


def find_numbers(text: str) -> list[str]:
    """All numbers in ``text``, in order of appearance, as written (commas kept)."""
    return _NUMBER_RE.findall(text)


def last_number(text: str) -> str | None:
    """The last number in ``text`` as written, or ``None`` if there is none."""
    numbers = find_numbers(text)
    return numbers[-1] if numbers else None


def parse_number(value: Any) -> Decimal | None:
    """``value`` as an exact ``Decimal`` if it is exactly one number, else ``None``.

    Accepts ints, finite floats, and strings holding one number with optional surrounding whitespace, a leading
    ``$`` and a trailing full stop (``" $1,080. "`` → ``Decimal("1080")``). Badly grouped commas (``"1,0,8"``) and
    anything else around the number (``"68 apples"``) give ``None``.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value)) if value == value and abs(value) != float("inf") else None
    if not isinstance(value, str):
        return None
    match = _FULL_NUMBER_RE.fullmatch(value)
    if match is None:
        return None
    try:
        return Decimal(match.group(1).replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the regex only admits valid decimals
        return None


def numbers_equal(first: Any, second: Any) -> bool:
    """True when both values parse as numbers (see :func:`parse_number`) and are exactly equal."""
    first_number, second_number = parse_number(first), parse_number(second)
    return first_number is not None and second_number is not None and first_number == second_number
