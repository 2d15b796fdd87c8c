"""One error type for user mistakes in the config: it names every offending key with its value and what to do."""

from __future__ import annotations

from typing import Any

from hybridrl.utils.secrets import REDACTED, is_secret_key

# A problem whose message already names its key and value (e.g. re-raised from a nested validator).
PREFORMATTED = object()


class ConfigError(ValueError):
    """A config that cannot run. Collects every problem found, so a user fixes them in one go.

    ``str(error)`` lists one line per problem: ``<key>=<value>: <what is wrong>``.
    """

    def __init__(self, problems: list[tuple[str, Any, str]] | None = None) -> None:
        self.problems: list[tuple[str, Any, str]] = list(problems or [])
        super().__init__()

    def add(self, key: str, value: Any, message: str) -> None:
        self.problems.append((key, value, message))

    def extend(self, other: "ConfigError") -> None:
        self.problems.extend(other.problems)

    @property
    def keys(self) -> list[str]:
        return [key for key, _, _ in self.problems]

    def __bool__(self) -> bool:
        return bool(self.problems)

    def __str__(self) -> str:
        lines = [f"  - {message}" if value is PREFORMATTED else f"  - {key}={_shown(key, value)!r}: {message}"
                 for key, value, message in self.problems]
        noun = "problem" if len(lines) == 1 else "problems"
        return f"invalid config ({len(lines)} {noun}):\n" + "\n".join(lines)

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)


def _shown(key: str, value: Any) -> Any:
    """The value as an error message shows it: credentials (``*_token``, ``*_api_key``, …) redacted."""
    return REDACTED if is_secret_key(key) and value else value
