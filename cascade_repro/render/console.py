"""Where cascade prints and how: stderr notices, the versioned JSON envelope, rich consoles that
drop control characters from untrusted text, progress bars, and the small formats every view uses."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import sys
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator, cast

if TYPE_CHECKING:
    pass


JSON_SCHEMA = "cascade.cli/1"


# Run records may come from a shared server: text from them reaches the terminal without its control
# characters (an escape sequence could retitle the window, write the clipboard or hide a line), and
# rich's markup is off, so brackets in a name or a param are printed, not interpreted.
_CONTROL = re.compile(r"\x1b\[[0-9;]*m|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SGR = re.compile(r"\x1b\[[0-9;]*m")
_PADDED_LINE_END = re.compile(r" +\n")


def printable(text: str) -> str:
    """`text` without terminal control characters (newlines and tabs stay)."""
    return _CONTROL.sub("", text)


def one_line(text: str) -> str:
    """`printable(text)` on one line: a newline in a record's text (an argv element, a path) is shown as
    `\\n`, so it cannot print a line of its own that looks like cascade's (a tool's output quoted
    in an error keeps its lines apart the same way)."""
    return printable(text).strip("\n").replace("\n", "\\n")


class _Printable:
    """A stream for rich: its own colour sequences pass, any other control character is dropped; with
    `trim` (piped output: grep, diff, a file), no line ends in the spaces rich pads a table row with."""

    def __init__(self, stream: Any, trim: bool = False) -> None:
        self._stream = stream
        self._trim = trim
        self._spaces = ""  # trailing spaces held back until the next text says whether a line ends there

    def write(self, text: str) -> int:
        written = len(text)
        if self._trim:
            text = self._spaces + text
            body = text.rstrip(" ")
            self._spaces = text[len(body) :]
            text = _PADDED_LINE_END.sub("\n", body)
        kept = []
        position = 0
        for match in _SGR.finditer(text):
            kept += [printable(text[position : match.start()]), match.group()]
            position = match.end()
        kept.append(printable(text[position:]))
        self._stream.write("".join(kept))
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def notice(message: str) -> None:
    """A one-line status message on stderr (plain: used while the script's output streams)."""
    sys.stderr.write(f"cascade: {one_line(message)}\n")
    sys.stderr.flush()


def error(message: str, hint: str | None = None, then: str | None = None) -> None:
    """An error on stderr, with the hint that names the fix and what to do next, each on its line."""
    sys.stderr.write(f"cascade: error: {one_line(message)}\n")
    if hint:
        sys.stderr.write(f"  hint: {one_line(hint)}\n")
    if then:
        sys.stderr.write(f"  {then}\n")
    sys.stderr.flush()


def interrupted() -> None:
    """Ctrl-C: one line on stderr (the command exits 130)."""
    sys.stderr.write("cascade: interrupted\n")
    sys.stderr.flush()


def emit_json(command: str, data: Any) -> None:
    """The machine-readable result of `command` on stdout, in the versioned envelope (`cascade.cli/1`)."""
    envelope = {"schema": JSON_SCHEMA, "command": command, "data": data}
    sys.stdout.write(json.dumps(envelope, indent=2, sort_keys=True, default=str) + "\n")


def no_color() -> bool:
    """NO_COLOR set and not empty (https://no-color.org): no colour, and no bold or other style either."""
    import os

    return bool(os.environ.get("NO_COLOR"))


def _console() -> Any:
    from rich.console import Console

    # Piped output is for grep and less: do not squeeze tables into 80 columns.
    width = None if sys.stdout.isatty() else 220
    stream = cast(IO[str], _Printable(sys.stdout, trim=width is not None))
    # rich's own NO_COLOR support drops colours but keeps bold and underline: no styles at all here
    return Console(
        highlight=False,
        soft_wrap=False,
        width=width,
        markup=False,
        file=stream,
        color_system=None if no_color() else "auto",
    )


def _styled(*parts: str | tuple[str, str]) -> Any:
    """Text with some parts styled: ("run abc", "bold"), plain strings as they are (never markup)."""
    from rich.text import Text

    return Text.assemble(*parts)


@contextlib.contextmanager
def byte_progress() -> Iterator[Callable[[str, int | None], Callable[[int], None] | None]]:
    """A progress-bar factory for long hashing and copying: bars on a terminal, nothing elsewhere."""
    if not sys.stderr.isatty():
        yield lambda label, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress(
        "{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        console=Console(stderr=True, color_system=None if no_color() else "auto"), transient=True,
    ) as bars:  # fmt: skip

        def factory(label: str, total: int | None) -> Callable[[int], None]:
            task = bars.add_task(label, total=total or None)
            return lambda advance: bars.advance(task, advance)

        yield factory


def _num(value: float) -> str:
    return f"{value:.4g}"


def _time(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else ""


def _size(size: Any) -> str:
    if not isinstance(size, (int, float)):
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    text = one_line(value) if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
