"""Loading a config: Hydra composes the built-in ``conf/`` (and a user's own config directories) plus CLI overrides, OmegaConf merges it into the dataclass schema
(catching unknown keys and wrong types), the result is validated and frozen, and the resolved config is dumped.

Every user mistake comes out as one ``ConfigError`` (a ``ValueError``) naming the key — never a Hydra traceback.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import re
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from hybridrl.config.errors import ConfigError
from hybridrl.config.retired_keys import retired_key_message
from hybridrl.config.schema import TrainConfig
from hybridrl.config.dpo_schema import DPOConfig
from hybridrl.config.rm_schema import RMConfig
from hybridrl.config.sft_schema import SFTConfig
from hybridrl.config.verl_layout import Override, Translation, translate_overrides
from hybridrl.utils.secrets import REDACTED, is_secret_key

ConfigT = TypeVar("ConfigT")
logger = logging.getLogger(__name__)

DEFAULT_CONFIG_NAME = "ppo_trainer"
# Primary config name → the dataclass that types it. Later trainers (SFT, reward model) add theirs here.
SCHEMAS: dict[str, type] = {DEFAULT_CONFIG_NAME: TrainConfig, "sft_trainer": SFTConfig, "rm_trainer": RMConfig,
                            "dpo_trainer": DPOConfig}


def config_dir() -> Path:
    """The directory of the built-in Hydra YAML files: ``$HYBRIDRL_CONF_DIR`` when set; else ``hybridrl/conf/`` inside
    an installed wheel (which carries the tree's ``conf/`` there, so ``pip install hybridrl`` composes configs like a
    checkout); else ``conf/`` at the top of the checkout this package runs from."""
    override = os.environ.get("HYBRIDRL_CONF_DIR")
    return Path(override).resolve() if override else shipped_config_dir()


def shipped_config_dir() -> Path:
    """The configs hybridrl ships: ``hybridrl/conf/`` in an installed wheel, else ``conf/`` at the checkout's top."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "conf"
    return packaged if packaged.is_dir() else package.parent / "conf"


def config_search_path(conf_dir: Optional[Path] = None, extra_dirs: Sequence[Path] = ()) -> list[Path]:
    """Where configs are looked up, first match wins: ``extra_dirs`` (the user's ``--config-dir``, in order), then
    ``conf_dir`` (``--config-path``; default :func:`config_dir`). A user's YAML can thus name a built-in config in its
    defaults list (``- ppo_trainer``) or shadow one of the same name. A directory that does not exist is refused."""
    search_path = [Path(directory).expanduser().resolve() for directory in extra_dirs]
    search_path.append(Path(conf_dir).expanduser().resolve() if conf_dir is not None else config_dir())
    for directory, given in zip(search_path, [*extra_dirs, conf_dir]):
        if not directory.is_dir():
            key = "--config-dir" if given in extra_dirs else "--config-path"
            raise ConfigError([(key, str(given if given is not None else directory), "no such directory")])
    return search_path


def compose_yaml(config_name: str = DEFAULT_CONFIG_NAME, overrides: Sequence[str] = (),
                 conf_dir: Optional[Path] = None, extra_dirs: Sequence[Path] = ()) -> DictConfig:
    """Compose ``<config_name>.yaml`` (looked up along :func:`config_search_path`) with Hydra overrides
    (``key=value``, ``group=option``, ``+key=value``).

    Returns the raw composed tree, before it meets the schema.
    """
    return compose_translated(config_name, overrides, conf_dir, extra_dirs)[0]


def compose_translated(config_name: str = DEFAULT_CONFIG_NAME, overrides: Sequence[str] = (),
                       conf_dir: Optional[Path] = None, extra_dirs: Sequence[Path] = ()) -> tuple[DictConfig, Translation]:
    """:func:`compose_yaml`, and what became of the overrides: verl-layout keys translated (the RL trainer's configs),
    every key checked against the schema (all unknown or refused keys in one ``ConfigError``), bare strings for
    list keys made lists. ``data.train_files`` given on the command line replaces a default synthetic task."""
    _register_schemas()
    search_path = config_search_path(conf_dir, extra_dirs)
    if not any((directory / f"{config_name}.yaml").is_file() for directory in search_path):
        available = sorted({path.stem for directory in search_path for path in directory.glob("*.yaml")})
        where = " or ".join(str(directory) for directory in search_path)
        raise ConfigError([("--config-name", config_name, f"no {config_name}.yaml in {where}; available: {available}")])
    schema = SCHEMAS.get(config_name) or schema_of(_compose(config_name, [], search_path, None))
    translation = translate_overrides(overrides, schema, verl_rules=schema is TrainConfig)
    translation.problems.raise_if_any()
    hydra_overrides = open_dict_overrides(translation.overrides, schema)
    raw = _compose(config_name, hydra_overrides, search_path, schema)
    return _prompts_from_files(raw, hydra_overrides, lambda more: _compose(config_name, more, search_path, schema)), \
        translation


def _compose(config_name: str, overrides: Sequence[str], search_path: Sequence[Path],
             schema: Optional[type]) -> DictConfig:
    """Hydra's compose with the first directory holding ``<config_name>.yaml`` as the primary config directory (Hydra
    looks the primary config up there only) and the others on ``hydra.searchpath`` for defaults lists."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    primary = next((d for d in search_path if (d / f"{config_name}.yaml").is_file()), search_path[0])
    others = [directory for directory in search_path if directory != primary]
    searchpath = [f"hydra.searchpath=[{','.join(_quoted(f'file://{d}') for d in others)}]"] if others else []
    try:
        with initialize_config_dir(config_dir=str(primary), job_name="hybridrl"):
            return compose(config_name=config_name, overrides=[*searchpath, *overrides])
    except (HydraException, OmegaConfBaseException) as error:
        raise _composition_error(error, overrides, schema) from None
    except yaml.YAMLError as error:  # a config file that is not valid YAML: name the file and the line
        mark = getattr(error, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a config file"
        problem = getattr(error, "problem", None) or _first_line(error)
        raise ConfigError([("--config-name", config_name, f"{where} is not valid YAML: {problem}")]) from None


def _quoted(text: str) -> str:
    """A string as a quoted Hydra override value (a path may hold spaces, commas or brackets)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _prompts_from_files(raw: DictConfig, overrides: list[str], recompose) -> DictConfig:
    """``data.train_files`` set on the command line over a config whose prompts come from a synthetic task: the
    files win. The ``data`` group switches to ``files`` (the synthetic preset's lengths and batch go with it) when the
    command line chose no data group; a synthetic task the config names itself is cleared. Both set on the command
    line stays both set, and validation refuses it."""
    data = raw.get("data")
    keys = {Override.parse(text).key for text in overrides}
    if data is None or "data.train_files" not in keys or not data.get("train_files") \
            or data.get("synthetic_task") is None or "data.synthetic_task" in keys:
        return raw
    if "data" not in keys:
        try:
            raw = recompose([*overrides, "data=files"])
        except ConfigError:  # the config has no data group in its defaults list
            pass
    if raw.data.get("synthetic_task") is not None:
        with open_dict(raw):
            raw.data.synthetic_task = None
    logger.info("data.train_files is set: prompts come from the files, not the default synthetic task")
    return raw


def open_dict_overrides(overrides: Sequence[str], schema: type) -> list[str]:
    """Prefix overrides of free-form dict fields (``extra``, ``data.synthetic_task_kwargs``, …) with ``++``.

    Hydra refuses a new key below a typed config unless it is written ``++key=value``; for fields that are dicts by
    design that is a trap, so ``data.synthetic_task_kwargs.max_digits=1`` just works.
    """
    prefixes = tuple(_dict_field_paths(schema))
    rewritten = []
    for override in overrides:
        key = override.split("=", 1)[0]
        if not key.startswith(("+", "~")) and any(key == p or key.startswith(p + ".") for p in prefixes):
            override = "++" + override
        rewritten.append(override)
    return rewritten


def _dict_field_paths(schema: type, prefix: str = "") -> list[str]:
    import typing

    paths = []
    for name, hint in typing.get_type_hints(schema).items():
        if is_dataclass(hint):
            paths += _dict_field_paths(hint, f"{prefix}{name}.")
        elif typing.get_origin(hint) is dict:
            paths.append(f"{prefix}{name}")
    return paths


def _register_schemas() -> None:
    """Make each schema available to the YAML defaults lists as ``<config_name>_schema`` (Hydra's ConfigStore), the
    ``${hybridrl_devices:...}`` resolver to ``conf/trainer/auto.yaml``, and ``${hybridrl_conf:<file>}`` (the
    absolute path of a file in the shipped config directory) to configs that name one."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        if store.repo.get(f"{name}_schema.yaml") is None:  # once per process (a second store warns in Hydra 1.4)
            store.store(name=f"{name}_schema", node=schema)
    OmegaConf.register_resolver("hybridrl_devices", visible_devices, replace=True)
    OmegaConf.register_resolver("hybridrl_conf", shipped_config_file, replace=True)


def shipped_config_file(relative: str) -> str:
    """The absolute path of ``relative`` inside the built-in config directory (tool files and the like that a
    built-in recipe config names: they work from a wheel as from a checkout, whatever the working directory)."""
    return str(shipped_config_dir() / relative)


def visible_devices(device: str, cpu_ranks: int) -> int:
    """Devices per node for ``trainer.device``: every visible GPU for ``cuda`` (and for ``auto`` when one is
    visible), else ``cpu_ranks`` CPU ranks."""
    if device in ("auto", "cuda"):
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count()
    return int(cpu_ranks)


def _composition_error(error: Exception, overrides: Sequence[str], schema: Optional[type]) -> ConfigError:
    """Turn Hydra's wrapped exception into a ``ConfigError`` naming the key when OmegaConf recorded one."""
    cause: Optional[BaseException] = error
    while cause is not None:
        key = getattr(cause, "full_key", None)
        if key:
            if isinstance(cause, ConfigKeyError) or "not in" in str(cause):
                return ConfigError([(str(key), _override_value(overrides, str(key)),
                                     _unknown_key_problem(str(key), schema))])
            value = _override_value(overrides, str(key))
            empty = " (the override gives no value: an unset shell variable in the script?)" if value == "" else ""
            return ConfigError([(str(key), value, _first_line(cause) + empty)])
        cause = cause.__cause__ or cause.__context__
    unparsed = re.search(r"Error when parsing index: \d+, string: (\S+?)=(.*) out of \[", str(error))
    if unparsed:  # name the override Hydra could not parse, and the usual cause: braces or brackets in the value
        key, value = unparsed.groups()
        hint = (" — Hydra reads {…} and […] in a value as a dict or list: quote the value, e.g. "
                f"'{key}=\"{value}\"'" if re.search(r"[{}\[\]]", value) else "")
        return ConfigError([(key, value, f"the override does not parse{hint}")])
    return ConfigError([("overrides", list(overrides), _first_line(error))])


def _override_value(overrides: Sequence[str], key: str) -> Any:
    """The value the last override of ``key`` gives it (the one that counts, as in Hydra), or None."""
    for override in reversed(overrides):
        name, _, value = override.lstrip("+~").partition("=")
        if name == key:
            return value
    return None


@functools.lru_cache(maxsize=None)
def _structured(schema: type) -> DictConfig:
    """The schema's defaults as a structured config, built once per schema (0.15 s each for ``TrainConfig``: a
    sixth of a config load)."""
    return OmegaConf.structured(schema)


def to_schema(raw: DictConfig | dict, schema: type[ConfigT]) -> ConfigT:
    """Merge a raw tree into the dataclass ``schema`` and build the typed object.

    Unknown keys (with a "did you mean" suggestion), wrong types and missing required values raise ``ConfigError``.
    """
    unknown = _unknown_key(raw, schema)
    if unknown:
        raise ConfigError([(unknown, _value_at(raw, unknown), _unknown_key_problem(unknown, schema))])
    try:
        merged = OmegaConf.merge(_structured(schema), raw)  # merge copies its first argument: the template is kept
        OmegaConf.resolve(merged)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except ConfigKeyError as error:
        key = str(getattr(error, "full_key", "") or "")
        raise ConfigError([(key, _value_at(raw, key), _unknown_key_problem(key, schema))]) from None
    except OmegaConfBaseException as error:
        key = str(getattr(error, "full_key", "") or "")
        raise ConfigError([(key, _value_at(raw, key), _first_line(error))]) from None


def load_config(overrides: Sequence[str] = (), config_name: str = DEFAULT_CONFIG_NAME, *,
                conf_dir: Optional[Path] = None, extra_dirs: Sequence[Path] = (), check_paths: bool = True,
                translation_report: Optional[list[str]] = None) -> Any:
    """Compose, type-check, validate and freeze a trainer config — the one entry point for CLI, recipes and notebooks.

    Returns a ``TrainConfig`` for ``ppo_trainer`` (and configs built on it), an ``SFTConfig`` for ``sft_trainer``,
    an ``RMConfig`` for ``rm_trainer``, a ``DPOConfig`` for ``dpo_trainer``. ``conf_dir`` replaces the built-in config directory, ``extra_dirs`` are
    searched before it (:func:`config_search_path`). Overrides may use verl's layout (``actor_rollout_ref.actor.optim.lr``);
    ``translation_report``, when given, receives one line per verl key translated, without effect or defaulted
    (keys without effect are also logged).

    Example::

        config = load_config(["algorithm.adv_estimator=grpo", "rollout.n=8", "model.path=/models/qwen"])
    """
    from hybridrl.config.job_validation import validate_dpo_config, validate_rm_config, validate_sft_config
    from hybridrl.config.validation import validate_config

    raw, translation = compose_translated(config_name, overrides, conf_dir, extra_dirs)
    _log_translation(translation)
    _log_device(raw)
    if translation_report is not None:
        translation_report.extend(translation.report())
    schema = schema_of(raw)
    config = to_schema(raw, schema)
    validator = {SFTConfig: validate_sft_config, RMConfig: validate_rm_config,
                 DPOConfig: validate_dpo_config}.get(schema, validate_config)
    validator(config, check_paths=check_paths)
    config.freeze()
    return config


def _log_device(raw: DictConfig) -> None:
    trainer = raw.get("trainer")
    if trainer is None or trainer.get("device") != "auto" or "n_gpus_per_node" not in trainer:
        return
    import torch

    found = f"cuda ({torch.cuda.device_count()} visible)" if torch.cuda.is_available() else "cpu (no CUDA device visible)"
    logger.info("trainer.device=auto: %s; %s nodes × %s devices", found, trainer.nnodes, trainer.n_gpus_per_node)


def _log_translation(translation: Translation) -> None:
    if not translation.verl_layout:
        return
    logger.info("verl layout: %d key(s) moved to hybridrl's names, %d verl default(s) applied, %d without effect "
                "(`hybridrl config` lists them all)", len(translation.moved), len(translation.defaults),
                len(translation.no_effect))
    for key, value, reason in translation.no_effect:
        logger.info("verl key %s=%s has no effect: %s", key, value, reason)


def schema_of(raw: DictConfig) -> type:
    """The dataclass a composed config was built on (its defaults list names ``<name>_schema``)."""
    found = OmegaConf.get_type(raw)
    return found if found in SCHEMAS.values() else TrainConfig


def config_to_yaml(config: Any, redact_secrets: bool = True) -> str:
    """The resolved config as YAML; values of keys that look like credentials are replaced by ``***``."""
    tree = OmegaConf.to_container(OmegaConf.structured(config), resolve=True)
    if redact_secrets:
        tree = _redact(tree)
    return OmegaConf.to_yaml(tree, sort_keys=False)


def dump_config(config: Any, run_dir: str | os.PathLike) -> Path:
    """Write ``<run_dir>/config.yaml`` (resolved, secrets redacted) and return its path."""
    path = Path(run_dir) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_to_yaml(config))
    return path


def _unknown_key(raw: DictConfig | dict, schema: type, prefix: str = "") -> Optional[str]:
    """The first dotted key of ``raw`` that ``schema`` does not define (``+key=value`` gets past Hydra), else None."""
    import typing

    hints = typing.get_type_hints(schema)
    for key in raw.keys():
        if key not in hints:
            return f"{prefix}{key}"
        child_type = hints[key]
        child = raw[key]
        if is_dataclass(child_type) and isinstance(child, (dict, DictConfig)):
            found = _unknown_key(child, child_type, f"{prefix}{key}.")
            if found:
                return found
    return None


def _redact(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: (REDACTED if is_secret_key(key) and isinstance(value, str) and value else _redact(value))
                for key, value in tree.items()}
    if isinstance(tree, list):
        return [_redact(item) for item in tree]
    return tree


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _value_at(raw: DictConfig | dict, dotted_key: str) -> Any:
    node: Any = raw
    for part in dotted_key.split(".") if dotted_key else []:
        try:
            node = node[part]
        except Exception:
            return None
    return OmegaConf.to_container(node) if isinstance(node, DictConfig) else node


def _unknown_key_problem(dotted_key: str, schema: Optional[type]) -> str:
    """Why ``dotted_key`` is refused: a retired key names its replacement, another gets a "did you mean"."""
    return retired_key_message(dotted_key) or f"unknown config key{_suggestion(dotted_key, schema)}"


def _suggestion(dotted_key: str, schema: Optional[type]) -> str:
    """A " (did you mean ...?)" hint with the closest valid key at the same level, or an empty string."""
    if schema is None:
        return ""
    *parents, leaf = dotted_key.split(".") if dotted_key else [""]
    node: Any = schema
    for part in parents:
        node = _field_type(node, part)
        if node is None:
            return ""
    names = [f.name for f in fields(node)] if is_dataclass(node) else []
    close = difflib.get_close_matches(leaf, names, n=1)
    return f" (did you mean '{'.'.join([*parents, close[0]])}'?)" if close else ""


def _field_type(dataclass_type: Any, name: str) -> Optional[type]:
    """Resolve a field's dataclass type, following postponed (string) annotations."""
    import typing

    if not is_dataclass(dataclass_type):
        return None
    hints = typing.get_type_hints(dataclass_type)
    candidate = hints.get(name)
    return candidate if is_dataclass(candidate) else None
