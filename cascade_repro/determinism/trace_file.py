"""A step trace as read from its artifact: its JSON lines, each parsed when first read.

The child writes each step's record as one line, with its keys always in the same order and its
numbers in the same notation, so two steps whose lines are equal text are equal records. Comparing
two traces (`compare.compare_traces`) therefore skips the lines the two share as text and parses only
from the first line that differs: a reproduced run of 100k steps is judged without parsing a record.
Two runs whose trace budgets sampled other steps (the weights read at step k by one only) write
lines that differ by those facets alone: a line whose text up to its sampled facets equals the
other's, where one of the two has none, is skipped the same way (`next_difference`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import IO, Any, NoReturn, overload

from cascade_repro.errors import CascadeError

LOSS_KEY = ',"loss":'
LOSS_FIELDS = {"bits", "value", "dtype", "parts"}  # parts: a step with several (their bits a list)
# The longest line a trace may hold. A step's record is mostly its per-tensor fingerprints: for each of
# params_before, grads and params_after, `"<name>":"<16 hex>",` per parameter tensor, ~122 bytes with a
# 100-character name. A model of 10,000 parameter tensors (several times a 70B LLM's ~700) writes
# 3 x 10,000 x 122 = 3.7 MB, plus its RNG states and up to 4,096 loss parts (~0.1 MB): 16 MiB is
# four times that, and a line longer was not written by cascade. Reading stops there (a few MB held),
# instead of holding a line of any length twice over.
MAX_LINE_BYTES = 16 << 20


class TraceRecords(Sequence[dict[str, Any]]):
    """The records of one step trace, parsed on first access (`lines` holds their text)."""

    def __init__(self, lines: list[str], where: str = "the trace") -> None:
        self.lines = lines
        self.where = where
        self._parsed: dict[int, dict[str, Any]] = {}

    @classmethod
    def from_stream(cls, stream: IO[bytes], where: str = "the trace") -> TraceRecords:
        """The whole records of a trace file read from `stream` a line at a time, none longer than
        MAX_LINE_BYTES (CascadeError: a damaged trace); a last line cut short is dropped."""
        lines: list[str] = []
        while line := stream.readline(MAX_LINE_BYTES + 1):
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                problem = f"a line over {MAX_LINE_BYTES >> 20} MiB, more than cascade writes for any model"
                raise _damaged(where, len(lines), problem)
            try:
                text = line.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise _damaged(where, len(lines), "not UTF-8 text") from None
            if text.strip():
                lines.append(text)
        return cls.from_lines(lines, where)

    @classmethod
    def from_lines(cls, lines: list[str], where: str = "the trace") -> TraceRecords:
        """Records from their lines (none blank); a last line cut short (a killed run's) is dropped."""
        if lines:
            try:
                json.loads(lines[-1])
            except (ValueError, RecursionError):
                lines.pop()
        return cls(lines, where)

    @classmethod
    def from_text(cls, text: str, where: str = "the trace") -> TraceRecords:
        """The whole records of a trace file; a last line cut short (a run killed mid-write) is dropped."""
        return cls.from_lines([line for line in text.splitlines() if line.strip()], where)

    def __len__(self) -> int:
        return len(self.lines)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> TraceRecords: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | TraceRecords:
        if isinstance(index, slice):
            return TraceRecords(self.lines[index], self.where)
        position = range(len(self.lines))[index]  # IndexError as a list gives it
        record = self._parsed.get(position)
        if record is None:
            record = self._parse(position)
            self._parsed[position] = record
        return record

    def loss_of(self, position: int) -> Any:
        """A record's loss: the flat object after its `"loss":` key, read from the text alone unless the
        record is parsed already (a run diverged from its start has every loss compared, and its
        weights' fingerprints are most of each line); the whole record where the text is unusual."""
        parsed = self._parsed.get(position)
        if parsed is not None:
            return parsed.get("loss")
        line = self.lines[position]
        at = line.find(LOSS_KEY)
        while at >= 0:
            start = at + len(LOSS_KEY)
            if line.startswith("null", start):
                return None
            if line.startswith("{", start):
                try:
                    loss = json.loads(line[start : line.index("}", start) + 1])
                except ValueError:
                    break
                if isinstance(loss, dict) and set(loss) <= LOSS_FIELDS and valid_loss(loss):
                    return loss
                break
            at = line.find(LOSS_KEY, start)  # a batch's own "loss" key: the record's comes after it
        return self[position].get("loss")

    def _parse(self, position: int) -> dict[str, Any]:
        try:
            record = json.loads(self.lines[position])
        except (ValueError, RecursionError):  # (nested past the parser's depth: not written by cascade)
            record = None
        problem = "not a JSON object" if not isinstance(record, dict) else record_problem(record)
        if problem:
            self.damaged(position, problem)
        assert isinstance(record, dict)
        return record

    def damaged(self, position: int, problem: str) -> NoReturn:
        raise _damaged(self.where, position, problem)


def _damaged(where: str, position: int, problem: str) -> CascadeError:
    return CascadeError(
        f"{where} is damaged at record {position + 1}: {problem}",
        hint="the trace artifact was altered or cut; nothing can be compared past that step",
    )


MAX_STEP = 1 << 48  # a step number no training reaches: a larger one was not written by a run
MAX_LOSS_PARTS = 4096  # the losses one step keeps (child/trace_install.py)
FACET_FIELDS = ("rng", "params_before", "grads", "params_after")  # {name: fingerprint} or null


def record_problem(record: dict[str, Any]) -> str | None:
    """What makes a parsed record one cascade did not write (a record may come from a shared server):
    the types every reader relies on, checked once, where the record is parsed."""
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < MAX_STEP:
        return f"its step is {str(step)[:40]!r}, not a whole number from 0"
    if not valid_loss(record.get("loss")):
        return "its loss is not a number with its bits"
    batch = record.get("batch")
    if batch is not None and not isinstance(batch, str):
        return "its batch is not a fingerprint"
    batches = record.get("batches")  # (a step of several: determinism/trace_formats.py)
    if batches is not None and not (_whole(batches) and 1 < batches < MAX_STEP):
        return "its batches is not a count of batches"
    if "skipped" in record and record["skipped"] is not True:  # (a GradScaler skipped the update)
        return "its skipped is not true"
    for facet in FACET_FIELDS:
        if not isinstance(record.get(facet), (dict, type(None))):
            return f"its {facet} is not an object of fingerprints"
    return None


def valid_loss(loss: Any) -> bool:
    """null, or {value: a number, bits: an integer (a list of them: one per loss of the step), dtype}."""
    if loss is None:
        return True
    if not isinstance(loss, dict):
        return False
    value, bits, parts = loss.get("value"), loss.get("bits"), loss.get("parts")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    if isinstance(bits, list):
        if not 0 < len(bits) <= MAX_LOSS_PARTS or not all(b is None or _whole(b) for b in bits):
            return False
        if parts is not None and parts != len(bits):
            return False
    elif not (bits is None or _whole(bits)) or parts is not None:
        return False
    return isinstance(loss.get("dtype"), (str, type(None)))


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


STEP_KEY = '{"step":'  # how every record's line begins


def record_steps(records: Sequence[dict[str, Any]]) -> list[int]:
    """Each record's step, read from the text where the records are still lines (its first key); a
    trace whose steps do not increase record by record is damaged (a run writes them in order)."""
    if not isinstance(records, TraceRecords):
        return [step_of(record, index) for index, record in enumerate(records)]
    steps: list[int] = []
    for index, line in enumerate(records.lines):
        end = line.find(",", len(STEP_KEY)) if line.startswith(STEP_KEY) else -1
        number = line[len(STEP_KEY) : end]
        readable = end > 0 and number.isascii() and number.isdigit() and len(number) < 15
        step = int(number) if readable else step_of(records[index], index)
        if steps and step <= steps[-1]:
            records.damaged(index, f"its step {step} does not follow step {steps[-1]}")
        steps.append(step)
    return steps


def steps_ended(records: Sequence[dict[str, Any]]) -> int:
    """How many steps the traced run ended: its last record's step + 1 (a budget may have thinned the
    records), or that step where the run ended inside it, its optimizer step never returned (the record
    says "unfinished", child/trace.py)."""
    steps = record_steps(records)
    if not steps:
        return 0
    return steps[-1] + (0 if ended_inside(records, len(records) - 1) else 1)


def ended_inside(records: Sequence[dict[str, Any]], index: int) -> bool:
    """Whether the run ended inside record `index`'s step ("unfinished"; read from the text where the
    records are still lines and the word is not there)."""
    if isinstance(records, TraceRecords) and '"unfinished"' not in records.lines[index]:
        return False
    return records[index].get("unfinished") is True


def step_of(record: dict[str, Any], index: int) -> int:
    """A record's step (untrusted: its position where it holds no whole number)."""
    step = record.get("step", index)
    return step if isinstance(step, int) and not isinstance(step, bool) else index


Records = Sequence[dict[str, Any]]


def on_common_steps(a: Records, b: Records) -> tuple[Records, Records, tuple[int, int]]:
    """Two traces cut to the steps both recorded (where their records are at other steps: budgets that
    thinned them on other schedules, or runs of other lengths), and how many steps each ran (its last
    record's step + 1)."""
    steps_a, steps_b = record_steps(a), record_steps(b)
    ran = (max(steps_a, default=-1) + 1, max(steps_b, default=-1) + 1)
    if steps_a == steps_b:
        return a, b, ran
    common = set(steps_a) & set(steps_b)
    return _at(a, steps_a, common), _at(b, steps_b, common), ran


def _at(records: Sequence[dict[str, Any]], steps: list[int], kept: set[int]) -> Sequence[dict[str, Any]]:
    if isinstance(records, TraceRecords):
        return TraceRecords([line for line, step in zip(records.lines, steps, strict=True) if step in kept],
                            records.where)  # fmt: skip
    return [record for record, step in zip(records, steps, strict=True) if step in kept]


SAMPLED_AT = (',"grads":', ',"params_after":')  # where a record's sampled facets begin (written last)


def has_batches(records: Sequence[dict[str, Any]]) -> bool:
    """Whether any step has a batch fingerprint (none: the script read no torch DataLoader); read
    from the text where the records are still lines (a fingerprint is a string, its absence null)."""
    if isinstance(records, TraceRecords):
        return any(BATCH_KEY in line for line in records.lines)
    return any(record.get("batch") for record in records)


BATCH_KEY = '"batch":"'


def next_difference(a: Sequence[Any], b: Sequence[Any], start: int, overlap: int) -> int:
    """The first index from `start` whose records may differ in a facet both recorded (`start` unless
    both were read as `TraceRecords`): equal lines are skipped, and so are lines equal up to their
    sampled facets where one of the two has none."""
    if not isinstance(a, TraceRecords) or not isinstance(b, TraceRecords):
        return start
    lines_a, lines_b = a.lines, b.lines
    index = start
    while index < overlap:
        x, y = lines_a[index], lines_b[index]
        if x != y:
            cut_x, cut_y = _sampled_at(x), _sampled_at(y)
            if (cut_x < len(x) - 1 and cut_y < len(y) - 1) or x[:cut_x] != y[:cut_y]:
                return index
        index += 1
    return index


def _sampled_at(line: str) -> int:
    """Where the line's sampled facets begin; without any, the index of its closing brace."""
    for key in SAMPLED_AT:
        at = line.find(key)
        if at >= 0:
            return at
    return len(line) - 1


def equal_prefix(a: Sequence[Any], b: Sequence[Any], overlap: int) -> int:
    """How many leading steps two traces share as text (0 unless both were read as `TraceRecords`)."""
    if not isinstance(a, TraceRecords) or not isinstance(b, TraceRecords):
        return 0
    lines_a, lines_b = a.lines, b.lines
    index = 0
    while index < overlap and lines_a[index] == lines_b[index]:
        index += 1
    return index
