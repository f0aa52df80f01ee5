"""`cascade verify --replay`: the tensors of the steps a replay asks for, saved where it reads them.

A replay re-runs a recorded run with `CASCADE_TRACE_DUMP` = "FIRST:LAST:DIR": each step from FIRST
to LAST gets its parameters before and after it and its gradients saved to
DIR/step{N}/tensors.pt. Step LAST always; the steps before it while their files stay under
`max_bytes` in all (a bracket of hundreds of steps of a large model would fill the disk; the replay
then re-runs for the one step it needs). One replay over a bracket so saves every step the traces
may pin the divergence at.

Standard library only (this runs inside the training process); torch is handed in.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from cascade_repro.child.protocol import DUMP_FILE

MAX_BYTES = 1 << 30  # the steps before LAST, in all


def step_file(directory: Path, step: int) -> Path:
    """Where the tensors of `step` are saved under a replay's `directory`."""
    return directory / f"step{step}" / DUMP_FILE


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

    @classmethod
    def parse(cls, torch: ModuleType, value: str) -> TensorDump:
        """From the variable's "FIRST:LAST:DIR" (DIR may hold colons)."""
        first, last, directory = value.split(":", 2)
        return cls(torch, int(first), int(last), Path(directory))

    def wants(self, step: int) -> bool:
        """Whether `step`'s tensors are saved (the same answer all through the step)."""
        return step == self.last or (self.first <= step < self.last and self._written < self.max_bytes)

    def add(self, step: int, facet: str, tensors: dict[str, Any]) -> None:
        """One facet of `step` ({name: CPU copy}); "params_after", the last, writes the step's file."""
        self._facets[facet] = tensors
        if facet == "params_after":
            path = step_file(self.directory, step)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.torch.save(self._facets, path)
            self._written += path.stat().st_size
            self._facets = {}
