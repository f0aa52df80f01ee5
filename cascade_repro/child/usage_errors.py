"""argparse's usage errors in the script, noted for the parent before the script exits with 2.

`cascade run train.py --seed 7` hands `--seed 7` to the script, whose argparse refuses it. The
parent needs to know that this exit 2 came from argparse (not from the script's own `sys.exit(2)`):
it then names the option that belonged to cascade and keeps no run of a script that never started
training. Installed on the script's `import argparse` (child/hooks.py), so it costs nothing else.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

Note = Callable[[dict[str, Any]], None]


def watch(argparse: ModuleType, note: Note) -> None:
    """Make every `ArgumentParser.error` call `note` with the error, then go on as argparse does.

    `note` gets the shape of the child's `exception` fact (the exception that ended the script:
    argparse ends it with SystemExit(2)), plus `usage_error`, the line argparse prints.
    """
    parser_class = argparse.ArgumentParser
    original = parser_class.error
    if getattr(original, "_cascade_usage_errors", False):
        return

    def error(self: Any, message: str) -> Any:
        try:
            line = f"{self.prog}: error: {message}"
            line = line[:2000]
            note({"type": "SystemExit", "message": f"2 (argparse: {line})", "usage_error": line})
        except Exception:  # noting must never change what the script does
            pass
        return original(self, message)

    error._cascade_usage_errors = True  # type: ignore[attr-defined]
    parser_class.error = error
