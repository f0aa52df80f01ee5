"""hyperparameters.yaml + `--set`/`--add` overrides + the seed → resolved params."""

from __future__ import annotations

import copy
import difflib
import json
import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from cascade_repro.errors import CascadeError, ConfigError, UsageError
from cascade_repro.yaml_io import MAX_YAML_NODES, parse_yaml, read_yaml_mapping

PARAMS_FILE = "hyperparameters.yaml"
# Each flattened key becomes an MLflow param (100 per request, a row each in the UI) and a line of
# every run record; a 475-byte file of aliased mappings once made 27,900 of them. A real config,
# a full Hydra one included, has a few hundred.
MAX_PARAMS = 1000
# torch.manual_seed takes an unsigned 64-bit seed (a negative one is folded onto another seed's
# value) and numpy gets seed % 2**32 (child/seeding.py): 0..2**64-1 is what every RNG accepts as is.
SEED_RANGE = (0, 2**64 - 1)


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
        value = parse_yaml(raw, f"{option} {key}", lines=False) if raw.strip() else ""
    except yaml.YAMLError as exc:
        # `[1,` or `{a: 1` is a list or a mapping gone wrong, not a string (another value YAML cannot
        # read, `@home`, stays the text typed: a string param is checked against the file's type)
        if raw.lstrip().startswith(("[", "{", '"', "'")):
            problem = str(getattr(exc, "problem", None) or "").strip() or "malformed"
            raise UsageError(f"{option} {key}: {raw!r} is not valid YAML ({problem})",
                             hint=f"close its brackets or quotes; for the text itself, quote it: "
                             f"{option} \"{key}='{raw}'\"") from None  # fmt: skip
        value = raw
    except ConfigError as exc:  # an alias bomb or a recursive alias: the command line is at fault
        raise UsageError(exc.message, hint=exc.hint) from None
    return key, value


def resolve_params(
    params_file: Path | None,
    root: Path,
    sets: Iterable[str] = (),
    adds: Iterable[str] = (),
    seed: str | None = None,
) -> ResolvedParams:
    values: dict[str, Any] = read_yaml_mapping(params_file) if params_file else {}
    where = str(params_file) if params_file else "the params"
    # Keys as the script will see them (params reach it as JSON, where `1:` is "1"); mixed key types
    # would otherwise break sorting the record. This also copies the values the overrides change.
    values = _string_keys(values, where)
    _check_param_count(values, ConfigError, f"{where} holds", "split off what is not a hyperparameter")
    overrides = _override(values, sets, adds, params_file.name if params_file else "the params")
    if overrides:
        values = _string_keys(values, "--set/--add")
        _check_param_count(values, UsageError, "--set/--add make", "override fewer keys")

    seed_value, seed_source = _resolve_seed(values, seed, where, "seed" in overrides)
    if "seed" in values:
        values["seed"] = seed_value
    source = None
    if params_file is not None:
        try:
            source = str(params_file.relative_to(root))
        except ValueError:
            source = str(params_file)
    return ResolvedParams(values, source, overrides, seed_value, seed_source)


def _override(values: dict[str, Any], sets: Iterable[str], adds: Iterable[str], name: str) -> dict[str, Any]:
    """`--set` and `--add` applied to `values` (the params file `name`'s); the overrides, typed."""
    overrides: dict[str, Any] = {}
    for text in sets:
        key, value = parse_assignment(text, "--set")
        if not has_key(values, key):
            raise UsageError(f"--set {key}: no such key in {name}" + _closest(key, flatten(values)),
                             hint=f"use --add {key}=... to create a new key")  # fmt: skip
        if key != "seed":  # (the seed has its own check, in _resolve_seed)
            value = _as_in_file(key, get_key(values, key), value, text.partition("=")[2], name)
        set_key(values, key, value)
        overrides[key] = value
    for text in adds:
        key, value = parse_assignment(text, "--add")
        if has_key(values, key):
            raise UsageError(f"--add {key}: {key} is already in {name} ({_shown(get_key(values, key))})",
                             hint=f"--add is for a new key; change it with --set {key}=...")  # fmt: skip
        try:
            set_key(values, key, value)
        except TypeError as exc:
            raise UsageError(f"--add {key}: {exc}") from None
        overrides[key] = value
    return overrides


def _resolve_seed(
    values: Mapping[str, Any], option: str | None, where: str, overridden: bool
) -> tuple[int, str]:
    low, high = SEED_RANGE
    expected = f"an integer from {low} to {high} (2**64-1)"
    hint = "torch, numpy and Python's random are all seeded from it"
    if option is not None:
        if option == "random":
            return secrets.randbelow(2**31), "random"
        try:
            seed = int(option)
        except ValueError:
            raise UsageError(f"--seed must be an integer or 'random', not {option!r}") from None
        if not low <= seed <= high:
            raise UsageError(f"--seed {option} is out of range; expected {expected}", hint=hint)
        return seed, "option"
    if "seed" in values:
        raw = values["seed"]
        from_file = _integer(raw)
        if from_file is None or not low <= from_file <= high:
            error: type[CascadeError] = UsageError if overridden else ConfigError
            what = "--set seed" if overridden else f"{where}: seed"
            raise error(f"{what} is {raw!r}; expected {expected}", hint=f"{hint}; `--seed N` overrides it")
        return from_file, "params"
    return 0, "default"


def _integer(value: Any) -> int | None:
    """An int, an integral float (`1e3`) or a decimal string, else None (a bool is not a seed)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _string_keys(value: Any, where: str) -> Any:
    """A copy with every mapping key a string, as JSON writes it (1 → "1", true → "true")."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        written: dict[str, Any] = {}
        for key, item in value.items():
            name = key if isinstance(key, str) else json.dumps(key, default=str).strip('"')
            if name in out:
                both = f"keys {written[name]!r} and {key!r} are both {name!r}"
                raise ConfigError(f"{where}: {both} to the script", hint="rename one of them")
            out[name], written[name] = _string_keys(item, where), key
        return out
    if isinstance(value, list):
        return [_string_keys(item, where) for item in value]
    return copy.deepcopy(value)


def _check_param_count(values: Mapping[str, Any], error: type[CascadeError], what: str, fix: str) -> None:
    count = len(flatten(values))
    if count > MAX_PARAMS:
        raise error(
            f"{what} {count:,} params (flattened keys); cascade takes at most {MAX_PARAMS:,}",
            hint=f"{fix}; a list is one param, and data belongs in files tracked by DVC "
            f"(YAML is also capped at {MAX_YAML_NODES:,} values once aliases are expanded)",
        )


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


def get_key(values: Mapping[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        node = node[part]
    return node


# What `--set` may change a value's type to, the file's value deciding: the same kind; a number for
# a float (`lr: 0.1` → 1 is 1.0), a whole number for an integer (`steps: 20` → 1e3 is 1000), the
# number in a string too (`lr=!!str 1e-3` aside); the text typed for a string (`name: base` →
# `--set name=2024` is "2024"); anything for a null (unset), and null for anything. Else it is
# refused: `--set lr=abc` on a float would only crash the script later, `--set steps=2.5` too, and
# `--set optimizer=3` would drop a whole mapping. An explicit YAML tag says the type is meant:
# `--set 'optimizer.lr=!!str abc'`.
_KINDS = ((bool, "boolean", "!!bool"), (int, "integer", "!!int"), (float, "float", "!!float"),
          (str, "string", "!!str"), (list, "list", "!!seq"), (Mapping, "mapping", "!!map"))  # fmt: skip


def _kind(value: Any) -> tuple[str, str]:
    """The kind of a YAML value as `--set` compares them, and the YAML tag that forces it."""
    for types, kind, tag in _KINDS:
        if isinstance(value, types):
            return kind, tag
    return type(value).__name__, "!!str"


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        for parse in (int, float):
            try:
                return parse(value.strip())
            except ValueError:
                pass
    return None


def _as_in_file(key: str, old: Any, new: Any, raw: str, where: str) -> Any:
    """`new` (typed from `raw`) as the value of `key`, whose value in the file is `old`; a change of
    kind that the user cannot have meant is a UsageError naming the key, both kinds and the fix."""
    if old is None or new is None or raw.lstrip().startswith("!"):
        return new
    (was, _), (given, tag) = _kind(old), _kind(new)
    if was == given:
        return new
    if was == "string" and given in ("integer", "float", "boolean", "date", "datetime"):
        return raw.strip()
    number = _number(new) if was in ("integer", "float") else None
    if number is not None and was == "float":
        return float(number)
    if number is not None and float(number).is_integer():
        return int(number)
    if was == "mapping":
        fix = f"set one of its keys (--set {key}.{next(iter(old), 'KEY')}=...)"
    else:
        fix = "give " + {"integer": "a whole number", "float": "a number", "boolean": "true or false"}.get(
            was, _a(was))  # fmt: skip
    raise UsageError(
        f"--set {key}: {key} is {_a(was)} in {where} ({_shown(old)}), and {raw.strip()!r} is {_a(given)}",
        hint=f"{fix}; to change its type all the same, tag the value: --set '{key}={tag} {raw.strip()}'",
    )


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


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


# -- what the script used (issue 14.2) ---------------------------------------------------------------
ARGS_PREFIX = "args."  # an argparse value whose name the params file also has: `args.<name>`
HYDRA_PREFIX = "hydra."  # a value of Hydra's config whose name the params file also has
CASCADE_PREFIX = "cascade."  # cascade's value of a param the script logged itself with another value


def resolved_dict(resolved: ResolvedParams) -> dict[str, Any]:
    """The resolved params as JSON (the plan a recoverer reads, the input of `used_params`)."""
    return {"values": resolved.values, "source": resolved.source, "overrides": resolved.overrides,
            "seed": resolved.seed, "seed_source": resolved.seed_source}  # fmt: skip


# what the child notes of the script's parses of its command line (child/parsed_args.py), and the prefix
# of a name the params file also has
PARSED_SOURCES = (("argparse", ARGS_PREFIX), ("jsonargparse", ARGS_PREFIX), ("click", ARGS_PREFIX),
                  ("fire", ARGS_PREFIX), ("hydra", HYDRA_PREFIX))  # fmt: skip


def used_params(resolved: Mapping[str, Any], facts: Mapping[str, Any]) -> dict[str, Any]:
    """The record's `params` section: what the script used, from the resolved params file and what the child
    noted (`params_read`: it called `cascade_repro.params()`; `argparse`: its namespace; `jsonargparse`:
    the config a jsonargparse parser (LightningCLI's) made of it, with dotted keys; `click`: a click
    command's params; `fire`: the arguments Python Fire called it with; `hydra`: the config
    Hydra composed for it, with dotted keys; `globals`: its module's simple globals as training began,
    child/script_globals.py, the params of a script with none of the others).

    `values` holds the file's values only when the script read them, and the argparse namespace and
    Hydra's config (a name the file also has goes under `args.` or `hydra.`, so neither value hides
    the other); `file` keeps the resolved file for a restore, saying whether it was read; `seed` is
    the seed cascade applied (from the file's `seed` key even when the script never read the file).
    """
    read = bool(facts.get("params_read"))
    file_values = dict(resolved.get("values") or {})
    values: dict[str, Any] = copy.deepcopy(file_values) if read else {}
    sources = [str(resolved.get("source"))] if read and resolved.get("source") else []
    section: dict[str, Any] = {}
    taken = set(flatten(values)) | set(values)
    for source, prefix in PARSED_SOURCES:
        parsed = facts.get(source)
        if isinstance(parsed, Mapping):
            section[source] = _redacted(parsed)
            for name, value in section[source].items():
                values[f"{prefix}{name}" if name in taken else name] = value
            sources.append(source)
    noted = facts.get("globals")
    if not sources and isinstance(noted, Mapping) and noted:  # configured by its globals alone (nanoGPT)
        section["globals"] = values = _redacted(noted)
        sources.append("globals")
    path = resolved.get("source")
    return {
        "values": values,
        "source": " + ".join(sources) or None,
        "file": {"path": path, "read": read, "values": file_values} if path else None,
        **section,
        "overrides": dict(resolved.get("overrides") or {}),
        "seed": resolved.get("seed", 0),
        "seed_source": resolved.get("seed_source"),
    }


def _redacted(parsed: Mapping[str, Any]) -> dict[str, Any]:
    """Values the child noted, a secret-named one (`--api-key`, `db.password`) and URL credentials
    redacted."""
    from cascade_repro.redaction import MARKER, redact_text, secret_option

    def redacted(value: Any) -> Any:
        if isinstance(value, list):  # (`--mirrors URL...`, a list of servers among the globals)
            return [redacted(item) for item in value]
        return redact_text(value) if isinstance(value, str) else value

    return {
        str(name): MARKER if secret_option(str(name)) and value is not None else redacted(value)
        for name, value in list(parsed.items())[:MAX_PARAMS]
    }  # fmt: skip


def mlflow_params(section: Mapping[str, Any]) -> dict[str, Any]:
    """The MLflow params of a record's params section: its values flattened, and the seed cascade
    applied as `seed` (as `cascade.seed` when the script's own `seed` differs)."""
    flat = flatten(section.get("values") or {})
    seed = section.get("seed", 0)
    if "seed" not in flat:
        flat["seed"] = seed
    elif flat["seed"] != seed:
        flat[f"{CASCADE_PREFIX}seed"] = seed
    return flat


def unused_overrides(section: Mapping[str, Any], script: str) -> list[str]:
    """`--set`/`--add` keys of a params file the script never read: they changed nothing."""
    file = section.get("file") or {}
    if file.get("read") is not False:
        return []
    return [f"{key} (--set or --add) has no effect: {script} never called cascade_repro.params()"
            for key in section.get("overrides") or {} if key != "seed"]  # fmt: skip
