"""The public Python API, pinned (issue 16): what a training script imports from `cascade_repro`, and
the use cases `cascade_repro.api` offers; each with a docstring of its own."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

import cascade_repro
import cascade_repro.api as api

PINNED = {
    cascade_repro: ["__version__", "checkpoint", "flush", "load_checkpoint", "log_metric", "log_metrics",
                    "params"],
    api: ["CheckoutResult", "PushSummary", "RestoreResult", "RunRecord", "RunRequest", "RunSummary",
          "SyncResult", "TraceSummary", "build_image", "check", "checkout", "checkpoint_path", "diff",
          "init", "list_runs", "push", "restore", "run", "show_run", "sync", "tag", "ui", "verify"],
}  # fmt: skip


@pytest.mark.parametrize("module", list(PINNED), ids=lambda m: m.__name__)
def test_the_public_api_is_what_is_pinned(module: ModuleType) -> None:
    assert sorted(module.__all__) == sorted(PINNED[module])
    for name in module.__all__:
        getattr(module, name)  # every name resolves (the api's lazy ones included)


@pytest.mark.parametrize("module", list(PINNED), ids=lambda m: m.__name__)
def test_each_public_name_has_a_docstring_of_its_own(module: ModuleType) -> None:
    objects = {name: getattr(module, name) for name in module.__all__}
    assert [name for name, obj in objects.items() if callable(obj) and not _documented(obj)] == []


def test_what_the_use_cases_return_and_render_shows_is_documented() -> None:
    """The views (render's __all__) and the results the api hands to them say what they are."""
    from cascade_repro import render
    from cascade_repro.check import CheckReport
    from cascade_repro.determinism.verdict import RankVerdict, Verdict
    from cascade_repro.diff import Diff
    from cascade_repro.project import InitResult
    from cascade_repro.run_plan import RunResult
    from cascade_repro.store.ui_server import UiOutcome
    from cascade_repro.versions import TagResult

    results = [CheckReport, Diff, InitResult, RankVerdict, RunResult, TagResult, UiOutcome, Verdict]
    views = [getattr(render, name) for name in render.__all__ if callable(getattr(render, name))]
    assert [obj.__name__ for obj in [*results, *views] if not _documented(obj)] == []


def _documented(obj: object) -> bool:
    doc = getattr(obj, "__doc__", None) or ""
    generated = inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(")  # a dataclass's own
    return bool(doc.strip()) and not generated
