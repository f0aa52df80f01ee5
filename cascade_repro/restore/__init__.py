"""Restore a recorded run: record → plan → isolated git worktree with the exact dirty state.

The record may come from a shared server and is not trusted: every path it names is checked before
anything is written (`safety`), every file it carries is checked against its sha256, and the
worktree is never the user's checkout (`worktree`, reused only unchanged: `reuse`). Inputs that
neither git nor DVC tracked come from the checkout when they still match (`inputs`); committed links
out of the repository reach from the worktree what they reach from the checkout (`outside_links`).
Re-execution,
data, image and verification are composed by `api.restoring`.
"""

from cascade_repro.restore.inputs import RESTORED, deliver_inputs, locate_inputs, missing_inputs_said
from cascade_repro.restore.outside_links import reach_outside
from cascade_repro.restore.plan import (
    NOT_RESTORED_PREFIXES,
    RestorePlan,
    Worktree,
    machine_differences,
    plan_restore,
    recorded_environment,
)
from cascade_repro.restore.reuse import MARKER, write_marker
from cascade_repro.restore.worktree import discard, materialize

__all__ = [
    "MARKER", "NOT_RESTORED_PREFIXES", "RESTORED", "RestorePlan", "Worktree", "deliver_inputs", "discard",
    "locate_inputs", "missing_inputs_said", "machine_differences", "materialize",
    "plan_restore", "reach_outside",
    "recorded_environment", "write_marker",
]  # fmt: skip
