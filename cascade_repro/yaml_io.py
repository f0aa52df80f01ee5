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

# Aliases let a few hundred bytes name billions of values ("billion laughs": a 384-byte file made a
# 301 MB run record). A config is counted as if every alias were written out, before it is built,
# and refused past these. Real configs (a full Hydra config included) hold a few thousand values and
# a few KB of text; data belongs in DVC, not in a config that is copied into every run record.
MAX_YAML_NODES = 100_000  # keys, values and list items, each alias counted as what it repeats
MAX_YAML_CHARS = 1_000_000  # characters of keys and values, aliases counted the same way


@lru_cache(maxsize=1)
def loader() -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.anchor_of: dict[int, str] = {}  # id(node) → its anchor, to name it in errors

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            node = super().compose_node(parent, index)
            if getattr(event, "anchor", None):
                self.anchor_of[id(node)] = event.anchor
            return node

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))
    return Loader


def parse_yaml(text: str, source: str = "the YAML value", lines: bool = True) -> Any:
    """One YAML document, floats as in YAML 1.2.

    Raises yaml.YAMLError for a syntax error, ConfigError (naming `source`, and the line where `lines`)
    for a document that refers to itself through an alias or that aliases expand past MAX_YAML_NODES
    or MAX_YAML_CHARS.
    """
    composer = loader()(text)
    try:
        try:
            node = composer.get_single_node()
        except RecursionError:
            raise ConfigError(
                f"{source}: nested too deeply to read", hint="flatten the nesting of lists and mappings"
            ) from None
        if node is None:
            return None
        _check_expanded_size(node, composer.anchor_of, source, lines)
        return composer.construct_document(node)
    finally:
        composer.dispose()


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The mapping in a YAML file; an empty file is an empty mapping."""
    import yaml

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "is it a binary file?",
            hint=f"save {path.name} as UTF-8 YAML text",
        ) from None
    try:
        data = parse_yaml(text, str(path))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(
            f"malformed YAML in {where}: {exc.problem}",
            hint=f"fix line {mark.line + 1 if mark else '?'} of {path.name}",
        ) from None
    except yaml.reader.ReaderError as exc:  # a control character (NUL, ...): binary content
        line = text[: exc.position].count("\n") + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise ConfigError(
            f"{path}:{line}: character U+{code:04X} is not allowed in YAML; is it a binary file?",
            hint=f"{path.name} must be YAML text",
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


def _check_expanded_size(root: Any, anchor_of: dict[int, str], source: str, lines: bool) -> None:
    """Count the composed node graph as if every alias were written out, without writing it out.

    An alias is the same node object as its anchor, so the graph is a DAG (or, for `&a [*a]`, has a
    cycle): sizes are memoized per node, which keeps this linear in the file's length.
    """
    import yaml

    sizes: dict[int, tuple[int, int]] = {}  # id(node) → (nodes, characters) once expanded
    entered: set[int] = set()  # on the current path: meeting one again is a cycle
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        children = _children(node, yaml)
        if leaving:
            entered.discard(key)
            nodes, chars = 1, len(node.value) if isinstance(node, yaml.ScalarNode) else 0
            for child in children:
                child_nodes, child_chars = sizes[id(child)]
                nodes, chars = nodes + child_nodes, chars + child_chars
            if nodes > MAX_YAML_NODES or chars > MAX_YAML_CHARS:
                where = f"{source}:{node.start_mark.line + 1}" if lines else source
                raise _too_large(node, anchor_of, where, nodes > MAX_YAML_NODES)
            sizes[key] = (nodes, chars)
            continue
        if key in sizes:
            continue
        if key in entered:
            anchor = anchor_of.get(key)
            name = f"&{anchor}" if anchor else "a value"
            where = f"{source}:{node.start_mark.line + 1}" if lines else source
            raise ConfigError(
                f"{where}: {name} contains itself (a recursive alias"
                + (f" *{anchor}" if anchor else "")
                + " inside its own anchor)",
                hint="an alias may only repeat a value defined before and outside it",
            )
        entered.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children)


def _children(node: Any, yaml: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _too_large(node: Any, anchor_of: dict[int, str], where: str, by_nodes: bool) -> ConfigError:
    anchor = anchor_of.get(id(node))
    where += f" (&{anchor})" if anchor else ""
    limit = f"{MAX_YAML_NODES:,} values" if by_nodes else f"{MAX_YAML_CHARS:,} characters"
    return ConfigError(
        f"{where}: more than {limit} once its aliases are expanded; cascade refuses YAML this large"
        " (a config is copied into every run record)",
        hint="write out the values you need instead of aliases of aliases; keep data in files tracked by DVC",
    )
