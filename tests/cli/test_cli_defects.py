"""The CLI's rough edges a tester found: narrow `ls`, refs, options, ranges, params types, what
`show`/`run --tag`/`push`/`init` say, NO_COLOR (each refused or said as the fix names)."""

from __future__ import annotations

import io
import json
import re
import sys
from types import SimpleNamespace

import pytest

from tests.plugin import Project


def test_an_unknown_option_before_the_script_is_named_as_an_option(project: Project) -> None:
    result = project.invoke("run", "--bogus", "train.py")
    assert result.returncode == 2
    assert "no such option: --bogus" in result.stderr and "cascade run --help" in result.stderr
    assert "script not found" not in result.stderr
    close = project.invoke("run", "--sed", "3", "train.py")
    assert close.returncode == 2 and "did you mean --seed?" in close.stderr
    assert project.runs() == []


def test_a_directory_given_as_the_script_is_said_to_be_one(project: Project) -> None:
    project.write("dir.py/train.py", "print('hi')\n")
    result = project.invoke("run", "dir.py")
    assert result.returncode == 2
    assert "dir.py is a directory, not a script" in result.stderr and "dir.py/train.py" in result.stderr


@pytest.mark.parametrize("args", [("ui", "--port", "99999"), ("ui", "--port", "-1"), ("ls", "--limit", "0"),
                                  ("ls", "--limit", "-1")])  # fmt: skip
def test_out_of_range_numbers_are_usage_errors(project: Project, args: tuple[str, ...]) -> None:
    result = project.invoke(*args)
    assert result.returncode == 2, result.stderr
    assert "Invalid value for" in result.stderr and "OverflowError" not in result.stderr


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("optimizer.lr=abc", "--set optimizer.lr: optimizer.lr is a float in hyperparameters.yaml (0.1), "
                             "and 'abc' is a string"),
        ("optimizer=3", "--set optimizer: optimizer is a mapping in hyperparameters.yaml"),
        ("optimizer.lr=[1,", "--set optimizer.lr: '[1,' is not valid YAML"),
        ("steps=2.5", "--set steps: steps is an integer in hyperparameters.yaml (20), and '2.5' is a float"),
    ],
)  # fmt: skip
def test_a_set_that_changes_a_params_kind_is_refused(project: Project, option: str, said: str) -> None:
    result = project.invoke("run", "--set", option, "train.py")
    assert result.returncode == 2, result.stderr
    assert said in result.stderr
    assert project.runs() == []


def test_add_of_an_existing_key_is_refused(project: Project) -> None:
    result = project.invoke("run", "--add", "steps=3", "train.py")
    assert result.returncode == 2
    assert "--add steps: steps is already in hyperparameters.yaml (20)" in result.stderr
    assert "--set steps=" in result.stderr
    assert project.runs() == []


def test_a_second_init_with_everything_committed_does_not_ask_for_a_commit(project: Project) -> None:
    first = project.invoke("init", check=True)
    assert "next: commit these files" in first.stdout and "cascade.yaml" in first.stdout
    again = project.invoke("init", check=True)
    assert "next: commit these files" in again.stdout  # still not committed
    project.commit("cascade init")
    committed = project.invoke("init", check=True)
    assert "commit these files" not in committed.stdout and "next: `cascade run" in committed.stdout


@pytest.mark.slow
def test_refs_show_tag_diff_and_push_say_what_they_mean(project: Project) -> None:
    first = project.record("--name", "dup", "train.py")
    tagged = project.cascade("run", "--name", "dup", "--tag", "ck1", "train.py", check=True)
    assert "tagged run " in tagged.stderr and " as ck1" in tagged.stderr
    second = next(r.info.run_id for r in project.runs() if r.info.run_id != first)

    short = project.invoke("show", first[:3])
    assert short.returncode == 1
    assert f"run id prefix '{first[:3]}' is too short" in short.stderr and "at least 4" in short.stderr
    assert "no run" not in short.stderr
    both = project.invoke("show", "dup")
    assert both.returncode == 1
    assert "2 runs are named 'dup'" in both.stderr
    assert first[:12] in both.stderr and second[:12] in both.stderr
    assert "use one of their run ids" in both.stderr and "more of the run id" not in both.stderr
    close = project.invoke("show", "dupe")
    assert "did you mean dup?" not in close.stderr and "use one of their ids" in close.stderr

    human = project.invoke("show", "ck1", check=True).stdout
    assert "version ck1" in human and "name dup" in human
    data = json.loads(project.invoke("show", "ck1", "--json", check=True).stdout)["data"]
    assert (data["run_id"], data["name"], data["version"]) == (second, "dup", "ck1")

    listed = project.invoke("ls", check=True).stdout
    assert first in listed and second in listed  # the whole id where there is room

    diffed = project.invoke("diff", first, second, "--only", "params,seed")
    assert diffed.returncode == 0, diffed.stderr
    assert "params" in diffed.stdout and "packages" not in diffed.stdout

    pushed = project.invoke("push", first, "--json")
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["data"]["pushed"] == 0
    said = project.invoke("push", first)
    assert said.returncode == 0 and "nothing to push" in said.stderr


# -- render, without a run ------------------------------------------------------------------------


def _cells(**columns: list[str]) -> dict[str, list[str]]:
    return columns


def test_ls_keeps_the_run_id_and_gives_way_elsewhere() -> None:
    from cascade_repro.render.runs import fit_columns

    run_id = "fa14ab5c9d3e4f6a8b7c6d5e4f3a2b1c"
    cells = _cells(run=[run_id] * 3, name=["respected-kit-289"] * 3, version=["", "", ""],
                   status=["FINISHED"] * 3, user=["someone"] * 3, start=["2026-12-05 20:47"] * 3,
                   duration=["5.1s"] * 3, commit=["11ab5284d3+dirty"] * 3,
                   metrics=["loss=2.065  lr=0.1  acc=0.9312  val_loss=2.1"] * 3)  # fmt: skip
    wide = fit_columns(cells, 220)
    assert wide.widths["run"] == 32 and "version" not in wide.widths  # an empty column is left out
    for width in (60, 80, 100, 120):
        layout = fit_columns(cells, width)
        assert layout.widths["run"] >= 8 and "start" in layout.widths and "name" in layout.widths
        used = sum(layout.widths.values()) + 2 * (len(layout.widths) - 1)
        assert used <= width, (width, layout)
    at_80 = fit_columns(cells, 80)
    assert at_80.widths["run"] >= 12 and at_80.widths["start"] == 16  # the time never wraps here
    assert "metrics" in at_80.dropped
    assert fit_columns(cells, 100).widths["run"] >= 12


def test_checkout_says_the_step_once(capsys: pytest.CaptureFixture[str]) -> None:
    from cascade_repro.render.restoring import checkout_result

    entry = SimpleNamespace(path="checkpoints/step3.pt", step=3)
    chosen = SimpleNamespace(entry=entry, why="step 3")
    checkout_result(SimpleNamespace(chosen=chosen, items=[], not_kept=[]))  # type: ignore[arg-type]
    assert "took checkpoints/step3.pt (step 3)" in capsys.readouterr().err
    best = SimpleNamespace(entry=entry, why="best by val_loss")
    checkout_result(SimpleNamespace(chosen=best, items=[], not_kept=[]))  # type: ignore[arg-type]
    assert "(step 3; best by val_loss)" in capsys.readouterr().err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_color_leaves_out_every_escape_code(monkeypatch: pytest.MonkeyPatch) -> None:
    from cascade_repro.render.runs import tag_result

    result = SimpleNamespace(version="v1", run_id="a" * 32, commit="b" * 40, git_tag=True, moved_from=None)
    for no_color, escaped in (("", True), ("1", False)):
        terminal = _Terminal()
        monkeypatch.setattr(sys, "stdout", terminal)
        monkeypatch.setenv("NO_COLOR", no_color)
        monkeypatch.setenv("TERM", "xterm-256color")
        tag_result(result)  # type: ignore[arg-type]
        assert ("\x1b[" in terminal.getvalue()) is escaped, terminal.getvalue()
        assert "tagged run aaaaaaaaaaaa as v1" in re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())


def test_unresolved_refs_name_the_fix() -> None:
    from cascade_repro.store.run_store import unresolved

    runs = [("5c5f0a1b" + "0" * 24, "dup", None), ("7e21aa00" + "0" * 24, "dup", "v1"),
            ("9abc0000" + "0" * 24, "solo", None)]  # fmt: skip
    short = unresolved("5c5", runs)
    assert short is not None and "too short" in short.message and "at least 4" in short.message
    assert short.hint is not None and "5c5f0a1b" in short.hint
    named = unresolved("dup", runs)
    assert named is not None and "2 runs are named 'dup'" in named.message
    assert named.hint is not None and "use one of their run ids" in named.hint
    close = unresolved("d", runs)
    assert close is not None and close.hint is not None and "did you mean dup" not in close.hint
    assert "5c5f0a1b0000" in close.hint
    assert unresolved("5c5f", runs) is None  # a unique prefix: found before it gets here


def test_show_says_why_a_finished_run_has_no_traced_step(project: Project) -> None:
    """Training in processes the script started (torch.multiprocessing, pytorch/examples' mnist_hogwild):
    `show` said "trace: 0 steps (cascade show --trace for the loss curve)"; only `verify` said why."""
    project.write("spawner.py", """import torch.multiprocessing as mp
import torch


def train(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    model = torch.nn.Linear(4, 1)
    model.share_memory()
    worker = mp.get_context("spawn").Process(target=train, args=(model,))
    worker.start()
    worker.join()
""")
    project.commit("spawner")
    run_id = project.record("spawner.py")
    assert project.manifest(run_id)["trace"]["steps"] == 0
    shown = project.invoke("show", run_id[:8], check=True).stdout
    assert "trace: 0 steps (the script's own process never called backward() or an optimizer's step" in shown
    assert "cascade run --nproc-per-node N" in shown
