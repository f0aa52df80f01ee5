"""hyperparameters.yaml + `--set`/`--add` overrides + the seed → resolved params."""

from __future__ import annotations

import copy
import difflib
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from cascade_repro.errors import UsageError
from cascade_repro.yaml_io import parse_yaml, read_yaml_mapping

PARAMS_FILE = "hyperparameters.yaml"


@dataclass(frozen=True)
class ResolvedParams:
    values: dict[str, Any]
    source: str | None  # the params file, relative to the repo root
    overrides: dict[str, Any]
    seed: int
    seed_source: str  # "params", "option", "random" or "default"


def find_params_file(root: Path, script: Path, explicit: str | None, configured: str | None) -> Path | None:
    """`--params FILE`, else cascade.yaml's params_file, else hyperparameters.yaml beside the script
    or at the repo root."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise UsageError(f"params file not found: {explicit}", hint="check the --params path")
        return path.resolve()
    if configured:
        path = root / configured
        if not path.is_file():
            raise UsageError(
                f"params file {configured} (params_file in cascade.yaml) not found",
                hint="create it or fix params_file in cascade.yaml",
            )
        return path
    for candidate in (script.parent / PARAMS_FILE, root / PARAMS_FILE):
        if candidate.is_file():
            return candidate
    return None


def parse_assignment(text: str, option: str) -> tuple[str, Any]:
    """`a.b=value` with the value typed as YAML (`1e-3` is a float, `[1, 2]` a list)."""
    import yaml

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"{option} expects KEY=VALUE, got {text!r}", hint=f"e.g. {option} optimizer.lr=1e-3")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def resolve_params(
    params_file: Path | None,
    root: Path,
    sets: Iterable[str] = (),
    adds: Iterable[str] = (),
    seed: str | None = None,
) -> ResolvedParams:
    values: dict[str, Any] = read_yaml_mapping(params_file) if params_file else {}
    values = copy.deepcopy(values)
    overrides: dict[str, Any] = {}
    for text in sets:
        key, value = parse_assignment(text, "--set")
        if not has_key(values, key):
            raise UsageError(
                f"--set {key}: no such key in {params_file.name if params_file else 'the params'}"
                + _closest(key, flatten(values)),
                hint=f"use --add {key}=... to create a new key",
            )
        set_key(values, key, value)
        overrides[key] = value
    for text in adds:
        key, value = parse_assignment(text, "--add")
        try:
            set_key(values, key, value)
        except TypeError as exc:
            raise UsageError(f"--add {key}: {exc}") from None
        overrides[key] = value

    seed_value, seed_source = _resolve_seed(values, seed)
    if "seed" in values:
        values["seed"] = seed_value
    source = None
    if params_file is not None:
        try:
            source = str(params_file.relative_to(root))
        except ValueError:
            source = str(params_file)
    return ResolvedParams(values, source, overrides, seed_value, seed_source)


def _resolve_seed(values: Mapping[str, Any], option: str | None) -> tuple[int, str]:
    if option is not None:
        if option == "random":
            return secrets.randbelow(2**31), "random"
        try:
            return int(option), "option"
        except ValueError:
            raise UsageError(f"--seed must be an integer or 'random', not {option!r}") from None
    if "seed" in values:
        try:
            return int(values["seed"]), "params"
        except (TypeError, ValueError):
            raise UsageError(f"seed in the params file must be an integer, not {values['seed']!r}") from None
    return 0, "default"


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optimizer": {"lr": 1}} → {"optimizer.lr": 1}; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def has_key(values: Mapping[str, Any], dotted: str) -> bool:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def set_key(values: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = values
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise TypeError(f"{part!r} holds a {type(child).__name__}, not a mapping")
        node = child
    node[parts[-1]] = value


def _closest(key: str, flat: Mapping[str, Any]) -> str:
    keys = list(flat)
    # Also offer mapping prefixes, so `--set optimiser.lr` suggests `optimizer.lr`.
    matches = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    if not matches:
        leaf = key.rsplit(".", 1)[-1]
        matches = [k for k in keys if k.rsplit(".", 1)[-1] == leaf][:1]
    return f"; did you mean {matches[0]}?" if matches else ""
