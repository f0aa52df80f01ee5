"""Read YAML files with errors that name the file and the line to fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cascade_repro.errors import ConfigError


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The mapping in a YAML file; an empty file is an empty mapping."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
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
