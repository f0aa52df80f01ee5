"""Scripts that seed themselves (issue 14.3): the step-0 RNG fingerprint is read after the script's own
seeding, the seeds it set are recorded beside cascade's, and `--seed` says when it had no effect."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from cascade_repro.determinism.verdict import NO_BATCHES
from tests.plugin import Project

pytestmark = pytest.mark.slow

SELF_SEEDING = """\
import random

import numpy as np
import torch

torch.manual_seed(1337)
random.seed(1337)
np.random.seed(1337)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 8) + float(np.random.rand()) + random.random()
y = x.sum(dim=1, keepdim=True)
for step in range(10):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print("done")
"""

# Seeds torch only, and never draws from Python's random or numpy.
SEEDS_TORCH_ONLY = """\
import torch

torch.manual_seed(1337)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 8)
for step in range(20):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
    opt.step()
"""

# Reseeds at every epoch's start (5 steps an epoch), as some scripts do.
RESEEDS_EACH_EPOCH = """\
import random

import numpy as np
import torch

model = opt = None
for epoch in range(3):
    torch.manual_seed(100 + epoch)
    random.seed(100 + epoch)
    np.random.seed(100 + epoch)
    if model is None:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 8)
    for step in range(5):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        opt.step()
"""

# Builds its model before seeding: the weights come from cascade's seed, whatever the script sets.
SEEDS_TOO_LATE = """\
import random

import numpy as np
import torch

model = torch.nn.Linear(8, 1)
torch.manual_seed(1337)
random.seed(1337)
np.random.seed(1337)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 8)
for step in range(5):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
    opt.step()
"""

# Shuffles with a torch.Generator of its own, seeded from the clock (not a seeding function cascade wraps).
CLOCK_SEEDED_LOADER = """\
import time

import torch

generator = torch.Generator()
generator.manual_seed(time.time_ns() % 2**62)
x = torch.arange(64, dtype=torch.float32).reshape(32, 2)
data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, generator=generator)
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
for epoch in range(2):
    for inputs, targets in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        opt.step()
"""


def _verify(project: Project, a: str, b: str) -> tuple[int, dict[str, Any]]:
    result = project.cascade("verify", a, b, "--json")
    assert result.returncode in (0, 3), result.stderr
    return result.returncode, json.loads(result.stdout)["data"]


def _shown(project: Project, run_id: str) -> dict[str, Any]:
    data = json.loads(project.cascade("show", run_id, "--json", check=True).stdout)["data"]
    return dict(data["manifest"])


@pytest.fixture
def seeding(project: Project) -> Project:
    project.write("selfseed.py", SELF_SEEDING)
    project.write("reseeds.py", RESEEDS_EACH_EPOCH)
    project.write("late.py", SEEDS_TOO_LATE)
    project.write("torchonly.py", SEEDS_TORCH_ONLY)
    project.write("clock_loader.py", CLOCK_SEEDED_LOADER)
    project.write("fixed_loader.py", CLOCK_SEEDED_LOADER.replace("time.time_ns() % 2**62", "20261205"))
    project.commit("self-seeding scripts")
    return project


def test_a_self_seeding_script_is_bitwise_identical_whatever_the_seed(seeding: Project) -> None:
    a = seeding.record("--seed", "1", "selfseed.py")
    b = seeding.record("--seed", "2", "selfseed.py")
    code, verdict = _verify(seeding, a, b)
    assert code == 0 and verdict["verdict"] == "BITWISE_IDENTICAL", verdict["summary"]
    assert verdict["likely_causes"] == []
    assert all(d["kind"] != "seed" for d in verdict["record_differences"])
    # diff still shows cascade's seed, as information: the script's own seeds were in force
    diff = json.loads(seeding.cascade("diff", a, b, "--json", check=True).stdout)["data"]
    (seed_section,) = [s for s in diff["sections"] if s["name"] == "seed"]
    (change,) = [c for c in seed_section["changes"] if c["key"] == "seed"]
    assert change["class"] == "C" and "the script seeds torch, random and numpy itself" in change["note"]


def test_the_record_lists_the_seeds_the_script_set_beside_cascades(seeding: Project) -> None:
    run_id = seeding.record("--seed", "5", "selfseed.py")
    record = _shown(seeding, run_id)
    assert record["params"]["seed"] == 5 and record["params"]["seed_source"] == "option"
    assert record["determinism"]["applied"]["torch.manual_seed"] == 5  # cascade's, beside the script's
    assert record["determinism"]["script_seeds"] == [
        {"function": "torch.manual_seed", "seed": 1337, "generators": ["torch"], "step": 0},
        {"function": "random.seed", "seed": 1337, "generators": ["python"], "step": 0},
        {"function": "numpy.random.seed", "seed": 1337, "generators": ["numpy"], "step": 0},
    ]
    human = seeding.cascade("show", run_id, check=True).stdout
    assert "torch.manual_seed(1337)" in human and "random.seed(1337)" in human
    assert "no effect" in human


def test_seed_option_on_a_self_seeding_script_says_it_had_no_effect(seeding: Project) -> None:
    result = seeding.cascade("run", "--seed", "7", "selfseed.py", check=True)
    assert (
        "--seed 7 had no effect on torch, random and numpy: the script seeds them itself "
        "(torch.manual_seed(1337), random.seed(1337), numpy.random.seed(1337))"
    ) in result.stderr
    plain = seeding.cascade("run", "--seed", "7", "train.py", check=True)
    assert "had no effect" not in plain.stderr


def test_a_script_that_does_not_seed_itself_still_diverges_at_step_zero_by_the_seed(seeding: Project) -> None:
    a = seeding.record("--seed", "1", "train.py")
    b = seeding.record("--seed", "2", "train.py")
    assert _shown(seeding, a)["determinism"]["script_seeds"] == []
    code, verdict = _verify(seeding, a, b)
    assert code == 3 and verdict["verdict"] == "DIVERGED"
    first = verdict["first_divergence"]
    assert first["step"] == 0 and first["facets"][0]["facet"] == "rng"
    assert "torch" in first["facets"][0]["names"]
    assert verdict["likely_causes"][0]["summary"] == "seed 1 → 2"


def test_a_script_seeding_torch_only_trains_identically_and_verify_says_so(seeding: Project) -> None:
    a = seeding.record("--seed", "1", "torchonly.py")
    b = seeding.record("--seed", "2", "torchonly.py")
    code, verdict = _verify(seeding, a, b)
    # Python's random and numpy (torch imports it) still follow --seed: their states differ, unused
    assert code == 0 and verdict["verdict"] == "BITWISE_IDENTICAL", verdict["summary"]
    assert verdict["notes"] == [
        "the RNG state of numpy, python differs (first at step 0), but no batch, loss, gradient or weight "
        "does at any compared step: the training never drew from it",
        NO_BATCHES,  # the script reads a fixed tensor, no DataLoader
    ]
    assert [d["summary"] for d in verdict["record_differences"]] == ["seed 1 → 2"]
    result = seeding.cascade("run", "--seed", "7", "torchonly.py", check=True)
    assert (
        "--seed 7 had no effect on torch: the script seeds it itself (torch.manual_seed(1337)); "
        "random still follows --seed"
    ) in result.stderr


def test_a_script_that_reseeds_every_epoch_is_traced_after_each_reseed(seeding: Project) -> None:
    # every facet every step: two runs' traces are then equal text (a budget samples by timing)
    a = seeding.record("--seed", "1", "--trace-budget", "0", "reseeds.py")
    b = seeding.record("--seed", "2", "--trace-budget", "0", "reseeds.py")
    calls = _shown(seeding, a)["determinism"]["script_seeds"]
    assert [(c["function"], c["seed"], c["step"]) for c in calls[::3]] == [
        ("torch.manual_seed", 100, 0), ("torch.manual_seed", 101, 5), ("torch.manual_seed", 102, 10),
    ]  # fmt: skip
    code, verdict = _verify(seeding, a, b)
    assert code == 0 and verdict["verdict"] == "BITWISE_IDENTICAL", verdict["summary"]
    # the RNG fingerprint of an epoch's first step is read after that epoch's reseed
    traces = [_trace(seeding, run) for run in (a, b)]
    assert traces[0][5]["rng"] == traces[1][5]["rng"]
    c = seeding.record("--seed", "1", "--trace-budget", "0", "reseeds.py")  # again: the same trace
    assert _trace(seeding, c) == traces[0]


def test_seeding_after_the_model_is_built_leaves_cascades_seed_a_cause(seeding: Project) -> None:
    a = seeding.record("--seed", "1", "late.py")
    b = seeding.record("--seed", "2", "late.py")
    (torch_call, *_) = _shown(seeding, a)["determinism"]["script_seeds"]
    assert torch_call["function"] == "torch.manual_seed" and torch_call["drawn_before"] == ["torch"]
    code, verdict = _verify(seeding, a, b)
    assert code == 3 and verdict["first_divergence"]["step"] == 0
    assert [f["facet"] for f in verdict["first_divergence"]["facets"]][0] == "params_before"
    assert verdict["likely_causes"][0]["summary"] == "seed 1 → 2"
    result = seeding.cascade("run", "--seed", "7", "late.py", check=True)
    assert "--seed 7 had no effect on random and numpy" in result.stderr
    assert "torch still follows --seed: it was drawn from before the script seeded it" in result.stderr


def test_a_dataloader_generator_the_script_seeds_is_recorded_and_named_by_verify(seeding: Project) -> None:
    a = seeding.record("clock_loader.py")
    b = seeding.record("clock_loader.py")
    seeds = [[c for c in _shown(seeding, run)["determinism"]["script_seeds"]] for run in (a, b)]
    for calls in seeds:
        (call,) = calls  # once, though the loader is iterated twice with the same generator
        assert call["function"] == "torch.Generator" and call["generators"] == ["DataLoader"]
        assert call["step"] == 0 and isinstance(call["seed"], int)
    assert seeds[0][0]["seed"] != seeds[1][0]["seed"]
    code, verdict = _verify(seeding, a, b)
    assert code == 3 and verdict["first_divergence"]["step"] == 0
    assert verdict["first_divergence"]["facets"][0]["facet"] == "batch"
    cause = verdict["likely_causes"][0]["summary"]
    assert cause.startswith("the script's seeds torch.Generator(") and str(seeds[1][0]["seed"]) in cause
    human = seeding.cascade("show", a, check=True).stdout
    assert f"torch.Generator({seeds[0][0]['seed']})" in human


def test_a_dataloader_generator_with_a_fixed_seed_trains_identically(seeding: Project) -> None:
    a = seeding.record("--seed", "1", "fixed_loader.py")
    b = seeding.record("--seed", "1", "fixed_loader.py")
    calls = _shown(seeding, a)["determinism"]["script_seeds"]
    assert calls == [
        {"function": "torch.Generator", "seed": 20261205, "generators": ["DataLoader"], "step": 0}
    ]
    code, verdict = _verify(seeding, a, b)
    assert code == 0 and verdict["verdict"] == "BITWISE_IDENTICAL", verdict["summary"]


def _trace(project: Project, run_id: str) -> list[dict[str, Any]]:
    local = project.client().download_artifacts(run_id, "cascade/trace.jsonl", str(project.root / ".dl"))
    lines = Path(local).read_text().splitlines()
    shutil.rmtree(project.root / ".dl")
    return [json.loads(line) for line in lines]
