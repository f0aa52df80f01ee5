"""`cascade verify --replay`: both runs re-run to the first divergence, the tensors there compared."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch

from tests.plugin import Project

pytestmark = pytest.mark.slow


def _verify_replay(project: Project, a: str, b: str) -> dict:
    result = project.cascade("verify", a, b, "--replay", "--json")
    assert result.returncode == 3, result.stderr
    return json.loads(result.stdout)["data"]


def test_replay_measures_a_one_ulp_write_exactly(project: Project) -> None:
    # every facet every step, so that the saved tensors can be checked against the recorded fingerprints
    a = project.record("--trace-budget", "0", "train.py")
    b = project.record("--trace-budget", "0", "train.py", env={"PERTURB_AT_STEP": "5"})
    verdict = _verify_replay(project, a, b)
    first = verdict["first_divergence"]
    assert first["step"] == 5
    (magnitude,) = first["magnitudes"]
    assert (magnitude["facet"], magnitude["name"]) == ("params_after", "0.weight")
    assert magnitude["differing"] == 1 and magnitude["elements"] == 16 * 8
    # the saved tensors are the runs' own: their fingerprints are the recorded ones, and the
    # difference is the one ulp the script wrote
    saved = {
        run: torch.load(project.root / ".cascade" / "replays" / run[:12] / "step5" / "tensors.pt")
        for run in (a, b)
    }
    left, right = saved[a]["params_after"]["0.weight"], saved[b]["params_after"]["0.weight"]
    from cascade_repro.determinism.fingerprint import cpu_hash

    for run, tensor in ((a, left), (b, right)):
        trace = _trace(project, run)
        assert trace[5]["params_after"]["0.weight"] == cpu_hash(tensor)
    element = left.reshape(-1)[0]
    assert right.reshape(-1)[0] == torch.nextafter(element, torch.tensor(float("inf")))
    assert magnitude["max_abs"] == float((right.reshape(-1)[0].double() - element.double()).abs())
    assert "(max |Δ| " in verdict["summary"] and "1 of 128 elements" in verdict["summary"]
    # both replays are recorded runs, restored from the originals and verified bitwise up to step 5
    client = project.client()
    for side, original in (("a", a), ("b", b)):
        replayed = client.get_run(verdict["replay"]["runs"][side])
        assert replayed.data.tags["cascade.restored_from"] == original
        assert replayed.data.tags["cascade.verdict"] == "BITWISE_IDENTICAL"
    # the verdict recorded on the later run carries the magnitudes
    report = client.download_artifacts(b, f"cascade/verify/{a}.json", str(project.root / ".dl"))
    assert json.loads(Path(report).read_text())["first_divergence"]["magnitudes"] == [magnitude]


@pytest.mark.parametrize("perturbed", [5, 2])  # inside the bracket, and at its first step
def test_a_divergence_at_a_step_the_budget_skipped_is_pinned_by_replay(project: Project,
                                                                       perturbed: int) -> None:  # fmt: skip
    """A one-ulp write at a step with a budget so small that only steps 0, 1 and the last have their
    weights read: verify brackets it, --replay re-runs both with every facet and pins that step."""
    script = (project.root / "train.py").read_text()
    project.write("train.py", script.replace("    losses.append(loss.item())\n",
                                             "    losses.append(loss.item())\n    print(f'step {step}')\n"))
    project.commit("a line a step")  # the replays' output must not get into verify's JSON
    a = project.record("--trace-budget", "1e-9", "train.py")
    b = project.record("--trace-budget", "1e-9", "train.py", env={"PERTURB_AT_STEP": str(perturbed)})
    trace = _trace(project, b)
    assert [r["step"] for r in trace if "params_after" in r] == [0, 1, len(trace) - 1]  # what the record says
    assert project.manifest(b)["trace"]["budget"] == 1e-9
    seen = project.cascade("verify", a, b, "--json")
    assert seen.returncode == 3, seen.stderr
    bracketed = json.loads(seen.stdout)["data"]
    first = bracketed["first_divergence"]
    assert first["step"] > perturbed and first["bracket"] == [2, first["step"]], first
    assert "verify --replay" in bracketed["summary"] and "from 2 to" in bracketed["summary"]
    replayed = _verify_replay(project, a, b)
    pinned = replayed["first_divergence"]
    assert (pinned["step"], pinned["bracket"]) == (perturbed, None)
    assert [f["facet"] for f in pinned["facets"]][:1] == ["params_after"]
    assert replayed["replay"]["pinned"] == {"step": perturbed, "bracket": [2, first["step"]]}
    (magnitude,) = pinned["magnitudes"]
    assert (magnitude["facet"], magnitude["name"], magnitude["differing"]) == ("params_after", "0.weight", 1)
    assert replayed["summary"].startswith(f"DIVERGED at step {perturbed}")
    # one pair of replays: they saved every step of the bracket, so the step was measured from those;
    # the bracket's other steps are removed once measured
    assert set(replayed["replay"]["runs"]) == {"a", "b"}
    for run in (a, b):
        saved = project.root / ".cascade" / "replays" / run[:12]
        kept = sorted(p.relative_to(saved).as_posix() for p in saved.rglob("*.pt"))
        assert kept == [f"step{perturbed}/tensors.pt"]


def test_a_divergence_at_a_step_without_a_record_is_pinned_by_replay(project: Project) -> None:
    """Steps so short that the default budget thins the records themselves past the first 128: a
    one-ulp write at a step with no record is bracketed by verify, pinned by --replay; a restore
    records the same steps, byte for byte."""
    project.write("hyperparameters.yaml", "seed: 3\nsteps: 400\noptimizer:\n  lr: 0.01\n  momentum: 0.9\n"
                  "model:\n  hidden: 16\n")  # fmt: skip
    project.commit("many short steps")
    perturbed = 301  # odd: past the first 128 steps, the records are at multiples of a power of two
    a = project.record("train.py")
    b = project.record("train.py", env={"PERTURB_AT_STEP": str(perturbed)})
    trace_a, trace_b = _trace(project, a), _trace(project, b)
    header = project.manifest(b)["trace"]
    assert any(every > 1 for _, every in header["records"]), header  # the record says what it thinned
    assert perturbed not in [r["step"] for r in trace_b] and trace_b[-1]["step"] == 399
    assert [r["step"] for r in trace_a][:128] == list(range(128))
    seen = project.cascade("verify", a, b, "--json")
    assert seen.returncode == 3, seen.stderr
    first = json.loads(seen.stdout)["data"]["first_divergence"]
    start, step = first["bracket"]
    assert start <= perturbed < step == first["step"], first
    replayed = _verify_replay(project, a, b)
    pinned = replayed["first_divergence"]
    assert (pinned["step"], pinned["bracket"]) == (perturbed, None)
    assert [f["facet"] for f in pinned["facets"]][:1] == ["params_after"]
    (magnitude,) = pinned["magnitudes"]
    assert (magnitude["name"], magnitude["differing"]) == ("0.weight", 1)
    # the causes are ranked again from the pinned step (they were the bracket's: "at step 320, or at a
    # step from 257 on"), and the loss's first difference is the replays' (not the thinned traces')
    # (after the weights written at the pinned step; a one-ulp weight may leave the next loss's float32
    # bits as they were, on some CPUs: then a later step's, one the thinned traces have no record of)
    loss_step = replayed["loss_first_difference"]["step"]
    assert perturbed < loss_step <= step, (loss_step, first)
    assert loss_step == perturbed + 1 or loss_step not in [r["step"] for r in trace_b], loss_step
    causes = [cause["summary"] for cause in replayed["likely_causes"]]
    assert causes[0].endswith(f"environment variables that differ: PERTURB_AT_STEP unset → '{perturbed}'")
    assert any(f"changed 0.weight after step {perturbed}" in cause for cause in causes), causes
    project.cascade("tag", a, "v1", check=True)
    restored = project.cascade("restore", "v1", "--json")
    assert restored.returncode == 0, restored.stderr
    rerun = json.loads(restored.stdout)["data"]["run"]["run_id"]
    assert project.manifest(rerun)["trace"]["records"] == project.manifest(a)["trace"]["records"]
    assert _trace(project, rerun) == trace_a  # the same steps recorded, bit for bit


def test_a_restore_samples_the_recorded_steps_so_its_trace_is_the_same_bytes(project: Project) -> None:
    """The default budget samples the weights by timing; a restore hands the schedule back."""
    project.write("hyperparameters.yaml", "seed: 3\nsteps: 60\noptimizer:\n  lr: 0.01\n  momentum: 0.9\n"
                  "model:\n  hidden: 16\n")  # fmt: skip
    project.commit("longer")
    original = project.record("train.py")
    header = project.manifest(original)["trace"]
    assert header["budget"] == 0.02 and header["schedule"][0] == [0, 1]
    project.cascade("tag", original, "v1", check=True)
    restored = project.cascade("restore", "v1", "--json")
    assert restored.returncode == 0, restored.stderr
    rerun = json.loads(restored.stdout)["data"]["run"]["run_id"]
    assert project.manifest(rerun)["trace"]["schedule"] == header["schedule"]
    assert _trace(project, rerun) == _trace(project, original)  # bit for bit, sampled steps alike


def test_a_restore_records_the_steps_its_record_names(project: Project) -> None:
    """A record (from someone else: its schedule is not one this machine's timing would give) that
    names which steps have a record: the restore records those, and is judged at the common steps."""
    original = project.record("train.py")  # 20 steps: every one recorded here
    artifacts = Path(urlparse(project.client().get_run(original).info.artifact_uri).path)
    record_file = artifacts / "cascade" / "run.json"
    record = json.loads(record_file.read_text())
    record["trace"]["records"] = [[0, 1], [3, 4]]
    record_file.write_text(json.dumps(record))
    restored = project.cascade("restore", original, "--json")
    assert restored.returncode == 0, restored.stderr
    data = json.loads(restored.stdout)["data"]
    rerun = data["run"]["run_id"]
    assert [r["step"] for r in _trace(project, rerun)] == [0, 1, 2, 4, 8, 12, 16, 19]  # 19: the final weights
    assert project.manifest(rerun)["trace"]["records"] == [[0, 1], [3, 4]]
    assert data["verdict"]["verdict"] == "BITWISE_IDENTICAL", data["verdict"]["summary"]
    assert data["verdict"]["summary"] == "the 8 steps both traces recorded (of 20) are bitwise identical"


def test_replay_that_does_not_reproduce_its_run_measures_nothing(project: Project, tmp_path: Path) -> None:
    # the script seeds itself from a file outside the repository, which cascade cannot restore:
    # by the time of the replay the file holds another value, so run a's replay is not run a
    outside = tmp_path / "init-seed"
    project.write(
        "seeded.py",
        "import os\nfrom pathlib import Path\nimport torch\n"
        "torch.manual_seed(int(Path(os.environ['INIT_SEED_FILE']).read_text()))\n"
        "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "x = torch.ones(8, 4)\nfor _ in range(3):\n    opt.zero_grad()\n"
        "    model(x).square().mean().backward()\n    opt.step()\n",
    )
    project.commit("seeded")
    env = {"INIT_SEED_FILE": str(outside)}
    outside.write_text("1")
    a = project.record("seeded.py", env=env)
    outside.write_text("2")
    b = project.record("seeded.py", env=env)
    verdict = _verify_replay(project, a, b)
    assert verdict["first_divergence"]["step"] == 0
    assert verdict["first_divergence"]["magnitudes"] == []
    (reason,) = verdict["replay"]["not_measured"]
    assert reason.startswith(f"the replay of {a[:12]} did not reproduce its own trace up to step 0")
    assert list(verdict["replay"]["runs"]) == ["a"]  # b is not replayed once a cannot be


def test_unseeded_runs_replay_with_the_seeds_they_drew(project: Project) -> None:
    # --seed random draws a seed and records it, so each run can be re-run as it was
    a = project.record("--seed", "random", "train.py")
    b = project.record("--seed", "random", "train.py")
    verdict = _verify_replay(project, a, b)
    first = verdict["first_divergence"]
    assert first["step"] == 0 and first["facets"][0]["facet"] == "rng"
    assert verdict["replay"]["not_measured"] == [] and set(verdict["replay"]["runs"]) == {"a", "b"}
    before = {m["name"]: m for m in first["magnitudes"] if m["facet"] == "params_before"}
    assert set(before) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert before["0.weight"]["elements"] == 128 and before["0.weight"]["differing"] > 100
    assert 0 < before["0.weight"]["max_abs"] < 1  # two draws of the default init, |w| < 1/sqrt(8)


def test_manual_sgd_without_an_optimizer_is_replayed_too(project: Project) -> None:
    from tests.plugin import SCRIPTS

    project.write("manual_sgd.py", (SCRIPTS / "manual_sgd.py").read_text())
    project.commit("manual sgd")
    a = project.record("manual_sgd.py")
    b = project.record("--set", "optimizer.lr=0.2", "manual_sgd.py")
    verdict = _verify_replay(project, a, b)
    first = verdict["first_divergence"]
    assert first["step"] == 0 and verdict["replay"]["not_measured"] == []
    after = {m["name"]: m for m in first["magnitudes"] if m["facet"] == "params_after"}
    assert set(after) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    # lr 0.1 vs 0.2 from the same weights and gradients: every weight with a gradient moved
    assert after["2.bias"]["differing"] == 1 and after["2.bias"]["max_abs"] > 0


def test_runs_of_different_length_have_no_divergent_step_to_replay(project: Project) -> None:
    a = project.record("train.py")
    b = project.record("--set", "steps=12", "train.py")
    verdict = _verify_replay(project, a, b)
    assert verdict["verdict"] == "INCOMPARABLE"
    assert verdict["replay"] == {"runs": {}, "not_measured": ["nothing to replay: no step differs"]}


def _trace(project: Project, run: str) -> list[dict]:
    path = project.client().download_artifacts(run, "cascade/trace.jsonl", str(project.root / ".dl"))
    return [json.loads(line) for line in Path(path).read_text().splitlines()]
