"""One function per use case; the CLI renders what these return. The only orchestrator.

runs.py       init, run (with --tag), list_runs, tag
records.py    show_run, verify, and what reading use cases share
restoring.py  restore
data.py       checkout, checkpoint_path (load_checkpoint), push
compare.py    diff, check
"""

from cascade_repro.api.compare import check, diff
from cascade_repro.api.data import CheckoutResult, PushSummary, checkout, checkpoint_path, push
from cascade_repro.api.records import RunRecord, TraceSummary, show_run, verify
from cascade_repro.api.restoring import RestoreResult, restore
from cascade_repro.api.runs import RunRequest, RunSummary, init, list_runs, run, tag, ui

__all__ = [
    "CheckoutResult", "PushSummary", "RestoreResult", "RunRecord", "RunRequest", "RunSummary",
    "TraceSummary", "check", "checkout", "checkpoint_path", "diff", "init", "list_runs", "push",
    "restore", "run", "show_run", "tag", "ui", "verify",
]  # fmt: skip
