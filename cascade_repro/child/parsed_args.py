"""The params the script parsed, noted for the parent: its argparse namespace.

A script configured by `argparse` never calls `cascade_repro.params()`; its configuration is the
namespace its parser returns. Installed on the script's `import argparse` (child/hooks.py), this
wraps `ArgumentParser.parse_known_args` (which `parse_args` and `parse_intermixed_args` go through)
and notes the top-level parses of the script's own command line: not a sub-parser (it runs inside
its parent's parse) and not a parser given another list, except what a parse of the command line
left over (`parse_known_args`' second value). timm's two stages are one configuration: a config
parser takes `-c FILE` from the command line, the file becomes the defaults, and the real parser is
given the rest; what is noted is the union of their namespaces (a later parse's value of a name
stands). A parse that only repeats what is noted changes nothing.

The configuration frameworks (jsonargparse, HfArgumentParser's files, click, Fire, Hydra) are hooked
in child/framework_args.py, with the helpers here.

Values are kept as JSON can hold them (str, int, float, bool, None and lists of them); anything else
as its truncated repr.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Sequence

Note = Callable[[dict[str, Any]], None]
MAX_VALUES = 1000  # as many as cascade takes params (params.MAX_PARAMS)
MAX_REPR = 200
MAX_ITEMS = 100  # a list longer than this is kept as its repr
MAX_TEXT = 6000  # MLflow's limit on a param's value


NOT_THE_SCRIPTS = "_cascade_not_params"  # set on a parser whose namespace is not the script's params
MAX_LINES = 16  # argument lists that parses of the command line left over, kept to compare with


def watch(argparse: ModuleType, note: Note) -> None:
    """Make each top-level parse of the script's own command line (`sys.argv[1:]`, or what such a
    parse left over) call `note` with the values noted so far, this parse's over the earlier ones."""
    parser_class = argparse.ArgumentParser
    original = parser_class.parse_known_args
    if getattr(original, "_cascade_parsed_args", False):
        return
    state = threading.local()
    noted: dict[str, Any] = {}
    left_over: list[Any] = []
    dropped: dict[str, Any] = {}  # values left out as made for this run (`_defaults_made_for_this_run`)

    def parse_known_args(self: Any, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        depth = getattr(state, "depth", 0)
        state.depth = depth + 1
        try:
            result = original(self, args, namespace)
        finally:
            state.depth = depth
        if depth == 0 and not getattr(self, NOT_THE_SCRIPTS, False) and own_command_line(args, left_over):
            try:
                _note(self, result, noted, left_over, dropped, note)
            except Exception:  # noting must never change what the script does
                pass
        return result

    def add(made: dict[str, Any]) -> None:  # values a parser made without parsing (`_watch_parse_dict`)
        merge(noted, made, note)

    parse_known_args._cascade_parsed_args = True  # type: ignore[attr-defined]
    parse_known_args._cascade_add = add  # type: ignore[attr-defined]
    parser_class.parse_known_args = parse_known_args


def _note(parser: Any, result: Any, noted: dict[str, Any], left_over: list[Any], dropped: dict[str, Any],
          note: Note) -> None:  # fmt: skip
    namespace, rest = result
    if isinstance(rest, list) and len(left_over) < MAX_LINES:
        left_over.append(rest)  # the script may hand it to its next parser (timm)
    made = _defaults_made_for_this_run(parser, namespace, dropped)
    merge(noted, {name: value for name, value in values(namespace).items() if name not in made}, note)


def merge(noted: dict[str, Any], new: dict[str, Any], note: Note) -> None:
    """The values noted so far with `new` over them; `note` told where that changes them."""
    merged = {**noted, **new}
    if merged != noted:
        noted.clear()
        noted.update(list(merged.items())[:MAX_VALUES])
        note(dict(noted))


def _defaults_made_for_this_run(parser: Any, namespace: Any, dropped: dict[str, Any]) -> set[str]:
    """The names whose value is a default of the parser's (nothing typed) made for this run alone
    (`default=time.strftime(...)`, a pid, a clock reading: child/script_globals.py), which would make
    two runs of one command differ in params. A default is an option's (the very object, or its string
    through the option's type: a Path of it), a sub-command's option's, or `set_defaults`'. A value typed
    on the command line is kept. `dropped` keeps the values left out for a later parse of the same line
    (parse_intermixed_args parses twice, its defaults hidden the second time)."""
    defaults: dict[str, list[Any]] = {}
    for each in _parsers(parser):
        for action in getattr(each, "_actions", ()):
            defaults.setdefault(action.dest, []).append(action.default)
        for dest, default in dict(getattr(each, "_defaults", None) or {}).items():
            defaults.setdefault(dest, []).append(default)
    given: dict[str, Any] = {}
    made: set[str] = set()
    for name, value in vars(namespace).items():
        if value is None:
            continue
        if name in dropped and dropped[name] is value:
            made.add(name)
            continue
        default = next((d for d in defaults.get(name, ()) if d is value or _converted(value, d)), None)
        if default is not None:
            given[name] = default  # (as the script made it: a Path's string)
    if given:
        from cascade_repro.child.script_globals import made_for_this_run  # (it imports this module)

        for name in made_for_this_run(given):
            made.add(name)
            dropped[name] = getattr(namespace, name, None)
    return made


def _parsers(parser: Any, depth: int = 0) -> list[Any]:
    """The parser and its sub-commands' parsers, a few levels down."""
    found = [parser]
    if depth < 3:
        for action in getattr(parser, "_actions", ()):
            choices = getattr(action, "choices", None)
            if type(action).__name__ == "_SubParsersAction" and isinstance(choices, dict):
                for sub in list(choices.values())[:100]:
                    found += _parsers(sub, depth + 1)
    return found


def _converted(value: Any, default: Any) -> bool:
    """Whether argparse made `value` from the string `default` through the option's type (a Path, a
    number)."""
    if type(default) is not str or type(value) is str:
        return False
    try:
        if isinstance(value, os.PathLike):
            return os.fspath(value) == default
        return any(type(value) is kind for kind in (int, float)) and str(value) == default
    except Exception:
        return False


def own_command_line(args: Sequence[str] | None, left_over: list[Any]) -> bool:
    """The command line, or what a parse of it left over: that very list, or a copy of it unless it is
    empty (`parse_args([])` elsewhere, for a parser's defaults, is not the script's configuration)."""
    if args is None:
        return True
    try:
        given = list(args)
        return given == sys.argv[1:] or any(args is rest or (rest and given == rest) for rest in left_over)
    except TypeError:
        return False


def guarded(action: Callable[[], Any]) -> None:
    try:
        action()
    except Exception:  # noting must never change what the script does
        pass


def note_kept(made: dict[str, Any], add: Callable[[dict[str, Any]], None]) -> None:
    """`made` (a parse's values) as JSON-safe params given to `add`, but those made for this run alone
    (a date, a clock reading: child/script_globals.py)."""
    from cascade_repro.child.script_globals import made_for_this_run  # (it imports this module)

    made = dict(list(made.items())[:MAX_VALUES])
    this_run = made_for_this_run(made)
    add({str(name): safe_value(value) for name, value in made.items() if name not in this_run})


def values(namespace: Any) -> dict[str, Any]:
    """The namespace's attributes as JSON-safe values, in the order argparse set them."""
    items = list(vars(namespace).items())[:MAX_VALUES]
    return {str(name): safe_value(value) for name, value in items}


def safe_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)) and len(value) <= MAX_ITEMS:
        return [safe_value(item) for item in value]
    return _repr(value)


def _repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= MAX_REPR else text[: MAX_REPR - 3] + "..."
