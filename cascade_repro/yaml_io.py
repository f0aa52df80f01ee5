"""Read YAML files with errors that name the file and the line to fix."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from cascade_repro.errors import ConfigError

# YAML 1.1 (PyYAML) reads `1e-3` as a string; YAML 1.2 (DVC's ruamel, and every ML user) reads a
# float. Floats are resolved the 1.2 way so `lr: 1e-3` and `--set lr=1e-3` are numbers.
_FLOAT_12 = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")


@lru_cache(maxsize=1)
def loader() -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))
    return Loader


def parse_yaml(text: str) -> Any:
    """One YAML document, floats as in YAML 1.2."""
    import yaml

    return yaml.load(text, Loader=loader())  # noqa: S506 - a SafeLoader subclass


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The mapping in a YAML file; an empty file is an empty mapping."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = parse_yaml(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(
            f"malformed YAML in {where}: {exc.problem}",
            hint=f"fix line {mark.line + 1 if mark else '?'} of {path.name}",
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML in {path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping of keys to values, not a {type(data).__name__}",
            hint="write it as `key: value` lines",
        )
    return data
