"""Follow a JSON-lines file the child appends to: the complete lines since the last read."""

from __future__ import annotations

from pathlib import Path


def read_new_lines(path: Path, offset: int) -> tuple[list[bytes], int]:
    """Lines completed since `offset`, and the offset to read from next time (a line still being
    written is left for the next read). A file not there yet has no lines."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return [line for line in data[:end].split(b"\n") if line.strip()], offset + end
