"""Results carry their exit status (issue 16): the CLI exits with it and decides nothing itself."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from cascade_repro.api.restoring import RestoreResult
from cascade_repro.api.spooled import SyncResult
from cascade_repro.check import BITWISE, NOT_RUNNABLE, TOLERANCE, CheckReport, check_machine
from cascade_repro.determinism.verdict import judge
from cascade_repro.errors import EXIT_INCOMPLETE, EXIT_NOT_REPRODUCED, EXIT_OK
from cascade_repro.manifest import Manifest
from cascade_repro.recovery import Delivered
from cascade_repro.run_plan import RunResult
from cascade_repro.store.ui_server import UiOutcome
from tests.plugin import as_record

CLI = Path(__file__).resolve().parents[2] / "cascade_repro" / "cli"


def _step(step: int, loss: float) -> dict[str, Any]:
    bits = int(loss * 1e6)
    return {"step": step, "batch": f"b{step}", "loss": {"bits": bits, "value": loss, "dtype": "float32"},
            "params_after": {"w": f"p{step}"}}  # fmt: skip


def _record(run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "params": {"values": {}, "seed": 0}, "git": {"commit": "c" * 40},
            "torch": {"version": "2.13.0"}, "trace": {"algorithm": "xxh3_64", "interval": 1}}  # fmt: skip


def test_a_verdict_exits_3_exactly_when_it_did_not_reproduce() -> None:
    trace = [_step(i, 1.0 - i / 10) for i in range(3)]
    same = judge(as_record(_record("a")), as_record(_record("b")), trace, copy.deepcopy(trace))
    other = copy.deepcopy(trace)
    other[2]["params_after"]["w"] = "changed"
    diverged = judge(as_record(_record("a")), as_record(_record("b")), trace, other)
    assert (same.verdict, same.exit_status) == ("BITWISE_IDENTICAL", EXIT_OK)
    assert (diverged.verdict, diverged.exit_status) == ("DIVERGED", EXIT_NOT_REPRODUCED)


@pytest.mark.parametrize(("verdict", "status"), [(BITWISE, 0), (TOLERANCE, 3), (NOT_RUNNABLE, 1)])
def test_a_check_report_exits_by_its_verdict(verdict: str, status: int) -> None:
    assert CheckReport("run", verdict, ()).exit_status == status


def test_the_machine_check_exits_1_on_any_failed_probe() -> None:
    assert check_machine({"git": (True, "ok", "")}).exit_status == 0
    assert (
        check_machine({"git": (True, "ok", ""), "Docker": (False, "no engine", "start it")}).exit_status == 1
    )


@pytest.mark.parametrize(
    ("script", "incomplete", "status"), [(0, (), 0), (0, ("trace",), 4), (7, ("trace",), 7), (7, (), 7)]
)
def test_a_run_exits_with_the_script_code_and_4_only_where_the_script_succeeded(
    script: int, incomplete: tuple[str, ...], status: int
) -> None:
    manifest = Manifest.outcome_only("r", "e", "0", {"status": "FINISHED", "exit_code": script})
    result = RunResult("r", "FINISHED", script, "sqlite://", "e", manifest, (), incomplete=incomplete)
    assert result.exit_status == status


def test_a_restore_exits_with_its_verdict_and_0_when_only_materialized() -> None:
    trace = [_step(0, 1.0)]
    other = [_step(0, 2.0)]
    diverged = judge(as_record(_record("a")), as_record(_record("b")), trace, other)
    ran: Any = object()  # a re-run's RunResult; exit_status reads only whether there was one
    plan: Any = None
    assert RestoreResult(plan, plan, run=None, verdict=None).exit_status == 0
    assert RestoreResult(plan, plan, run=ran, verdict=None).exit_status == 1
    assert RestoreResult(plan, plan, run=ran, verdict=diverged).exit_status == 3


def test_sync_exits_4_while_anything_is_pending() -> None:
    done = Delivered("d1", "r1", "FINISHED", 10, (), recovered=True)
    pending = Delivered("d2", "r2", "PENDING-SYNC", 3, ("4 metric points",), recovered=False)
    assert SyncResult(()).exit_status == EXIT_OK
    assert SyncResult((done,)).exit_status == EXIT_OK
    assert SyncResult((done, pending)).exit_status == EXIT_INCOMPLETE


def test_the_ui_exits_0_when_stopped_and_1_when_the_server_died() -> None:
    assert UiOutcome("http://x", Path("log"), None).exit_status == 0
    assert UiOutcome("http://x", Path("log"), 2).exit_status == 1


def test_the_cli_decides_no_exit_code_itself() -> None:
    """Bodies return a result's `exit_status`; no verdict string or bare code is compared or returned."""
    source = "\n".join(path.read_text(encoding="utf-8") for path in sorted(CLI.glob("*.py")))
    assert "def verify(" in source and "def restore(" in source
    assert re.findall(r"return\s+\d+\b|==\s*\"OK\"|\.reproduced\b|ctx\.exit\(\d+\)", source) == []
