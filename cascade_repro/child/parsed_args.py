"""The params the script parsed, noted for the parent: its argparse namespace, jsonargparse's config
(LightningCLI's), a click command's params, the arguments Python Fire called it with, or Hydra's
config.

A script configured by `argparse` never calls `cascade_repro.params()`; its configuration is the
namespace its parser returns. Installed on the script's `import argparse` (child/hooks.py), this
wraps `ArgumentParser.parse_known_args` (which `parse_args` and `parse_intermixed_args` go through)
and notes the top-level parses of the script's own command line: not a sub-parser (it runs inside
its parent's parse) and not a parser given another list, except what a parse of the command line
left over (`parse_known_args`' second value). timm's two stages are one configuration: a config
parser takes `-c FILE` from the command line, the file becomes the defaults, and the real parser is
given the rest; what is noted is the union of their namespaces (a later parse's value of a name
stands). A parse that only repeats what is noted changes nothing.

jsonargparse (LightningCLI's parser) subclasses argparse's but parses in its own `parse_args`, never
through `parse_known_args`: its top-level parses of the command line are noted on their own, the
nested config (the --config files merged with the options typed) flattened to dotted keys as its
options are typed (`model.lr`); a subcommand's (`fit`) values as the top level's, beside
`subcommand`; its paths as given (not the absolute path they resolve to: a restore's differs).
jsonargparse is never imported here: hooked once the script imports it.

Hugging Face's HfArgumentParser parses the command line through argparse's `parse_known_args`; the
dataclasses it makes from a dict instead (`parse_json_file`, `parse_yaml_file`: the examples'
`run_clm.py args.json`) are noted beside those parses, field by field.

A click (or Typer) command parses the command line in its own `make_context`: the params of the
context made of the script's own command line are noted, and those of its subcommands' contexts.

Python Fire parses the command line itself: the arguments it calls the script's function with are
noted (`fire_hooks`).

A Hydra app's command line is Hydra's (`--config-name`, `--multirun`, overrides): its parser is not
the script's, and what the script used is the config Hydra composed and hands to the task function
(`hydra.core.utils.run_job`), noted flattened to dotted keys (`optimizer.lr`), interpolations
resolved; of a multirun, the first job's. Hydra is never imported here: hooked once the script
imports it.

Values are kept as JSON can hold them (str, int, float, bool, None and lists of them); anything else
as its truncated repr.
"""

from __future__ import annotations

import functools
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
        if depth == 0 and not getattr(self, NOT_THE_SCRIPTS, False) and _own_command_line(args, left_over):
            try:
                _note(self, result, noted, left_over, dropped, note)
            except Exception:  # noting must never change what the script does
                pass
        return result

    def add(made: dict[str, Any]) -> None:  # values a parser made without parsing (`_watch_parse_dict`)
        _merge(noted, made, note)

    parse_known_args._cascade_parsed_args = True  # type: ignore[attr-defined]
    parse_known_args._cascade_add = add  # type: ignore[attr-defined]
    parser_class.parse_known_args = parse_known_args


def _note(parser: Any, result: Any, noted: dict[str, Any], left_over: list[Any], dropped: dict[str, Any],
          note: Note) -> None:  # fmt: skip
    namespace, rest = result
    if isinstance(rest, list) and len(left_over) < MAX_LINES:
        left_over.append(rest)  # the script may hand it to its next parser (timm)
    made = _defaults_made_for_this_run(parser, namespace, dropped)
    _merge(noted, {name: value for name, value in values(namespace).items() if name not in made}, note)


def _merge(noted: dict[str, Any], new: dict[str, Any], note: Note) -> None:
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


def _own_command_line(args: Sequence[str] | None, left_over: list[Any]) -> bool:
    """The command line, or what a parse of it left over: that very list, or a copy of it unless it is
    empty (`parse_args([])` elsewhere, for a parser's defaults, is not the script's configuration)."""
    if args is None:
        return True
    try:
        given = list(args)
        return given == sys.argv[1:] or any(args is rest or (rest and given == rest) for rest in left_over)
    except TypeError:
        return False


def hf_argparser_hooks() -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: the dataclasses Hugging Face's HfArgumentParser makes from a dict
    (`parse_json_file`, `parse_yaml_file`: the examples' `run_clm.py args.json`) noted as its parses
    of the command line are, beside them. It never parses a command line then."""
    return {"transformers.hf_argparser": lambda module: _guarded(lambda: _watch_parse_dict(module))}


def _watch_parse_dict(module: Any) -> None:
    parser_class = module.HfArgumentParser
    original = parser_class.parse_dict
    if getattr(original, "_cascade_parsed_args", False):
        return
    state = threading.local()

    @functools.wraps(original)
    def parse_dict(self: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(state, "depth", 0)
        state.depth = depth + 1
        try:
            outputs = original(self, *args, **kwargs)
        finally:
            state.depth = depth
        if depth == 0:
            _guarded(lambda: _add_dataclasses(outputs))
        return outputs

    parse_dict._cascade_parsed_args = True  # type: ignore[attr-defined]
    parser_class.parse_dict = parse_dict


def _add_dataclasses(outputs: Any) -> None:
    """The fields of the dataclasses a parser made, among the values noted of argparse's parses (the
    parser is an argparse one: `watch` ran on its import), but those made for this run alone."""
    import dataclasses

    add = getattr(sys.modules["argparse"].ArgumentParser.parse_known_args, "_cascade_add", None)
    if add is None:
        return
    made: dict[str, Any] = {}
    for output in list(outputs)[:MAX_ITEMS]:
        if dataclasses.is_dataclass(output) and not isinstance(output, type):
            made.update({f.name: getattr(output, f.name, None) for f in dataclasses.fields(output) if f.init})
    from cascade_repro.child.script_globals import made_for_this_run  # (it imports this module)

    this_run = made_for_this_run(made)
    add({name: safe_value(value) for name, value in list(made.items())[:MAX_VALUES] if name not in this_run})


def click_hooks(note: Note) -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: `note` called with the params a click (or Typer) command parsed
    from the script's own command line, its subcommands' beside its own (a later one's value of a
    name stands), as the command function gets them (StyleGAN's and EDM's `train.py`)."""
    return {"click.core": lambda module: _guarded(lambda: _watch_click(module, note))}


def _watch_click(module: Any, note: Note) -> None:
    command_class = module.Command
    original = command_class.make_context
    if getattr(original, "_cascade_parsed_args", False):
        return
    noted: dict[str, Any] = {}
    roots: list[Any] = []  # the top-level contexts made of the script's own command line

    @functools.wraps(original)
    def make_context(self: Any, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
        own = parent is None and _own_command_line(args, [])  # (before the parse takes from the list)
        context = original(self, info_name, args, parent=parent, **extra)
        if own or (parent is not None and any(context.find_root() is root for root in roots)):
            if own and len(roots) < MAX_LINES:
                roots.append(context)
            _guarded(lambda: _note_click(context, noted, note))
        return context

    make_context._cascade_parsed_args = True  # type: ignore[attr-defined]
    command_class.make_context = make_context


def _note_click(context: Any, noted: dict[str, Any], note: Note) -> None:
    from cascade_repro.child.script_globals import made_for_this_run  # (it imports this module)

    params = dict(list(context.params.items())[:MAX_VALUES])
    this_run = made_for_this_run(params)
    _merge(noted, {str(name): safe_value(v) for name, v in params.items() if name not in this_run}, note)


def fire_hooks(note: Note) -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: `note` called with the arguments Python Fire calls the script's
    function (or class, then method) with, parsed from the script's own command line, defaults
    included and a `**kwargs` parameter's items by their names (`fire.Fire(train)`: alpaca-lora's,
    llama-recipes' fine-tuning)."""
    return {"fire.core": lambda module: _guarded(lambda: _watch_fire(module, note))}


def _watch_fire(module: Any, note: Note) -> None:
    """`Fire(component, command=None)` parses `sys.argv[1:]`; each call it makes is parsed by a
    function `_MakeParseFn(fn, metadata)` returns (Fire's own, private: where it is gone, nothing is
    noted): wrapped to note what it parsed while such a `Fire` runs."""
    fire, make_parse_fn = module.Fire, module._MakeParseFn
    if getattr(fire, "_cascade_parsed_args", False):
        return
    noted: dict[str, Any] = {}
    state = threading.local()

    @functools.wraps(fire)
    def fire_on_command_line(component: Any = None, command: Any = None, *args: Any, **kwargs: Any) -> Any:
        own = getattr(state, "own", False)
        state.own = command is None and not own  # (not a Fire inside the script's function)
        try:
            return fire(component, command, *args, **kwargs)
        finally:
            state.own = own

    @functools.wraps(make_parse_fn)
    def noting_make_parse_fn(fn: Any, *args: Any, **kwargs: Any) -> Any:
        parse = make_parse_fn(fn, *args, **kwargs)
        if not getattr(state, "own", False):
            return parse

        @functools.wraps(parse)
        def noting_parse(*parse_args: Any, **parse_kwargs: Any) -> Any:
            parsed = parse(*parse_args, **parse_kwargs)
            _guarded(lambda: _note_call(fn, parsed[0], noted, note))
            return parsed

        return noting_parse

    fire_on_command_line._cascade_parsed_args = True  # type: ignore[attr-defined]
    module.Fire = fire_on_command_line
    module._MakeParseFn = noting_make_parse_fn  # (before fire/__init__ takes `Fire` from here)


def _note_call(fn: Any, call: Any, noted: dict[str, Any], note: Note) -> None:
    """The arguments of one call Fire makes, bound to `fn`'s parameters with their defaults."""
    import inspect

    varargs, kwargs = call
    bound = inspect.signature(fn).bind_partial(*varargs, **kwargs)
    bound.apply_defaults()
    made: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD and isinstance(value, dict):
            made.update(value)
        elif name not in ("self", "cls"):
            made[name] = value
    from cascade_repro.child.script_globals import made_for_this_run  # (it imports this module)

    made = dict(list(made.items())[:MAX_VALUES])
    this_run = made_for_this_run(made)
    _merge(noted, {str(name): safe_value(v) for name, v in made.items() if name not in this_run}, note)


def jsonargparse_hooks(note: Note) -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: `note` called with the config of each top-level parse of the
    command line by a jsonargparse parser."""
    return {"jsonargparse": lambda module: _guarded(lambda: _watch_jsonargparse(module, note))}


def _watch_jsonargparse(module: Any, note: Note) -> None:
    parser_class = module.ArgumentParser
    original = parser_class.parse_args
    if getattr(original, "_cascade_parsed_args", False):
        return
    state = threading.local()
    path_type = getattr(module, "Path", None)

    @functools.wraps(original)
    def parse_args(self: Any, args: Sequence[str] | None = None, *more: Any, **kwargs: Any) -> Any:
        depth = getattr(state, "depth", 0)
        state.depth = depth + 1
        try:
            result = original(self, args, *more, **kwargs)
        finally:
            state.depth = depth
        if depth == 0 and not getattr(self, NOT_THE_SCRIPTS, False) and _own_command_line(args, []):
            _guarded(lambda: note(configured(result.as_dict(), path_type)))
        return result

    parse_args._cascade_parsed_args = True  # type: ignore[attr-defined]
    parser_class.parse_args = parse_args


def configured(tree: dict[str, Any], path_type: Any = None) -> dict[str, Any]:
    """jsonargparse's config as JSON-safe params with dotted keys: a subcommand's values at the top
    (`model.lr`, not `fit.model.lr`), its paths (`--config` files) as given."""
    subcommand = tree.get("subcommand")
    if isinstance(subcommand, str) and isinstance(tree.get(subcommand), dict):
        tree = {"subcommand": subcommand, **tree[subcommand]}

    def as_given(value: Any) -> Any:
        if path_type is not None and isinstance(value, path_type):
            return str(value)  # (its repr holds the working directory)
        if isinstance(value, list):
            return [as_given(item) for item in value]
        return value

    flat: dict[str, Any] = {}
    _flatten(tree, "", flat, as_given)
    return flat


def hydra_hooks(note: Note) -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: Hydra's own parser marked as not the script's, and `note` called
    with the config of the first job Hydra runs, as its task function gets it."""
    return {
        "hydra._internal.utils": lambda module: _guarded(lambda: _mark_hydra_parser(module)),
        "hydra.core.utils": lambda module: _guarded(lambda: _watch_hydra_jobs(module, note)),
    }


def _mark_hydra_parser(module: Any) -> None:
    """`hydra.main` parses the command line with `get_args_parser()`'s parser (`--cfg`, `--multirun`,
    the overrides): Hydra's flags, not the app's params. Wrapped before `hydra.main` imports it."""
    original = module.get_args_parser

    @functools.wraps(original)
    def get_args_parser(*args: Any, **kwargs: Any) -> Any:
        parser = original(*args, **kwargs)
        try:
            setattr(parser, NOT_THE_SCRIPTS, True)
        except Exception:
            pass
        return parser

    module.get_args_parser = get_args_parser


def _watch_hydra_jobs(module: Any, note: Note) -> None:
    """`run_job(task_function, config, ...)` calls the task function with the composed config (less
    its `hydra` node); each launcher imports it by name, after this wraps it."""
    original = module.run_job
    done: list[bool] = []

    def noting(task: Any) -> Any:
        @functools.wraps(task)
        def task_function(cfg: Any, *args: Any, **kwargs: Any) -> Any:
            if not done:
                done.append(True)
                _guarded(lambda: note(composed(cfg)))
            return task(cfg, *args, **kwargs)

        return task_function

    @functools.wraps(original)
    def run_job(*args: Any, **kwargs: Any) -> Any:
        if "task_function" in kwargs:
            kwargs["task_function"] = noting(kwargs["task_function"])
        elif args:
            args = (noting(args[0]), *args[1:])
        return original(*args, **kwargs)

    module.run_job = run_job


def composed(cfg: Any) -> dict[str, Any]:
    """An OmegaConf config as JSON-safe params with dotted keys, interpolations resolved where they
    resolve (`optimizer.lr`, as cascade flattens a params file)."""
    omegaconf = sys.modules["omegaconf"]  # Hydra's, already imported
    try:
        container = omegaconf.OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation that does not resolve outside the app: kept as written
        container = omegaconf.OmegaConf.to_container(cfg, resolve=False)
    flat: dict[str, Any] = {}
    _flatten(container, "", flat)
    return flat


def _flatten(node: Any, prefix: str, flat: dict[str, Any], leaf: Callable[[Any], Any] = lambda v: v) -> None:
    for key, value in node.items():
        if len(flat) >= MAX_VALUES:
            return
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            _flatten(value, f"{name}.", flat, leaf)
        else:
            flat[name] = {} if isinstance(value, dict) else safe_value(leaf(value))


def _guarded(action: Callable[[], Any]) -> None:
    try:
        action()
    except Exception:  # noting must never change what the script does
        pass


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
