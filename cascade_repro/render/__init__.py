"""Everything cascade prints: rich tables for people, a versioned JSON envelope for machines.

    console.py    notices, errors, the JSON envelope, consoles safe for untrusted text, progress
    runs.py       run, init, ls, show, tag, sync, image build, ui
    verdicts.py   verify, diff, check
    restoring.py  restore, checkout, push

The only modules that print (besides the script's own output, which `cascade run` passes through).
"""

from typing import TYPE_CHECKING, Any

from cascade_repro.render.console import (
    JSON_SCHEMA,
    byte_progress,
    emit_json,
    error,
    interrupted,
    notice,
    printable,
)

if TYPE_CHECKING:
    from cascade_repro.render.restoring import (
        checkout_result,
        push_result,
        restore_dict,
        restore_plan,
        restore_result,
    )
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

# Each command's module is imported when first used: `cascade run` prints notices for seconds before
# its result, and its script starts sooner for what it does not import first.
_MODULES = {
    "checkout_result": "restoring", "restore_dict": "restoring", "restore_plan": "restoring",
    "restore_result": "restoring", "push_result": "restoring", "check_report": "verdicts", "diff": "verdicts",
    "verdict": "verdicts",
    "checkpoints": "runs", "image_result": "runs", "init_result": "runs", "misplaced_options": "runs",
    "run_list": "runs", "run_record": "runs", "run_result": "runs", "sync_result": "runs",
    "tag_result": "runs", "ui_started": "runs", "ui_stopped": "runs",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


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
    "push_result",
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
