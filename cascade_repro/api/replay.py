"""`cascade verify --replay`: re-run both runs up to their first divergence and measure it there.

Fingerprints say which tensors differ at step k, not by how much. Each run is restored (code, dirty
state, data, recorded environment) and re-run for k+1 steps with its tensors of step k saved; each
replay must reproduce its own recorded trace bit for bit up to there, or the saved tensors would not
be that run's, and nothing is measured. Both replays are recorded as runs, like any restore.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from cascade_repro.api.loading import load_project
from cascade_repro.api.restoring import restore
from cascade_repro.child.protocol import DUMP_FILE
from cascade_repro.determinism.magnitude import TENSOR_FACETS, Magnitude, magnitudes
from cascade_repro.determinism.verdict import BITWISE_IDENTICAL, Verdict
from cascade_repro.run_plan import Notify


def replay_divergence(
    verdict: Verdict, cwd: Path | None, notify: Notify
) -> tuple[list[Magnitude], dict[str, Any]]:
    """The magnitudes at the first divergence, and the replay's record (runs, what was not measured)."""
    comparison = verdict.comparison
    step = comparison.step
    tensor_facets = [d for d in comparison.differences if d.facet in TENSOR_FACETS]
    if step is None or not tensor_facets:
        where = "no step differs" if step is None else f"at step {step} no tensor differs"
        return [], {"runs": {}, "not_measured": [f"nothing to replay: {where}"]}
    replays = load_project(cwd).paths.replays
    runs: dict[str, str] = {}
    dumps: list[Path] = []
    for side, run_id in (("a", verdict.run_a), ("b", verdict.run_b)):
        directory = replays / f"{run_id[:12]}-step{step}"
        shutil.rmtree(directory, ignore_errors=True)
        notify(f"replay {side}: re-running {run_id[:12]} for {step + 1} steps to save step {step}")
        result = restore(run_id, cwd=cwd, steps=step + 1, dump=(step, directory), notify=notify)
        assert result.run is not None and result.verdict is not None  # execute=True
        runs[side] = result.run.run_id
        if result.verdict.verdict != BITWISE_IDENTICAL:
            reason = (
                f"the replay of {run_id[:12]} did not reproduce its own trace up to step {step} "
                f"({result.verdict.verdict}: {result.verdict.summary}), so its tensors there are not "
                "that run's: the two runs differ by where they ran, which the fingerprints and causes show"
            )
            return [], {"runs": runs, "not_measured": [reason]}
        dumps.append(directory / DUMP_FILE)
    import torch

    saved = [torch.load(path, map_location="cpu", weights_only=True) for path in dumps]
    found, missing = magnitudes(torch, saved[0], saved[1], tensor_facets)
    return found, {"runs": runs, "not_measured": missing}
