"""`cascade verify --replay`: the tensors of the steps a replay asks for, saved where it reads them.

A replay re-runs a recorded run with `CASCADE_TRACE_DUMP` = "FIRST:LAST:DIR": each step from FIRST
to LAST gets its parameters before and after it and its gradients saved to
DIR/step{N}/tensors.pt. Step LAST always; the steps before it while their files stay under
`max_bytes` in all (a bracket of hundreds of steps of a large model would fill the disk; the replay
then re-runs for the one step it needs). One replay over a bracket so saves every step the traces
may pin the divergence at.

A step that cannot be saved (the disk is full) leaves no partial file: the saving stops, the
reason goes to DIR/NOT_SAVED (where there is room for it) and to stderr, and the trace goes on, so
the replay still says whether it reproduced its run; `cascade verify --replay` reports the reason.

Standard library only (this runs inside the training process); torch is handed in.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from cascade_repro.child.protocol import DUMP_FILE

MAX_BYTES = 1 << 30  # the steps before LAST, in all
NOT_SAVED = "not_saved.txt"  # DIR/: why a step's tensors are not there


def step_file(directory: Path, step: int) -> Path:
    """Where the tensors of `step` are saved under a replay's `directory`."""
    return directory / f"step{step}" / DUMP_FILE


def not_saved(directory: Path) -> str | None:
    """Why the replay saving into `directory` stopped, if it said so."""
    try:
        return (directory / NOT_SAVED).read_text(errors="replace")[:500] or None
    except OSError:
        return None


def free_space(path: Path) -> str:
    """What is free on the disk that holds `path` (its nearest existing folder), in words."""
    for folder in (path, *path.parents):
        try:
            return f"{shutil.disk_usage(folder).free:,} bytes free on its disk"
        except OSError:
            continue
    return "free space unknown"


class TensorDump:
    """The steps whose tensors a replay saves, and the saving."""

    def __init__(self, torch: ModuleType, first: int, last: int, directory: Path,
                 max_bytes: int = MAX_BYTES) -> None:  # fmt: skip
        self.torch = torch
        self.first, self.last = min(first, last), last
        self.directory = directory
        self.max_bytes = max_bytes
        self._written = 0
        self._facets: dict[str, dict[str, Any]] = {}
        self.failed: str | None = None  # why saving stopped

    @classmethod
    def parse(cls, torch: ModuleType, value: str) -> TensorDump:
        """From the variable's "FIRST:LAST:DIR" (DIR may hold colons)."""
        first, last, directory = value.split(":", 2)
        return cls(torch, int(first), int(last), Path(directory))

    def wants(self, step: int) -> bool:
        """Whether `step`'s tensors are saved (the same answer all through the step)."""
        if self.failed is not None:
            return False
        return step == self.last or (self.first <= step < self.last and self._written < self.max_bytes)

    def add(self, step: int, facet: str, tensors: dict[str, Any]) -> None:
        """One facet of `step` ({name: CPU copy}); "params_after", the last, writes the step's file."""
        self._facets[facet] = tensors
        if facet == "params_after":
            facets, self._facets = self._facets, {}
            path = step_file(self.directory, step)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.torch.save(facets, path)
                self._written += path.stat().st_size
            except (OSError, RuntimeError) as exc:  # torch's writer says RuntimeError for ENOSPC
                self._stop(step, path, exc)

    def _stop(self, step: int, path: Path, exc: BaseException) -> None:
        try:
            path.unlink(missing_ok=True)  # never a partial file read as the step's tensors
        except OSError:
            pass
        lines = str(exc).strip().splitlines() or [repr(exc)]
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else lines[-1]
        self.failed = f"the tensors of step {step} could not be saved to {path}: {cause} ({free_space(path)})"
        sys.stderr.write(f"cascade: {self.failed}; the replay goes on without saving\n")
        try:
            (self.directory / NOT_SAVED).write_text(self.failed)
        except OSError:
            pass  # a full disk: `cascade verify --replay` finds no file and says what is free there
