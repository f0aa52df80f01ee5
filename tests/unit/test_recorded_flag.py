"""A restore reads cascade's own options from the recorded invocation (untrusted: a record may come
from a shared server), never the script's arguments (found in review: `--track-inputs` among them
turned the restore's caching on, and an invocation that was no list raised a TypeError)."""

from __future__ import annotations

from typing import Any

import pytest

from cascade_repro.api.restoring import _recorded_flag


@pytest.mark.parametrize(
    ("invocation", "expected"),
    [
        (["cascade", "run", "--track-inputs", "train.py"], True),
        (["cascade", "run", "--set", "a=1", "--name", "x", "--track-inputs", "train.py", "--lr", "1"], True),
        (["cascade", "run", "train.py", "--track-inputs"], False),  # the script's own argument
        (["cascade", "run", "--name", "--track-inputs", "train.py"], False),  # the run's name
        (["cascade", "run", 7, "--track-inputs"], False),
        ("cascade run --track-inputs train.py", False),
        (None, False),
        (["python", "--track-inputs"], False),
    ],
)
def test_a_recorded_option_is_cascades_own(invocation: Any, expected: bool) -> None:
    assert _recorded_flag(invocation, "--track-inputs") is expected
