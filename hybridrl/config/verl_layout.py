"""Command-line overrides as a verl user writes them, turned into hybridrl's, before Hydra composes the config.

:func:`translate_overrides` reads each ``key=value`` against the table in :mod:`hybridrl.config.verl_keys`: moved
keys get hybridrl's name (and value spelling), keys without effect are accepted and reported, unsupported ones are
refused with what to do, and every key is checked against the schema — all problems at once, with a suggestion
that also looks across verl's ``actor_rollout_ref.`` prefix. When any override is spelt the verl way, verl's
defaults that change a script's meaning (``VERL_DEFAULTS``) go first. A bare string where the schema wants a list
(``data.train_files=~/data/train.parquet``) becomes a one-element list.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass, field, is_dataclass
from typing import Any, Optional, Sequence

from hybridrl.config.errors import ConfigError
from hybridrl.config.retired_keys import retired_key_message
from hybridrl.config.verl_keys import ARR, RULES, VERL_DEFAULTS, Moved, NoEffect, Unsupported, rule_for


@dataclass(frozen=True)
class Override:
    """One Hydra override: ``prefix`` (``""``, ``+``, ``++`` or ``~``) ``key`` ``=value`` (``None``: no ``=``)."""

    prefix: str
    key: str
    value: Optional[str]

    @classmethod
    def parse(cls, text: str) -> "Override":
        stripped = text.lstrip("+~")
        key, equals, value = stripped.partition("=")
        return cls(text[:len(text) - len(stripped)], key.strip(), value if equals else None)

    def __str__(self) -> str:
        return f"{self.prefix}{self.key}" + ("" if self.value is None else f"={self.value}")

    @property
    def is_key(self) -> bool:
        """A dotted config key (``actor.optim.lr``), not a group choice (``algorithm=gae``) or a package override."""
        return "." in self.key and "@" not in self.key


@dataclass
class Translation:
    """What :func:`translate_overrides` made of a command line.

    ``overrides``: hybridrl's overrides, verl's defaults first when they apply. ``moved``: ``(verl override,
    hybridrl override)``. ``no_effect``: ``(key, value, reason)``. ``defaults``: ``(key, value, why)`` of the verl
    defaults applied. ``problems``: every refusal, raised by the loader.
    """

    overrides: list[str] = field(default_factory=list)
    moved: list[tuple[str, str]] = field(default_factory=list)
    no_effect: list[tuple[str, str, str]] = field(default_factory=list)
    defaults: list[tuple[str, str, str]] = field(default_factory=list)
    problems: ConfigError = field(default_factory=ConfigError)

    @property
    def verl_layout(self) -> bool:
        return bool(self.moved or self.no_effect)

    def report(self) -> list[str]:
        """One line per verl key translated, without effect, or defaulted (what ``hybridrl config`` prints)."""
        lines = [f"{verl} -> {ours}" for verl, ours in self.moved]
        lines += [f"{key}={value}: no effect ({reason})" for key, value, reason in self.no_effect]
        lines += [f"{key}={value}: verl's default" + (f" ({why})" if why else "") for key, value, why in self.defaults]
        return lines


def translate_overrides(overrides: Sequence[str], schema: type, *, verl_rules: bool = True) -> Translation:
    """Translate ``overrides`` for ``schema`` (verl's rules only with ``verl_rules``: the RL trainer's layout)."""
    result, sources = Translation(), {}
    translated: list[Override] = []
    for text in overrides:
        override = Override.parse(text)
        rule = rule_for(override.key) if verl_rules and override.is_key else None
        for ours in _apply(rule, override, result):
            _note_target(ours, override, rule, sources, result.problems)
            translated.append(ours)
    for key in dict.fromkeys(ours.key for ours in translated if ours.is_key):
        _check_known(key, sources[key][0], schema, result.problems)
    if result.verl_layout:
        given = {ours.key for ours in translated}
        result.defaults = [default for default in VERL_DEFAULTS if default[0] not in given]
    list_keys = _list_fields(schema)
    result.overrides = [f"{key}={value}" for key, value, _ in result.defaults]
    result.overrides += [str(_as_list(ours) if ours.key in list_keys else ours) for ours in translated]
    return result


def _apply(rule, override: Override, result: Translation) -> list[Override]:
    """The hybridrl overrides one override becomes (none for a key without effect or a refused one)."""
    if rule is None:
        return [override]
    value = override.value
    if isinstance(rule, Moved):
        value = rule.values.get(_normal(value), value) if value is not None else None
        deleting = override.prefix == "~"
        moved = [Override("~" if deleting else "", _moved_key(rule, target, override.key), None if deleting else value)
                 for target in rule.targets]
        result.moved.append((str(override), ", ".join(str(item) for item in moved)))
        return moved
    accepted = rule.values is None or _normal(value) in rule.values
    if isinstance(rule, NoEffect) and accepted:
        result.no_effect.append((override.key, str(value), rule.reason))
    elif isinstance(rule, Unsupported) and _normal(value) in rule.values:
        result.no_effect.append((override.key, str(value), "verl's default, which means off"))
    else:
        allowed = f" (accepted: {', '.join(rule.values)})" if rule.values else ""
        kind = "verl key hybridrl has no equivalent for" if isinstance(rule, Unsupported) else "verl key"
        result.problems.add(override.key, value, f"{kind}: {rule.reason}{allowed}")
    return []


def _moved_key(rule: Moved, target: str, verl_key: str) -> str:
    return target + verl_key[len(rule.verl):] if rule.verl.endswith(".") else target


def _note_target(ours: Override, source: Override, rule, sources: dict, problems: ConfigError) -> None:
    """Keys spelt differently that land on one hybridrl key must agree: two verl keys (hybridrl has one setting
    for both roles), or a verl key and hybridrl's own spelling of it (one of the two would be dropped without a
    word). The same key given twice is an override, as in Hydra: the later wins."""
    earlier = sources.get(ours.key)
    sources[ours.key] = (source, rule, ours.value)
    if earlier is None or earlier[0].key == source.key or (rule is None and earlier[1] is None):
        return
    if _same_value(earlier[2], ours.value):
        return
    if rule is not None and earlier[1] is not None:
        problems.add(source.key, source.value,
                     f"and {earlier[0].key}={earlier[0].value} are both hybridrl's {ours.key}, one setting for "
                     "both roles: give them the same value")
    else:
        verl, mine = (source, earlier[0]) if rule is not None else (earlier[0], source)
        problems.add(source.key, source.value,
                     f"{verl.key}={verl.value} (verl's spelling) and {mine.key}={mine.value} (hybridrl's) are one "
                     f"setting, hybridrl's {ours.key}, given different values: keep one of the two")


def _check_known(key: str, source: Override, schema: type, problems: ConfigError) -> None:
    if _resolves(key, schema):
        return
    retired = retired_key_message(key)
    if retired is not None:
        problems.add(source.key, source.value, retired)
        return
    hint = suggestion(key, schema)
    renamed = f" (hybridrl: {key})" if source.key != key else ""
    problems.add(source.key, source.value, f"unknown config key{renamed}{hint}")


def suggestion(key: str, schema: type) -> str:
    """`` (did you mean 'x'?)`` for an unknown dotted ``key``: a close name at the same level, the key as it
    reads with verl's ``actor_rollout_ref.`` prefix, or a close key anywhere; else ``""``."""
    *parents, leaf = key.split(".")
    node = _node(parents, schema)
    if node is not None:
        close = difflib.get_close_matches(leaf, list(typing.get_type_hints(node)), n=1)
        if close:
            return f" (did you mean '{'.'.join([*parents, close[0]])}'?)"
    for spelling in (ARR + key, key):
        rule = rule_for(spelling)
        if isinstance(rule, Moved):
            target = _moved_key(rule, rule.targets[0], spelling)
            if _resolves(target, schema) and target != key:
                return f" (did you mean '{target}'? verl's {spelling})"
    close = difflib.get_close_matches(key, leaf_keys(schema), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


def leaf_keys(schema: type, prefix: str = "") -> list[str]:
    """Every dotted leaf key of a schema dataclass."""
    keys = []
    for name, hint in typing.get_type_hints(schema).items():
        keys += leaf_keys(hint, f"{prefix}{name}.") if is_dataclass(hint) else [f"{prefix}{name}"]
    return keys


def _resolves(key: str, schema: type) -> bool:
    """Whether ``key`` names a field of ``schema`` (anything below a free-form dict field counts)."""
    node: Any = schema
    for part in key.split("."):
        if not is_dataclass(node):
            return typing.get_origin(node) is dict
        hints = typing.get_type_hints(node)
        if part not in hints:
            return False
        node = hints[part]
    return True


def _node(parts: list[str], schema: type) -> Optional[type]:
    node: Any = schema
    for part in parts:
        node = typing.get_type_hints(node).get(part) if is_dataclass(node) else None
    return node if is_dataclass(node) else None


def _list_fields(schema: type, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, hint in typing.get_type_hints(schema).items():
        if is_dataclass(hint):
            keys |= _list_fields(hint, f"{prefix}{name}.")
        elif typing.get_origin(hint) is list:
            keys.add(f"{prefix}{name}")
    return keys


def _as_list(override: Override) -> Override:
    """``key=value`` → ``key=['value']`` when ``value`` is a bare string (not a list, not null, not interpolated)."""
    value = override.value
    if value is None or override.prefix == "~" or value.strip().startswith(("[", "$")) or _normal(value) == "null":
        return override
    text = value.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return Override(override.prefix, override.key, f"['{escaped}']")


def _same_value(first: Optional[str], second: Optional[str]) -> bool:
    """Whether two override values say the same (``1e-5`` and ``0.00001`` do; so do ``True`` and ``true``)."""
    first, second = _normal(first), _normal(second)
    try:
        return float(first) == float(second)
    except ValueError:
        return first == second


def _normal(value: Optional[str]) -> str:
    """A value as the table spells it: no surrounding quotes, lower case, ``null`` for none."""
    if value is None:
        return "null"
    text = value.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    text = text.lower()
    return "null" if text in ("none", "~", "") else text


DEFAULT_WHY = "verl's default"


def verl_table_markdown() -> str:
    """The verl → hybridrl key table (``docs/verl.md``), generated from :data:`~hybridrl.config.verl_keys.RULES`."""
    lines = ["# verl's config keys in hybridrl", "",
             "Generated from `hybridrl/config/verl_keys.py` by `python -m hybridrl.config.docs verl`; do not edit "
             "by hand. Keys spelt the same in both (`data.train_batch_size`, `algorithm.adv_estimator`, "
             "`critic.optim.lr`, ...) are not listed. A key ending in `.` stands for every key below it.", "",
             "## Keys that move", "", "| verl | hybridrl | values |", "|---|---|---|"]
    for rule in RULES:
        if isinstance(rule, Moved):
            values = ", ".join(f"`{a}` → `{b}`" for a, b in rule.values.items())
            lines.append(f"| `{rule.verl}` | {', '.join(f'`{t}`' for t in rule.targets)} | {values} |")
    for kind, title in ((NoEffect, "Keys accepted without effect"), (Unsupported, "Keys refused")):
        lines += ["", f"## {title}", "", "| verl | accepted values | why |", "|---|---|---|"]
        for rule in (rule for rule in RULES if isinstance(rule, kind)):
            values = "any" if rule.values is None else ", ".join(f"`{v}`" for v in rule.values) or "none"
            lines.append(f"| `{rule.verl}` | {values} | {rule.reason.replace('|', '/')} |")
    lines += ["", "## verl's defaults applied to a verl-layout command line", "", "| key | value | why |",
              "|---|---|---|"]
    lines += [f"| `{key}` | `{value}` | {why or DEFAULT_WHY} |" for key, value, why in VERL_DEFAULTS]
    return "\n".join(lines) + "\n"

