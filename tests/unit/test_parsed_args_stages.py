"""The argparse hook's choice of parses beyond the first (defect 6): what a parse of the command line
left over is the command line too, an empty list only as that very list; and the params section of
a Hydra app's composed config (defect 7)."""

from __future__ import annotations

import argparse
import sys
import types
from typing import Any

import pytest

from cascade_repro.child import parsed_args
from cascade_repro.params import mlflow_params, used_params


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> tuple[type[argparse.ArgumentParser], list[dict[str, Any]]]:
    class Parser(argparse.ArgumentParser):
        pass

    notes: list[dict[str, Any]] = []
    parsed_args.watch(types.SimpleNamespace(ArgumentParser=Parser), notes.append)  # type: ignore[arg-type]
    monkeypatch.setattr(sys, "argv", ["train.py", "-c", "cfg.yaml"])
    return Parser, notes


def test_the_rest_of_a_partial_parse_is_the_command_line_and_the_namespaces_join(
    watched: tuple[type[argparse.ArgumentParser], list[dict[str, Any]]],
) -> None:
    parser_class, notes = watched
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
    watched: tuple[type[argparse.ArgumentParser], list[dict[str, Any]]],
) -> None:
    parser_class, notes = watched
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
