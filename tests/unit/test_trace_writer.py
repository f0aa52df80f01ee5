"""The trace's file (child/trace_writer.py): records kept as read at their step are turned into the
same lines however they are batched at a flush."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cascade_repro.child import step_values
from cascade_repro.child.trace_writer import TraceWriter


def test_losses_held_as_tensors_are_read_together_as_each_would_be_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what `loss_now` keeps of a loss on an accelerator (a copy, read at the flush); here on CPU
    values = [torch.tensor(0.1), torch.tensor(-0.0), torch.tensor(float("nan")), torch.tensor([2.5]),
              torch.tensor(1 / 3, dtype=torch.float64), torch.tensor(7.0, dtype=torch.bfloat16),
              torch.tensor(1e-40)]  # fmt: skip
    alone = [step_values.loss_record(torch, loss) for loss in values]  # one at a time, as before
    writer = TraceWriter(torch, tmp_path / "trace.jsonl")
    for step, loss in enumerate([*values, None]):
        writer.write({"step": step, "loss": loss.clone() if loss is not None else None})
    encoded = []  # what each record's loss is when it is encoded
    one = step_values.loss_record
    monkeypatch.setattr(step_values, "loss_record", lambda t, loss: encoded.append(loss) or one(t, loss))
    writer.close()
    # the float32 and float64 losses were read together (on a device: one wait), only bfloat16 alone
    assert [type(loss).__name__ for loss in encoded] == [*["LossBits"] * 5, "Tensor", "LossBits", "NoneType"]
    written = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    text = [json.dumps(record["loss"]) for record in written]  # (NaN is not equal to itself)
    assert text == [json.dumps(loss) for loss in [*alone, None]]
    assert written[0]["loss"]["bits"] == 0x3DCCCCCD and written[1]["loss"]["bits"] == -(2**31)
    assert written[4]["loss"]["dtype"] == "float64" and written[5]["loss"]["dtype"] == "bfloat16"


def test_a_trace_that_stops_says_so_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found on a full run directory: the failed flush stopped the trace, and closing it at exit met the
    same failure and printed the same line again."""
    from cascade_repro.child.trace import StepTracer

    tracer = StepTracer(torch, tmp_path / "trace.jsonl")
    full = OSError(28, "No space left on device")
    tracer.stop(full)
    tracer.stop(full)
    assert capsys.readouterr().err.count("the step trace stopped") == 1
    # the record says where the trace ends and why (the run said FINISHED with a trace cut short)
    stopped = {"step": 0, "error": "OSError: [Errno 28] No space left on device", "full_disk": True}
    assert tracer.header()["stopped"] == stopped
    tracer.close()
    # another failure (a batch of nested tensors) stops the trace too, and is no full disk
    other = StepTracer(torch, tmp_path / "other.jsonl")
    other.stop(RuntimeError("NestedTensor has no strides"))
    assert other.header()["stopped"] == {"step": 0, "error": "RuntimeError: NestedTensor has no strides"}
    other.close()
