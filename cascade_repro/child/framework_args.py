"""The params a configuration framework parsed from the script's command line, noted for the parent
beside argparse's (child/parsed_args.py): each hooked once the script imports it, never imported here.

- jsonargparse (LightningCLI's parser) subclasses argparse's but parses in its own `parse_args`,
  never through `parse_known_args`: its top-level parses of the command line are noted, the nested
  config (the --config files merged with the options typed) flattened to dotted keys as its options
  are typed (`model.lr`); a subcommand's (`fit`) values as the top level's, beside `subcommand`; its
  paths as given (not the absolute path they resolve to: a restore's differs). A LightningCLI given its
  config as a dict (`args={...}`) parses it with `parse_object`: that config is noted the same way.
- Hugging Face's HfArgumentParser parses the command line through argparse's `parse_known_args`; the
  dataclasses it makes from a dict instead (`parse_json_file`, `parse_yaml_file`: the examples'
  `run_clm.py args.json`) are noted beside those parses, field by field.
- A click (or Typer) command parses the command line in its own `make_context`: the params of the
  context made of the script's own command line are noted, and those of its subcommands' contexts.
- Python Fire parses the command line itself: the arguments it calls the script's function with are
  noted.
- A Hydra app's command line is Hydra's (`--config-name`, `--multirun`, overrides): its parser is not
  the script's, and what the script used is the config Hydra composed and hands to the task function
  (`hydra.core.utils.run_job`), noted flattened to dotted keys (`optimizer.lr`), interpolations
  resolved; of a multirun, the first job's.

Values made for this run alone (a date, a clock reading: child/script_globals.py) are left out, as
of argparse's defaults.
"""

from __future__ import annotations

import functools
import sys
import threading
from types import ModuleType
from typing import Any, Callable

from cascade_repro.child.parsed_args import (
    MAX_ITEMS,
    MAX_LINES,
    MAX_VALUES,
    NOT_THE_SCRIPTS,
    Note,
    guarded,
    merge,
    note_kept,
    own_command_line,
    safe_value,
)

NoteSource = Callable[[str, dict[str, Any]], None]


def import_hooks(note: NoteSource) -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: each framework's parses noted as `note(source, values)`, the source
    one of params.PARSED_SOURCES (HfArgumentParser's files: among argparse's)."""
    return {
        **jsonargparse_hooks(lambda values: note("jsonargparse", values)),
        **lightning_cli_hooks(lambda values: note("jsonargparse", values)),
        **hf_argparser_hooks(),
        **click_hooks(lambda values: note("click", values)),
        **fire_hooks(lambda values: note("fire", values)),
        **hydra_hooks(lambda values: note("hydra", values)),
    }


def jsonargparse_hooks(note: Note) -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: `note` called with the config of each top-level parse of the
    command line by a jsonargparse parser."""

    def watch(module: Any) -> None:
        path_type = getattr(module, "Path", None)

        def parsed(parser: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
            given = args[0] if args else kwargs.get("args")
            if not getattr(parser, NOT_THE_SCRIPTS, False) and own_command_line(given, []):
                note(configured(result.as_dict(), path_type))

        _after_outermost(module.ArgumentParser, "parse_args", parsed)

    return {"jsonargparse": lambda module: guarded(lambda: watch(module))}


LIGHTNING_CLI_MODULES = ("lightning.pytorch.cli", "pytorch_lightning.cli")


def lightning_cli_hooks(note: Note) -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: `note` called with the config a LightningCLI was given as a dict
    (`LightningCLI(..., args={...})`, a script's or notebook's own), which it parses with jsonargparse's
    `parse_object`, not as a command line. (A list of arguments goes through `parse_args`, noted above;
    `parse_object` alone is not watched: jsonargparse parses a class's init args with it as well.)"""

    def watch(module: Any) -> None:
        def parsed(cli: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
            given = args[1] if len(args) > 1 else kwargs.get("args")
            if isinstance(given, dict) or type(given).__name__ == "Namespace":
                path_type = getattr(sys.modules.get("jsonargparse"), "Path", None)
                note(configured(cli.config.as_dict(), path_type))

        _after_outermost(module.LightningCLI, "parse_arguments", parsed)

    return dict.fromkeys(LIGHTNING_CLI_MODULES, lambda module: guarded(lambda: watch(module)))


After = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], None]  # (self, args, kwargs, result)


def _after_outermost(owner: Any, name: str, after: After) -> None:
    """The method `owner.name` wrapped, once, to call `after(self, args, kwargs, result)` when a call
    of it returns that ran inside no other (a parser's nested parses, on this thread)."""
    original = getattr(owner, name)
    if getattr(original, "_cascade_parsed_args", False):
        return
    state = threading.local()

    @functools.wraps(original)
    def outermost(self: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(state, "depth", 0)
        state.depth = depth + 1
        try:
            result = original(self, *args, **kwargs)
        finally:
            state.depth = depth
        if depth == 0:
            guarded(lambda: after(self, args, kwargs, result))
        return result

    outermost._cascade_parsed_args = True  # type: ignore[attr-defined]
    setattr(owner, name, outermost)


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


def hf_argparser_hooks() -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: the dataclasses Hugging Face's HfArgumentParser makes from a dict
    (`parse_json_file`, `parse_yaml_file`: the examples' `run_clm.py args.json`) noted as its parses
    of the command line are, beside them. It never parses a command line then."""

    def made(parser: Any, args: tuple[Any, ...], kwargs: dict[str, Any], outputs: Any) -> None:
        _add_dataclasses(outputs)

    return {"transformers.hf_argparser": lambda module: guarded(
        lambda: _after_outermost(module.HfArgumentParser, "parse_dict", made))}  # fmt: skip


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
    note_kept(made, add)


def click_hooks(note: Note) -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: `note` called with the params a click (or Typer) command parsed
    from the script's own command line, its subcommands' beside its own (a later one's value of a
    name stands), as the command function gets them (StyleGAN's and EDM's `train.py`). Typer's own
    copy of click (`typer._click`, from Typer 0.22 on) is watched the same way."""
    return {name: lambda module: guarded(lambda: _watch_click(module, note)) for name in CLICK_CORES}


CLICK_CORES = ("click.core", "typer._click.core")


def _watch_click(module: Any, note: Note) -> None:
    command_class = module.Command
    original = command_class.make_context
    if getattr(original, "_cascade_parsed_args", False):
        return
    noted: dict[str, Any] = {}
    roots: list[Any] = []  # the top-level contexts made of the script's own command line

    @functools.wraps(original)
    def make_context(self: Any, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
        own = parent is None and own_command_line(args, [])  # (before the parse takes from the list)
        context = original(self, info_name, args, parent=parent, **extra)
        if own or (parent is not None and any(context.find_root() is root for root in roots)):
            if own and len(roots) < MAX_LINES:
                roots.append(context)
            guarded(lambda: note_kept(dict(context.params), lambda made: merge(noted, made, note)))
        return context

    make_context._cascade_parsed_args = True  # type: ignore[attr-defined]
    command_class.make_context = make_context


def fire_hooks(note: Note) -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: `note` called with the arguments Python Fire calls the script's
    function (or class, then method) with, parsed from the script's own command line, defaults
    included and a `**kwargs` parameter's items by their names (`fire.Fire(train)`: alpaca-lora's,
    llama-recipes' fine-tuning)."""
    return {"fire.core": lambda module: guarded(lambda: _watch_fire(module, note))}


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
            guarded(lambda: _note_call(fn, parsed[0], noted, note))
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
    note_kept(made, lambda kept: merge(noted, kept, note))


def hydra_hooks(note: Note) -> dict[str, Callable[[ModuleType], None]]:
    """For the child's ImportHooks: Hydra's own parser marked as not the script's, and `note` called
    with the config of the first job Hydra runs, as its task function gets it."""
    return {
        "hydra._internal.utils": lambda module: guarded(lambda: _mark_hydra_parser(module)),
        "hydra.core.utils": lambda module: guarded(lambda: _watch_hydra_jobs(module, note)),
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
                guarded(lambda: note(composed(cfg)))
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
    """A nested config's leaves into `flat` under dotted keys, as JSON-safe values (`leaf` first)."""
    for key, value in node.items():
        if len(flat) >= MAX_VALUES:
            return
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            _flatten(value, f"{name}.", flat, leaf)
        else:
            flat[name] = {} if isinstance(value, dict) else safe_value(leaf(value))
