"""Everything cascade prints: rich tables for people, a versioned JSON envelope for machines.

    console.py    notices, errors, the JSON envelope, consoles safe for untrusted text, progress
    runs.py       run, init, ls, show, tag, sync, image build, ui
    verdicts.py   verify, diff, check
    restoring.py  restore, checkout

The only modules that print (besides the script's own output, which `cascade run` passes through).
"""

from cascade_repro.render.console import (
    JSON_SCHEMA,
    byte_progress,
    emit_json,
    error,
    interrupted,
    notice,
    printable,
)
from cascade_repro.render.restoring import checkout_result, restore_dict, restore_plan, restore_result
from cascade_repro.render.runs import (
    checkpoints,
    image_result,
    init_result,
    misplaced_options,
    run_list,
    run_record,
    run_result,
    sync_result,
    tag_result,
    ui_started,
    ui_stopped,
)
from cascade_repro.render.verdicts import check_report, diff, verdict

__all__ = [
    "JSON_SCHEMA",
    "byte_progress",
    "check_report",
    "checkout_result",
    "checkpoints",
    "diff",
    "emit_json",
    "error",
    "image_result",
    "init_result",
    "interrupted",
    "misplaced_options",
    "notice",
    "printable",
    "restore_dict",
    "restore_plan",
    "restore_result",
    "run_list",
    "run_record",
    "run_result",
    "sync_result",
    "tag_result",
    "ui_started",
    "ui_stopped",
    "verdict",
]
