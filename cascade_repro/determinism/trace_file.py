"""A step trace as read from its artifact: its JSON lines, each parsed when first read.

The child writes each step's record as one line, with its keys always in the same order and its
numbers in the same notation, so two steps whose lines are equal text are equal records. Comparing
two traces (`compare.compare_traces`) therefore skips the lines the two share as text and parses only
from the first line that differs: a reproduced run of 100k steps is judged without parsing a record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, overload

from cascade_repro.errors import CascadeError


class TraceRecords(Sequence[dict[str, Any]]):
    """The records of one step trace, parsed on first access (`lines` holds their text)."""

    def __init__(self, lines: list[str], where: str = "the trace") -> None:
        self.lines = lines
        self._where = where
        self._parsed: dict[int, dict[str, Any]] = {}

    @classmethod
    def from_text(cls, text: str, where: str = "the trace") -> TraceRecords:
        """The whole records of a trace file; a last line cut short (a run killed mid-write) is dropped."""
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            try:
                json.loads(lines[-1])
            except ValueError:
                lines.pop()
        return cls(lines, where)

    def __len__(self) -> int:
        return len(self.lines)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> TraceRecords: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | TraceRecords:
        if isinstance(index, slice):
            return TraceRecords(self.lines[index], self._where)
        position = range(len(self.lines))[index]  # IndexError as a list gives it
        record = self._parsed.get(position)
        if record is None:
            record = self._parse(position)
            self._parsed[position] = record
        return record

    def _parse(self, position: int) -> dict[str, Any]:
        try:
            record = json.loads(self.lines[position])
        except ValueError:
            record = None
        if not isinstance(record, dict):
            raise CascadeError(
                f"{self._where} is damaged at record {position + 1}: not a JSON object",
                hint="the trace artifact was altered or cut; nothing can be compared past that step",
            )
        return record


def equal_prefix(a: Sequence[Any], b: Sequence[Any], overlap: int) -> int:
    """How many leading steps two traces share as text (0 unless both were read as `TraceRecords`)."""
    if not isinstance(a, TraceRecords) or not isinstance(b, TraceRecords):
        return 0
    lines_a, lines_b = a.lines, b.lines
    index = 0
    while index < overlap and lines_a[index] == lines_b[index]:
        index += 1
    return index
