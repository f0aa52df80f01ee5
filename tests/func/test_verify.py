"""`cascade verify` on real recorded runs: each scenario has a known verdict, step and facet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cascade_repro.determinism.verdict import NO_BATCHES
from tests.plugin import Project

pytestmark = pytest.mark.slow


def _verify(project: Project, a: str, b: str) -> tuple[int, dict[str, Any]]:
    result = project.cascade("verify", a, b, "--json")
    assert result.returncode in (0, 3), result.stderr
    return result.returncode, json.loads(result.stdout)["data"]


def test_same_seeded_run_twice_is_bitwise_identical_and_recorded(project: Project) -> None:
    a = project.record("train.py")
    b = project.record("train.py")
    code, verdict = _verify(project, a, b)
    assert code == 0
    assert verdict["verdict"] == "BITWISE_IDENTICAL"
    assert verdict["steps"] == {"a": 20, "b": 20, "compared": 20}
    later = project.client().get_run(b)
    assert later.data.tags["cascade.verdict"] == "BITWISE_IDENTICAL"
    assert later.data.tags["cascade.verified_against"] == a
    manifest = project.manifest(a)
    assert manifest["trace"]["steps"] == 20 and manifest["trace"]["algorithm"] == "xxh3_64"
    human = project.cascade("verify", a, b).stdout
    assert "BITWISE_IDENTICAL" in human and "all 20 steps are bitwise identical" in human


def test_unseeded_runs_diverge_at_step_zero_in_the_rng(project: Project) -> None:
    a = project.record("--seed", "random", "train.py")
    b = project.record("--seed", "random", "train.py")
    code, verdict = _verify(project, a, b)
    assert code == 3
    assert verdict["verdict"] == "DIVERGED"
    first = verdict["first_divergence"]
    assert first["step"] == 0
    assert first["facets"][0]["facet"] == "rng" and "torch" in first["facets"][0]["names"]
    assert verdict["likely_causes"][0]["summary"].startswith("seed ")


def test_one_ulp_write_after_step_k_is_found_at_step_k(project: Project) -> None:
    # every facet every step: found without a replay (a budget's bracket: test_verify_replay.py)
    a = project.record("--trace-budget", "0", "train.py")
    b = project.record("--trace-budget", "0", "train.py", env={"PERTURB_AT_STEP": "5"})
    code, verdict = _verify(project, a, b)
    assert code == 3 and verdict["verdict"] == "DIVERGED"
    first = verdict["first_divergence"]
    assert first["step"] == 5
    assert [f["facet"] for f in first["facets"]] == ["params_after"]  # loss and grads equal at step 5
    assert first["facets"][0]["names"] == ["0.weight"]
    # the script read PERTURB_AT_STEP, so the record knows it: that is the first cause
    (difference,) = verdict["record_differences"]
    assert difference["class"] == "B" and "PERTURB_AT_STEP unset → '5'" in difference["summary"]
    causes = [c["summary"] for c in verdict["likely_causes"]]
    assert "PERTURB_AT_STEP" in causes[0]
    assert "write outside the optimizer changed 0.weight after step 5" in causes[1]


def test_changed_learning_rate_names_the_param_first(project: Project) -> None:
    a = project.record("train.py")
    b = project.record("--set", "optimizer.lr=0.05", "train.py")
    code, verdict = _verify(project, a, b)
    assert code == 3 and verdict["verdict"] == "DIVERGED"
    assert verdict["first_divergence"]["step"] in (0, 1)
    assert verdict["likely_causes"][0]["summary"] == "params differ: optimizer.lr 0.1 → 0.05"


def test_runs_of_different_length_are_incomparable_with_the_overlap_compared(project: Project) -> None:
    a = project.record("train.py")
    b = project.record("--set", "steps=12", "train.py")
    code, verdict = _verify(project, a, b)
    assert code == 3
    assert verdict["verdict"] == "INCOMPARABLE"
    assert verdict["steps"] == {"a": 20, "b": 12, "compared": 12}
    assert verdict["first_divergence"] is None
    assert "the first 12 are bitwise identical" in verdict["summary"]


def test_verify_of_an_unknown_run(project: Project) -> None:
    a = project.record("train.py")
    result = project.cascade("verify", a, "nosuchrun")
    assert result.returncode == 1 and "no run 'nosuchrun'" in result.stderr


def test_manual_sgd_without_an_optimizer_is_traced_and_verified(project: Project) -> None:
    from tests.plugin import SCRIPTS

    project.write("manual_sgd.py", (SCRIPTS / "manual_sgd.py").read_text())
    project.commit("manual sgd")
    a = project.record("manual_sgd.py")
    b = project.record("manual_sgd.py")
    assert project.manifest(a)["trace"]["steps"] == 20
    code, verdict = _verify(project, a, b)
    assert code == 0 and verdict["verdict"] == "BITWISE_IDENTICAL"
    c = project.record("--set", "optimizer.lr=0.2", "manual_sgd.py")
    code, verdict = _verify(project, a, c)
    assert code == 3 and verdict["first_divergence"]["step"] == 0
    assert [f["facet"] for f in verdict["first_divergence"]["facets"]] == ["params_after"]
    assert verdict["likely_causes"][0]["summary"] == "params differ: optimizer.lr 0.1 → 0.2"


def test_another_cpu_capability_is_numerically_equivalent(project: Project) -> None:
    """A class-A difference (other CPU kernels): bitwise equality is not expected, tolerance is."""
    import torch

    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU has no vector capability to step down from")
    a = project.record("train.py")
    b = project.record("train.py", env={"ATEN_CPU_CAPABILITY": "default"})
    code, verdict = _verify(project, a, b)
    assert project.manifest(b)["torch"]["cpu_capability"] == "DEFAULT"
    assert code == 0 and verdict["verdict"] == "NUMERICALLY_EQUIVALENT", verdict["summary"]
    assert "cpu_capability" in verdict["summary"]
    strict = json.loads(project.cascade("verify", a, b, "--rtol", "0", "--atol", "0", "--json").stdout)[
        "data"
    ]
    assert strict["verdict"] == "DIVERGED"


def test_show_trace_summarizes_the_recorded_losses(project: Project) -> None:
    run_id = project.record("train.py")
    losses = json.loads((project.root / "out/losses.json").read_text())
    shown = json.loads(project.cascade("show", run_id, "--trace", "--json", check=True).stdout)["data"][
        "trace"
    ]
    assert shown["steps"] == len(losses) == 20
    assert (shown["first_step"], shown["last_step"]) == (0, 19)
    assert shown["loss_first"] == losses[0] and shown["loss_last"] == losses[-1]  # the same bits
    assert shown["loss_min"] == [losses.index(min(losses)), min(losses)]
    assert shown["grads"] is True  # a small model on CPU: gradients are cheap, so hashed
    human = project.cascade("show", run_id, "--trace", check=True).stdout
    assert "20 steps recorded" in human and "fingerprints of weights and gradients" in human
    assert shown["batches"] == 0 and "no batches: the script read no torch DataLoader" in human
    project.write("cascade.yaml", "trace_grads: false\n")
    lean = project.record("train.py")
    assert (
        json.loads(project.cascade("show", lean, "--trace", "--json", check=True).stdout)["data"]["trace"][
            "grads"
        ]
        is False
    )
    code, verdict = _verify(project, run_id, lean)  # compared on what both traces hold
    assert code == 0 and verdict["verdict"] == "BITWISE_IDENTICAL"
    assert verdict["notes"] == [
        f"gradients are not compared: run {lean[:12]} did not hash them (trace_grads)",
        NO_BATCHES,  # train.py trains on a fixed tensor: no DataLoader
    ]


def test_trace_interval_zero_records_no_trace(project: Project) -> None:
    a = project.record("--trace-interval", "0", "train.py")
    b = project.record("train.py")
    assert project.manifest(a)["trace"] is None
    code, verdict = _verify(project, a, b)
    assert code == 3 and verdict["verdict"] == "INCOMPARABLE" and "no step trace" in verdict["summary"]


def test_shuffled_dataloader_with_workers_is_reproduced_batch_for_batch(project: Project) -> None:
    from tests.plugin import SCRIPTS

    project.write("loader.py", (SCRIPTS / "loader.py").read_text())
    project.commit("loader")
    a = project.record("loader.py")
    b = project.record("loader.py")
    records = project.cascade("show", a, "--trace", "--json", check=True)
    assert json.loads(records.stdout)["data"]["trace"]["steps"] == 16
    trace = json.loads(records.stdout)["data"]["trace"]
    assert trace["batches"] == 16 and trace["budget"] == 0.02
    # what the trace cost, as the child measured it: every step's facets and the sampled weights
    cost = trace["cost"]
    assert 0 < cost["every_step"] <= cost["share"] < 1 and cost["step_ms"] > 0
    assert cost["share"] == pytest.approx(cost["every_step"] + cost["sampled"], abs=2e-5)
    shown = project.cascade("show", a, "--trace", check=True).stdout
    assert f"cost {cost['share']:.1%} of the training loop's time" in " ".join(shown.split())
    code, verdict = _verify(project, a, b)
    assert code == 0 and verdict["verdict"] == "BITWISE_IDENTICAL"
    c = project.record("--seed", "5", "loader.py")
    code, verdict = _verify(project, a, c)
    assert verdict["first_divergence"]["step"] == 0
    assert verdict["first_divergence"]["facets"][0]["facet"] == "rng"
    assert "batch" in [f["facet"] for f in verdict["first_divergence"]["facets"]]  # another shuffle


ACCUMULATING = """
import os, torch
torch.manual_seed(0)
x, y = torch.randn(96, 4), torch.randn(96, 1)
if os.environ.get("CHANGE_FIRST_MICRO_BATCH_OF_STEP_3"):
    x[48] += 1.0  # batch 6 of 8 rows: the first of step 3's two
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i, (xb, yb) in enumerate(loader):  # gradient accumulation: two micro-batches a step
    (torch.nn.functional.mse_loss(model(xb), yb) / 2).backward()
    if i % 2:
        opt.step()
        opt.zero_grad()
"""


def _as_recorded_one_micro_batch_a_step(project: Project, run_id: str) -> None:
    """The run's trace and record as a cascade before cascade.trace/2 wrote them: a step's last
    micro-batch and its last loss (the batch's fingerprint cannot be made again: any other value)."""
    from urllib.parse import urlparse

    from cascade_repro.determinism.trace_formats import last_part

    artifacts = Path(urlparse(project.client().get_run(run_id).info.artifact_uri).path) / "cascade"
    lines = []
    for line in (artifacts / "trace.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("batches"):
            del record["batches"]
            record["batch"] = "0123456789abcdef"
        if record.get("loss") and "parts" in record["loss"]:
            record["loss"] = last_part(record["loss"])
        lines.append(json.dumps(record, separators=(",", ":")))
    (artifacts / "trace.jsonl").write_text("\n".join(lines) + "\n")
    record = json.loads((artifacts / "run.json").read_text())
    assert record["trace"]["format"] == "cascade.trace/3"
    record["trace"]["format"] = "cascade.trace/1"
    (artifacts / "run.json").write_text(json.dumps(record))


def test_an_accumulation_run_recorded_before_each_step_held_all_its_micro_batches(project: Project) -> None:
    """A gradient-accumulation run recorded by the cascade before cascade.trace/2 against one recorded
    now: it said "DIVERGED at step 0: the loss differs" (a step's last loss against the sum of its
    two) and ranked a false cause. Steps are compared on what both kept."""
    project.write("accumulate.py", ACCUMULATING)
    project.commit("accumulate")
    old = project.record("--trace-budget", "0", "accumulate.py")
    new = project.record("--trace-budget", "0", "accumulate.py")
    changed = project.record("--trace-budget", "0", "accumulate.py",
                             env={"CHANGE_FIRST_MICRO_BATCH_OF_STEP_3": "1"})  # fmt: skip
    _as_recorded_one_micro_batch_a_step(project, old)
    code, verdict = _verify(project, old, new)
    assert (code, verdict["verdict"]) == (0, "BITWISE_IDENTICAL"), verdict["summary"]
    assert verdict["steps"]["compared"] == 6
    assert any("kept one micro-batch a step" in note for note in verdict["notes"])
    code, verdict = _verify(project, old, changed)  # the first micro-batch: in the gradients, not the loss
    assert (code, verdict["verdict"]) == (3, "DIVERGED"), verdict["summary"]
    first = verdict["first_divergence"]
    assert first["step"] == 3 and first["facets"][0]["facet"] == "grads"


HAND_UPDATED = """
import sys, torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
by_hand = sys.argv[1] == "by-hand"
opt = None if by_hand else torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    if by_hand:
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad = None
    else:
        opt.step()
        opt.zero_grad()
    if step == 4:
        torch.save(model.state_dict(), "after-step-4.pt")
"""


def test_a_script_updating_by_hand_keeps_the_trace_interval_and_the_checkpoint_step(project: Project) -> None:
    """Weights updated by hand: --trace-interval 3 recorded every step, and a checkpoint saved after
    step 4's update said step 3 (with an optimizer: step 4)."""
    project.write("hand.py", HAND_UPDATED)
    project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\nout/\n*.pt\n")
    project.commit("by hand")
    runs = {how: project.record("--trace-interval", "3", "hand.py", how) for how in ("by-hand", "optimizer")}
    for how, run_id in runs.items():
        manifest = project.manifest(run_id)
        (checkpoint,) = manifest["checkpoints"]
        assert checkpoint["step"] == 4, how
        show = project.cascade("show", run_id, "--trace", "--json", check=True)
        assert json.loads(show.stdout)["data"]["trace"]["steps"] == 4, how  # steps 0, 3, 6, 9
    a, b = runs["by-hand"], project.record("--trace-interval", "3", "hand.py", "by-hand")
    code, verdict = _verify(project, a, b)
    assert code == 0 and verdict["verdict"] == "BITWISE_IDENTICAL"


WITH_AN_EMA = """
import copy, os, time, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
ema = copy.deepcopy(model).requires_grad_(False)  # updated by hand: no optimizer holds it
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 4), torch.randn(32, 1)
for step in range(8):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(0.9).add_(p, alpha=0.1)
        if step == 4 and os.environ.get("TOUCH_THE_EMA"):
            ema[0].weight.view(-1)[0] += 1e-3
torch.save(ema.state_dict(), "ema.pt")
torch.save({"model": model.state_dict(), "saved_at": time.time()}, "model.pt")  # a time beside the tensors
"""


def test_an_ema_the_trace_does_not_see_is_found_in_the_checkpoint_it_ends_in(project: Project) -> None:
    """verify said "all 40 steps are bitwise identical" for two runs whose EMA weights (updated by hand,
    in no optimizer) differed; diff showed ema.pt's md5 differing."""
    project.write("ema.py", WITH_AN_EMA)
    project.write(".gitignore", "mlflow.db\nmlruns/\n.cascade/\nout/\n*.pt\n")
    project.commit("an ema")
    a = project.record("ema.py")
    b = project.record("ema.py")
    touched = project.record("ema.py", env={"TOUCH_THE_EMA": "1"})
    code, verdict = _verify(project, a, b)  # the time saved in model.pt is no difference
    assert (code, verdict["verdict"]) == (0, "BITWISE_IDENTICAL"), verdict["summary"]
    saved = {c["path"]: c["tensors"] for c in project.manifest(a)["checkpoints"]}
    assert set(saved) == {"ema.pt", "model.pt"} and all(len(t) == 16 for t in saved.values())
    code, verdict = _verify(project, a, touched)
    assert (code, verdict["verdict"]) == (3, "DIVERGED"), verdict["summary"]
    assert "the tensors saved in ema.pt at step 7 differ" in verdict["summary"]
    assert verdict["likely_causes"][0]["summary"].startswith("the script read environment variables")
    assert any("EMA" in c["summary"] for c in verdict["likely_causes"])
