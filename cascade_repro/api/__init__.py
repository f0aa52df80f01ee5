"""One function per use case; the CLI renders what these return. The only orchestrator.

    runs.py       init, run (with --tag; nodes.py: this machine's part of a job over several)
    browsing.py   list_runs, tag, ui
    records.py    show_run, verify
    restoring.py  restore
    data.py       checkout, checkpoint_path (load_checkpoint), push
    compare.py    diff, check
    images.py     build_image (`cascade image build`)
    spooled.py    sync (`cascade sync`, `cascade recover`), and recovering dead runs before a command
    loading.py    what every use case starts from: load_project, record_of, dvc_cache
    judging.py    the verdict on two recorded runs from the store (judge_runs, record_verdict)
    replay.py     re-running both runs up to a divergence (`verify --replay`)

Imports inside api/ go one way, with no cycle (tests/unit/test_layers.py reads them): records →
replay → restoring → (runs, compare) → (judging, loading) → spooled.

Each use case loads on first use: a read command (`ls`, `show`) does not load what a run needs, nor
a run what verify needs (their start is a measured target).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as the type checker sees them; at run time `__getattr__` loads them
    from cascade_repro.api.browsing import RunSummary, list_runs, tag, ui
    from cascade_repro.api.compare import check, diff
    from cascade_repro.api.data import CheckoutResult, PushSummary, checkout, checkpoint_path, push
    from cascade_repro.api.images import build_image
    from cascade_repro.api.records import RunRecord, TraceSummary, show_run, verify
    from cascade_repro.api.restoring import RestoreResult, restore
    from cascade_repro.api.runs import RunRequest, init, run
    from cascade_repro.api.spooled import SyncResult, sync

_LAZY = {
    "RunRecord": "records", "TraceSummary": "records", "show_run": "records", "verify": "records",
    "RunRequest": "runs", "init": "runs", "run": "runs",
    "check": "compare", "diff": "compare",
    "CheckoutResult": "data", "PushSummary": "data", "checkout": "data", "checkpoint_path": "data",
    "push": "data",
    "RestoreResult": "restoring", "restore": "restoring",
    "build_image": "images",
    "SyncResult": "spooled", "sync": "spooled",
    "RunSummary": "browsing", "list_runs": "browsing", "tag": "browsing", "ui": "browsing",
}  # fmt: skip

__all__ = [
    "CheckoutResult", "PushSummary", "RestoreResult", "RunRecord", "RunRequest", "RunSummary",
    "SyncResult", "TraceSummary", "build_image", "check", "checkout", "checkpoint_path", "diff", "init",
    "list_runs", "push", "restore", "run", "show_run", "sync", "tag", "ui", "verify",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"cascade_repro.api.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'cascade_repro.api' has no attribute {name!r}")
