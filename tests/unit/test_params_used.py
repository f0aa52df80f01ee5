"""The params a script used (issue 14.2): the argparse hook's choice of parse, and the record's section."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from cascade_repro.child import parsed_args
from cascade_repro.params import mlflow_params, unused_overrides, used_params

Watched = tuple[type[argparse.ArgumentParser], list[dict[str, Any]]]


def _watch(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Watched:
    """A parser class of its own (argparse itself stays untouched), watched as the child watches."""

    class Parser(argparse.ArgumentParser):
        pass

    notes: list[dict[str, Any]] = []
    parsed_args.watch(types.SimpleNamespace(ArgumentParser=Parser), notes.append)  # type: ignore[arg-type]
    monkeypatch.setattr(sys, "argv", argv)
    return Parser, notes


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> Watched:
    return _watch(monkeypatch, ["train.py", "--lr", "0.5", "fit", "--depth", "3"])


@pytest.fixture
def two_stage(monkeypatch: pytest.MonkeyPatch) -> Watched:
    """timm's command line: a config parser's parse_known_args, then the main parser's parse_args."""
    return _watch(monkeypatch, ["train.py", "-c", "cfg.yaml"])


def test_the_first_top_level_parse_of_the_command_line_is_noted_with_its_subcommand(
    watched: tuple[type[argparse.ArgumentParser], list[dict[str, Any]]],
) -> None:
    parser_class, notes = watched
    other = parser_class()
    other.add_argument("--inner")
    other.parse_args(["--inner", "x"])  # another list: not the script's configuration
    assert notes == []

    cli = parser_class()
    cli.add_argument("--lr", type=float, default=0.1)
    cli.add_argument("--out", type=Path, default=Path("out"))
    cli.add_argument("--sizes", type=int, nargs="*", default=[1, 2])
    cli.add_argument("--ratio", type=float, default=float("inf"))
    sub = cli.add_subparsers(dest="command")
    fit = sub.add_parser("fit")
    fit.add_argument("--depth", type=int)
    args = cli.parse_args()
    assert args.depth == 3
    # One note: the sub-parser's parse runs inside the top-level one and fills the same namespace.
    assert notes == [{"lr": 0.5, "out": "PosixPath('out')", "sizes": [1, 2], "ratio": "inf",
                      "command": "fit", "depth": 3}]  # fmt: skip
    cli.parse_args(sys.argv[1:])  # a second parse of the same line: the first one stands
    assert len(notes) == 1


def test_a_default_made_from_the_clock_is_left_out_and_the_same_value_typed_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Left from the last stop: `default=time.strftime(...)` (a run directory named by the time) made
    two runs of the same command differ in params, which `verify` then names as a likely cause. A
    parser's own default made for this run is left out, as such globals are; what the user typed is
    kept, even a date."""
    import os
    import time

    import cascade_repro.child.script_globals  # noqa: F401 (as the child's bootstrap: its clocks began first)

    stamp = time.strftime("runs/%Y%m%d-%H%M%S")
    parser_class, notes = _watch(monkeypatch, ["train.py", "--lr", "0.5", "--tag", time.strftime("%Y-%m-%d")])
    cli = parser_class()
    cli.add_argument("--lr", type=float, default=0.1)
    cli.add_argument("--out_dir", default=stamp)
    cli.add_argument("--seed", type=int, default=time.time_ns())
    log = f"train-{os.getpid()}.log"  # (a pid of 4 digits or more: a token of its own)
    cli.add_argument("--log", default=log)
    cli.add_argument("--tag", default="none")
    cli.add_argument("--name", default="baseline")
    prompt = "a long prompt of many lines\n" * 20  # (kept: only what a value holds counts)
    cli.add_argument("--prompt", default=prompt)
    cli.parse_args()
    (noted,) = notes
    pid_kept = {} if os.getpid() >= 1000 else {"log": log}
    typed_date = time.strftime("%Y-%m-%d")
    assert noted == {"lr": 0.5, "tag": typed_date, "name": "baseline", "prompt": prompt} | pid_kept
    # (from a review) through the option's type, in a sub-command, by set_defaults, in an intermixed parse
    path_class, path_notes = _watch(monkeypatch, ["train.py", "fit", "--lr", "0.5"])
    cli = path_class()
    cli.add_argument("--out", type=Path, default=stamp)
    cli.add_argument("--stamp", type=int, default=str(time.time_ns()))
    cli.set_defaults(started=stamp)
    fit = cli.add_subparsers(dest="command").add_parser("fit")
    fit.add_argument("--lr", type=float, default=0.1)
    fit.add_argument("--log_dir", default=stamp)
    cli.parse_args()
    assert path_notes == [{"command": "fit", "lr": 0.5}]
    mixed_class, mixed_notes = _watch(monkeypatch, ["train.py", "a.txt", "--lr", "0.5"])
    mixed = mixed_class()
    mixed.add_argument("files", nargs="*")
    mixed.add_argument("--lr", type=float, default=0.1)
    mixed.add_argument("--out_dir", default=stamp)
    mixed.parse_intermixed_args()
    assert mixed_notes and mixed_notes[-1] == {"files": ["a.txt"], "lr": 0.5}
    typed_class, typed_notes = _watch(monkeypatch, ["train.py", "--out_dir", stamp])
    typed = typed_class()
    typed.add_argument("--out_dir", default="runs/x")
    typed.parse_args()
    assert typed_notes == [{"out_dir": stamp}]


def test_a_refused_parse_notes_nothing_and_an_explicit_argv_counts(
    watched: tuple[type[argparse.ArgumentParser], list[dict[str, Any]]],
) -> None:
    parser_class, notes = watched
    strict = parser_class(exit_on_error=False)
    strict.add_argument("--lr", type=int)  # "0.5" is refused
    with pytest.raises(argparse.ArgumentError):
        strict.parse_known_args()
    assert notes == []
    loose = parser_class()
    loose.add_argument("--lr", type=float)
    args, rest = loose.parse_known_args(sys.argv[1:])  # what HfArgumentParser passes
    assert rest == ["fit", "--depth", "3"] and notes == [{"lr": 0.5}]


RESOLVED = {"values": {"seed": 3, "steps": 20, "optimizer": {"lr": 0.1}}, "source": "hyperparameters.yaml",
            "overrides": {"optimizer.lr": 0.1}, "seed": 3, "seed_source": "params"}  # fmt: skip


def test_an_unread_file_is_kept_for_restore_but_is_not_what_the_script_used() -> None:
    section = used_params(RESOLVED, {"argparse": {"lr": 0.01, "api_key": "sk-1", "db": "pg://u:pw@h/x"}})
    assert section["values"] == {"lr": 0.01, "api_key": "<redacted>", "db": "pg://u:<redacted>@h/x"}
    assert section["source"] == "argparse"
    assert section["file"] == {"path": "hyperparameters.yaml", "read": False, "values": RESOLVED["values"]}
    assert mlflow_params(section) == {**section["values"], "seed": 3}
    assert unused_overrides(section, "t.py") == [
        "optimizer.lr (--set or --add) has no effect: t.py never called cascade_repro.params()"
    ]


def test_a_name_in_both_goes_under_args_and_a_different_seed_keeps_cascades_beside_it() -> None:
    section = used_params(RESOLVED, {"params_read": True, "argparse": {"steps": 5, "optimizer": "adam"}})
    assert section["source"] == "hyperparameters.yaml + argparse"
    assert section["values"] == {**RESOLVED["values"], "args.steps": 5, "args.optimizer": "adam"}
    assert unused_overrides(section, "t.py") == []
    no_file = {**RESOLVED, "values": {}, "source": None, "seed": 0}
    section = used_params(no_file, {"argparse": {"seed": 42}})
    assert section["file"] is None
    assert mlflow_params(section) == {"seed": 42, "cascade.seed": 0}
    assert used_params(no_file, {})["values"] == {} and used_params(no_file, {})["source"] is None


# -- beyond the first parse (timm's two stages) and Hydra's composed config ----------------------


def test_the_rest_of_a_partial_parse_is_the_command_line_and_the_namespaces_join(
    two_stage: Watched,
) -> None:
    parser_class, notes = two_stage
    config = parser_class(add_help=False)
    config.add_argument("-c", "--config", default="")
    found, remaining = config.parse_known_args()
    assert remaining == [] and notes == [{"config": "cfg.yaml"}]
    main = parser_class()
    main.add_argument("--lr", type=float, default=0.1)
    main.set_defaults(lr=0.3)  # as from the config file
    main.parse_args([])  # an empty list of its own: another parser's defaults, not the script's line
    assert notes == [{"config": "cfg.yaml"}]
    main.parse_args(remaining)  # the very list the first parse left: the script's second stage
    assert notes[-1] == {"config": "cfg.yaml", "lr": 0.3}
    main.parse_args(list(remaining))  # the same again changes nothing
    assert len(notes) == 2


def test_a_parser_marked_as_not_the_scripts_is_not_noted(
    two_stage: Watched,
) -> None:
    parser_class, notes = two_stage
    hydras = parser_class()
    hydras.add_argument("-c", "--cfg")
    setattr(hydras, parsed_args.NOT_THE_SCRIPTS, True)
    hydras.parse_args()
    assert notes == []


def test_a_hydra_config_is_the_params_under_its_dotted_keys() -> None:
    resolved = {"values": {"seed": 3, "optimizer": {"lr": 0.1}}, "source": "hyperparameters.yaml",
                "overrides": {}, "seed": 3, "seed_source": "params"}  # fmt: skip
    noted = {"optimizer.lr": 0.01, "db.password": "hunter2", "seed": 7}
    section = used_params(resolved, {"hydra": noted})
    redacted = {"optimizer.lr": 0.01, "db.password": "<redacted>", "seed": 7}
    assert section["values"] == section["hydra"] == redacted
    assert section["source"] == "hydra" and "argparse" not in section
    assert mlflow_params(section) == {**section["values"], "cascade.seed": 3}
    both = used_params(resolved, {"hydra": noted, "params_read": True})
    assert both["values"]["hydra.optimizer.lr"] == 0.01 and both["values"]["optimizer"] == {"lr": 0.1}
    assert both["source"] == "hyperparameters.yaml + hydra"
