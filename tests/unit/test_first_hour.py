"""Pure pieces behind the first-hour fixes (issue 19): own paths, argparse notes, option order."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

import pytest

from cascade_repro.child import usage_errors
from cascade_repro.cli.run import _misplaced_options
from cascade_repro.project import preview_init
from cascade_repro.run_engine import own_paths
from cascade_repro.settings import Settings


def _settings(root: Path, uri: str, checkpoints_dir: str = "checkpoints") -> Settings:
    return Settings(root=root, experiment="x", tracking_uri=uri, checkpoints_dir=checkpoints_dir)


def test_own_paths_hold_the_store_the_checkpoints_and_dvc_never_the_tree_or_outside(tmp_path: Path) -> None:
    paths = own_paths(_settings(tmp_path, f"sqlite:///{tmp_path}/mlflow.db"))
    for path in (".cascade", "mlruns", "mlflow.db", "checkpoints", ".dvc/cache"):
        assert path in paths
    assert "store" in own_paths(_settings(tmp_path, (tmp_path / "store").as_uri(), "../elsewhere"))
    for checkpoints_dir in (".", "", "../elsewhere", "/somewhere/else"):
        odd = own_paths(_settings(tmp_path, "databricks", checkpoints_dir))
        assert not {".", "", "databricks"} & set(odd) and not [p for p in odd if p.startswith(("..", "/"))]
    assert "runs/ckpt" in own_paths(_settings(tmp_path, "http://server:5000", str(tmp_path / "runs/ckpt/")))


def test_preview_init_lists_only_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("mlflow.db\n.cascade\n")
    (tmp_path / "cascade.yaml").write_text("experiment: x\n")
    preview = preview_init(tmp_path, "ckpts")
    assert preview.ignore_entries == ("mlruns/", "mlartifacts/", "/ckpts/")
    assert "cascade.yaml" not in preview.files and preview.dvc_init and not preview.is_empty


@pytest.fixture
def fresh_argparse() -> Any:
    """argparse with its original ArgumentParser.error, restored after the test."""
    original = argparse.ArgumentParser.error
    yield importlib.import_module("argparse")
    argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def test_watch_notes_argparse_usage_errors_and_changes_nothing_else(fresh_argparse: Any) -> None:
    noted: list[dict[str, Any]] = []
    usage_errors.watch(fresh_argparse, noted.append)
    usage_errors.watch(fresh_argparse, noted.append)  # twice: still one note per error
    parser = fresh_argparse.ArgumentParser(prog="train.py")
    parser.add_argument("--epochs", type=int)
    assert parser.parse_args(["--epochs", "3"]).epochs == 3 and noted == []
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--seed", "7"])
    assert exited.value.code == 2
    line = "train.py: error: unrecognized arguments: --seed 7"
    assert noted == [{"type": "SystemExit", "message": f"2 (argparse: {line})", "usage_error": line}]


def test_watch_survives_a_failing_note(fresh_argparse: Any) -> None:
    def broken(error: dict[str, Any]) -> None:
        raise OSError("run directory gone")

    usage_errors.watch(fresh_argparse, broken)
    with pytest.raises(SystemExit):
        fresh_argparse.ArgumentParser(prog="t").parse_args(["--x"])


@pytest.mark.parametrize(
    ("args", "message", "options", "command"),
    [
        (("--seed", "7"), "unrecognized arguments: --seed 7", ["--seed"], "cascade run --seed 7 t.py"),
        (("--lr", "1", "--seed=7", "--docker"), "unrecognized arguments: --seed=7 --docker",
         ["--seed", "--docker"], "cascade run --seed=7 --docker t.py --lr 1"),
        (("--set", "a.b=1", "--epochs", "2"), "argument --set: expected one argument", ["--set"],
         "cascade run --set a.b=1 t.py --epochs 2"),
    ],
)  # fmt: skip
def test_misplaced_options_move_before_the_script(args: tuple[str, ...], message: str, options: list[str],
                                                  command: str) -> None:  # fmt: skip
    found = _misplaced_options(["t.py"], args, f"t.py: error: {message}")
    assert found is not None and found.options == options and found.command == command


def test_options_the_script_did_not_refuse_stay_with_it() -> None:
    assert (
        _misplaced_options(["t.py"], ("--name", "x", "--bad"), "t.py: error: unrecognized arguments: --bad")
        is None
    )
