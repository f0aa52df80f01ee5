"""The one comparator of two run records, and what diff, verify, check and restore read from it."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Callable

import pytest

from cascade_repro.check import BITWISE, check_against
from cascade_repro.determinism import catalogue, record_compare
from cascade_repro.determinism.compare import FacetDifference, TraceComparison, compare_traces
from cascade_repro.determinism.explain import likely_causes, manifest_differences
from cascade_repro.determinism.record_compare import compare_records, same_torch_version
from cascade_repro.diff import diff_records
from cascade_repro.restore import machine_differences
from tests.plugin import as_record

TORCH = {
    "version": "2.14.1+cu130", "git_version": "abc", "cuda": "13.0", "hip": None, "cudnn": 91000,
    "nccl": "2.27.3", "cpu_capability": "AVX2", "mkl_version": "2024.2", "onednn_version": "3.7",
    "debug": False, "cxx_abi": "1", "num_threads": 8, "num_interop_threads": 8, "gpus": [{"name": "H200"}],
}  # fmt: skip


def _record(run_id: str = "a") -> dict[str, Any]:
    return {
        "run_id": run_id,
        "experiment": "exp",
        "command": {"script": "train.py", "argv": ["--epochs", "3"]},
        "params": {"values": {"optimizer": {"lr": 0.1}, "seed": 3}, "seed": 3},
        "determinism": {"mode": "warn", "flags_at_start": {"cudnn.benchmark": False}, "script_seeds": []},
        "git": {
            "commit": "c" * 40,
            "patch": {"sha256": "p1"},
            "untracked": [{"path": "n.txt", "sha256": "u1"}],
        },
        "python": {
            "version": "3.11.7",
            "packages": {"numpy": {"version": "2.1.0"}, "pip": {"version": "24"}},
        },
        "torch": copy.deepcopy(TORCH),
        "hardware": {
            "cpu": {"model": "Xeon", "count": 16},
            "hostname": "h1",
            "memory_mb": 1000,
            "os": {"release": "6.1"},
        },  # fmt: skip
        "environment": {
            "OMP_NUM_THREADS": "8",
            "PYTHONHASHSEED": "3",
            "CASCADE_SEED": "3",
            "MLFLOW_RUN_ID": "r",
        },
        "environment_read": {"MY_LR": "0.1"},
        "container": {"image": "img:1", "image_id": "sha256:1"},
        "data": [{"path": "data/x.csv", "md5": "m1", "matches": True}],
    }


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(record: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = record
        for key in parents:
            target = target[key]
        target[last] = value

    return edit


# Every field of the catalogue: (edit of the second record, section, key, class, kind).
CATALOGUE = [
    *[(_set(f"torch.{k}", "other"), "stack", f"torch.{k}", "A", "torch")
      for k in record_compare.TORCH_CLASS_A],
    *[(_set(f"torch.{k}", 1), "stack", f"torch.{k}", "B", "threads") for k in record_compare.TORCH_CLASS_B],
    (_set("torch.gpus", [{"name": "A100"}]), "stack", "gpus", "A", "gpu"),
    (_set("hardware.cpu.model", "EPYC"), "stack", "cpu.model", "A", "cpu"),
    (_set("python.version", "3.12.1"), "stack", "python", "A", "python"),
    (_set("distributed", {"launcher": "launched", "world_size": 2, "nproc_per_node": 2, "nnodes": 1}),
     "stack", "world_size", "A", "world_size"),
    (_set("distributed", {"launcher": "torchrun", "world_size": 1, "nproc_per_node": 1, "nnodes": 2}),
     "stack", "nnodes", "A", "nnodes"),
    (_set("git.commit", "d" * 40), "code", "commit", "B", "code"),
    (_set("git.patch", {"sha256": "p2"}), "code", "patch", "B", "code"),
    (_set("git.untracked", [{"path": "n.txt", "sha256": "u2"}]), "code", "untracked:n.txt", "B", "code"),
    (_set("command.script", "other.py"), "code", "script", "B", "command"),
    (_set("command.module", "pkg.train"), "code", "module", "B", "command"),
    (_set("command.argv", []), "code", "argv", "B", "command"),
    (_set("params.values.optimizer.lr", 0.05), "params", "optimizer.lr", "B", "params"),
    (_set("params.seed", 7), "seed", "seed", "B", "seed"),
    (_set("determinism.mode", "strict"), "seed", "determinism.mode", "B", "determinism"),
    (_set("determinism.script_seeds", [{"function": "torch.manual_seed", "seed": 1, "generators": []}]),
     "seed", "script_seeds", "B", "seed"),
    (_set("determinism.flags_at_start", {"cudnn.benchmark": True}), "seed", "flags.cudnn.benchmark", "B",
     "determinism"),
    # a flag the script set itself (torch.set_float32_matmul_precision): the flags as it left them
    (_set("torch.flags", {"float32_matmul_precision": "medium"}), "seed",
     "script_flags.float32_matmul_precision", "B", "determinism"),
    (_set("python.packages.numpy", {"version": "1.0"}), "packages", "numpy", "B", "packages"),
    *[(_set(f"python.packages.{name}", {"version": "99"}), "packages", name, "C", "packages")
      for name in catalogue.TOOLING_PACKAGES],
    (_set("environment.OMP_NUM_THREADS", "1"), "environment", "OMP_NUM_THREADS", "B", "environment"),
    (_set("environment_read.MY_LR", "0.05"), "environment", "read:MY_LR", "B", "environment_read"),
    (_set("data", [{"path": "data/x.csv", "md5": "m2", "matches": True}]), "data", "data/x.csv", "B", "data"),
    *[(_set(f"container.{k}", "other"), "container", k, "B", "image")
      for k in record_compare.CONTAINER_FIELDS],
    (_set("hardware.hostname", "h2"), "machine", "hostname", "C", "machine"),
    (_set("hardware.memory_mb", 2000), "machine", "memory_mb", "C", "machine"),
    (_set("hardware.cpu.count", 2), "machine", "cpu.count", "C", "machine"),
    (_set("hardware.os", {"release": "6.8"}), "machine", "os", "C", "machine"),
]  # fmt: skip


@pytest.mark.parametrize("edit, section, key, klass, kind", CATALOGUE)
def test_each_catalogue_field_is_compared_with_its_class(
    edit: Callable[[dict[str, Any]], None], section: str, key: str, klass: str, kind: str
) -> None:
    a, b = _record("a"), _record("b")
    edit(b)
    (change,) = compare_records(as_record(a), as_record(b)).changes
    assert (change.key, change.klass, change.kind) == (key, klass, kind)
    assert compare_records(as_record(a), as_record(b)).section(section).changes == (change,)
    # diff shows that same change, verify names it as a cause unless it is informational
    shown = [
        c for s in diff_records(as_record(a), as_record(b)).sections for c in s.changes if s.name == section
    ]
    assert shown == [change]
    kinds = [d.kind for d in manifest_differences(as_record(a), as_record(b))]
    assert kinds == ([] if klass == "C" else [kind])


def test_the_catalogue_covers_every_compared_section() -> None:
    assert {c[1] for c in CATALOGUE} == set(record_compare.SECTIONS)


def test_every_field_of_the_catalogue_is_exercised_and_nothing_else_is_compared() -> None:
    """The code's catalogue (determinism/catalogue.py) and the cases above name the same fields: a field
    added to one and not the other fails here, as does a compared key the catalogue does not know."""
    exercised = {(section, catalogue.lookup(section, key).key) for _, section, key, *_ in CATALOGUE}
    listed = {(f.section, f.key) for f in catalogue.FIELDS if f.section in record_compare.SECTIONS}
    assert exercised == listed
    with pytest.raises(KeyError, match="not in the field catalogue"):
        catalogue.lookup("stack", "torch.something_new")


def test_results_are_compared_by_diff_with_the_catalogue_class() -> None:
    a, b = _record("a"), _record("b")
    for record, loss, md5 in ((a, 0.5, "1" * 32), (b, 0.4, "2" * 32)):
        record["metrics"] = {"keys": {"loss": {"last": loss, "min": loss}}}
        record["checkpoints"] = [{"path": "ckpt.pt", "md5": md5, "status": "kept"}]
    result = diff_records(as_record(a), as_record(b), trace_note="DIVERGED at step 3")
    changes = [(s.name, c) for s in result.sections for c in s.changes]
    keys = {(name, catalogue.lookup(name, c.key).key, c.klass) for name, c in changes}
    assert keys == {("metrics", "*", "R"), ("checkpoints", "*", "R"), ("trace", "first divergence", "R")}


def test_seed_derived_and_own_variables_are_part_of_the_seed_not_the_environment() -> None:
    a, b = _record("a"), _record("b")
    b["params"]["seed"] = 7
    b["environment"].update(PYTHONHASHSEED="7", CASCADE_SEED="7", MLFLOW_RUN_ID="other")
    assert [(c.key, c.kind) for c in compare_records(as_record(a), as_record(b)).changes] == [
        ("seed", "seed")
    ]
    assert [d.summary for d in manifest_differences(as_record(a), as_record(b))] == ["seed 3 → 7"]


def test_a_variable_read_by_one_run_only_is_informational() -> None:
    a, b = _record("a"), _record("b")
    b["environment_read"]["NEW_KNOB"] = "1"
    (change,) = compare_records(as_record(a), as_record(b)).changes
    assert (change.key, change.klass, change.note) == ("read:NEW_KNOB", "C", "read by one run only")
    assert manifest_differences(as_record(a), as_record(b)) == []
    # a record that ran nothing (`current`, this machine) read nothing: not compared
    del b["environment_read"]
    assert compare_records(as_record(a), as_record(b)).changes == ()


@pytest.mark.parametrize(
    "a, b, same",
    [
        ("2.14.1+cu130", "2.14.1", True),  # package metadata of PyPI's CUDA wheel vs torch.__version__
        ("2.14.1", "2.14.1+cpu", True),
        ("2.14.1+cu130", "2.14.1+cu130", True),
        ("2.14.1+cu121", "2.14.1+cu130", False),  # both name their build: another build
        ("2.14.1+cpu", "2.14.1+cu130", False),
        ("2.13.0+cu130", "2.14.1", False),
        ("2.14.1", None, False),
    ],
)
def test_torch_versions_compare_the_public_version_and_the_label_only_where_both_have_one(
    a: str, b: str | None, same: bool
) -> None:
    assert same_torch_version(a, b) is same


def test_pypi_cuda_torch_is_not_a_class_a_line_in_restore_check_or_diff() -> None:
    """Issue 14, defect 8: `torch 2.14.1+cu130 recorded, 2.14.1 here`."""
    record = _record("a")
    here = {  # as restore captures this machine: the installed version, torch not imported
        "torch": {"version": "2.14.1"},
        "hardware": copy.deepcopy(record["hardware"]) | {"gpus": [{"name": "H200"}]},
        "python": copy.deepcopy(record["python"]),
        "environment": dict(record["environment"]),
    }
    assert machine_differences(as_record(record), as_record(here)) == []
    probed = {**here, "torch": {**TORCH, "version": "2.14.1"}}  # check and diff probe torch's stack
    assert check_against(as_record(record), as_record(probed)).verdict == BITWISE
    assert not diff_records(as_record(record), as_record(probed), only=("stack",)).sections[0].changes
    here["torch"]["version"] = "2.13.0"
    (difference,) = machine_differences(as_record(record), as_record(here))
    assert (difference.kind, difference.klass) == ("torch", "A")
    assert difference.summary == "torch 2.14.1+cu130 recorded, 2.13.0 here"


def _diverged(facet: str, *names: str, then: tuple[str, ...] = ()) -> TraceComparison:
    first = (FacetDifference(facet, names, ""), *(FacetDifference(f, (), "") for f in then))
    return TraceComparison(20, 20, 20, 0, first)


def _causes(a: dict[str, Any], b: dict[str, Any], comparison: TraceComparison) -> list[str]:
    return [
        c.summary
        for c in likely_causes(
            as_record(a), as_record(b), comparison, manifest_differences(as_record(a), as_record(b))
        )
    ]


def test_rng_first_at_step_zero_ranks_the_seed_above_the_learning_rate() -> None:
    a, b = _record("a"), _record("b")
    b["params"].update(seed=7, values={"optimizer": {"lr": 0.05}, "seed": 7})
    b["environment"]["PYTHONHASHSEED"] = "7"
    causes = _causes(a, b, _diverged("rng", "numpy", "python", "torch", then=("params_after",)))
    assert causes == ["seed 3 → 7", "params differ: optimizer.lr 0.1 → 0.05"]


def test_params_after_only_ranks_the_optimizer_params_then_a_write_outside_it() -> None:
    a, b = _record("a"), _record("b")
    b["params"]["values"]["optimizer"]["lr"] = 0.05
    b["environment"]["OMP_NUM_THREADS"] = "4"
    causes = _causes(a, b, _diverged("params_after", "0.weight"))
    assert causes[0] == "params differ: optimizer.lr 0.1 → 0.05"
    assert causes[1] == "environment differs: OMP_NUM_THREADS '8' → '4'"
    c = _record("c")
    c["environment_read"]["MY_LR"] = "0.2"
    causes = _causes(a, c, _diverged("params_after", "0.weight"))
    assert causes[0] == "the script read environment variables that differ: MY_LR '0.1' → '0.2'"
    assert causes[1].startswith("a write outside the optimizer changed 0.weight after step 0")


def test_batch_first_ranks_the_data_then_the_seed() -> None:
    a, b = _record("a"), _record("b")
    b["params"]["values"]["optimizer"]["lr"] = 0.05
    b["params"]["seed"] = 7
    b["data"] = [{"path": "data/x.csv", "md5": "m2", "matches": True}]
    causes = _causes(a, b, _diverged("batch", then=("loss",)))
    assert [c.split(" ")[0] for c in causes] == ["data", "seed", "params"]


def test_loss_first_with_equal_inputs_ranks_nondeterminism_then_class_a() -> None:
    a, b = _record("a"), _record("b")
    b["torch"]["num_threads"] = 4
    b["torch"]["cpu_capability"] = "DEFAULT"
    b["params"]["values"]["optimizer"]["lr"] = 0.05
    b["determinism"]["nondeterministic_ops"] = ["aten::index_add_"]
    causes = _causes(a, b, _diverged("loss", then=("grads",)))
    assert causes[0] == "nondeterministic ops ran: aten::index_add_"
    assert causes[1] == "torch threads 8 → 4"
    assert causes[2] == "torch stack differs: cpu_capability AVX2 → DEFAULT"
    assert causes[3] == "params differ: optimizer.lr 0.1 → 0.05"
    same = _causes(a, _record("c"), _diverged("loss"))
    assert same[0] == (
        "nondeterministic computation: the same batch and weights gave a different loss at step 0"
    )


def test_where_the_weights_were_not_compared_before_the_step_no_evidence_says_they_were_equal() -> None:
    """A thinned trace: the weights were last compared before step 2, the loss differs first at step 6.
    The cause may not rest on "the weights before the step are equal" (it said so, beside "the
    weights were last compared before step 2")."""
    a, b = _record("a"), _record("b")
    bracketed = TraceComparison(20, 20, 20, 6, (FacetDifference("loss", (), ""),), bracket_start=2)
    causes = likely_causes(as_record(a), as_record(b), bracketed,
                           manifest_differences(as_record(a), as_record(b)))  # fmt: skip
    cause = next(c for c in causes if c.summary.startswith("nondeterministic computation"))
    assert "were equal before the step" not in cause.evidence
    assert "last compared (equal) before step 2" in cause.evidence
    assert cause.summary.endswith("at step 6, or at a step from 2 on, where the weights were not compared")
    differences = manifest_differences(as_record(a), as_record(b))
    exact = likely_causes(as_record(a), as_record(b), _diverged("loss"), differences)
    assert next(c for c in exact if c.summary.startswith("nondeterministic")).evidence == (
        "the RNG state, the batch and the weights the optimizer updates were equal before the step"
    )


def test_a_variable_the_script_read_ranks_above_nondeterminism_where_the_loss_differs_first() -> None:
    """PERTURB_AT=650 read by the script, the loss first differing: cause 1 was "nondeterministic
    computation ... the same batch and weights", the variable second."""
    a, b = _record("a"), _record("b")
    b["environment_read"]["MY_LR"] = "0.2"
    causes = _causes(a, b, _diverged("loss"))
    assert causes[0] == "the script read environment variables that differ: MY_LR '0.1' → '0.2'"
    assert not any(c.startswith("nondeterministic computation") for c in causes)


def test_without_batches_fingerprinted_nondeterminism_does_not_claim_the_batch_was_equal() -> None:
    """nanoGPT-style data (no DataLoader): the trace has no batch to call equal."""
    a, b = _record("a"), _record("c")
    unbatched = replace(_diverged("loss"), notes=("batches are not compared: neither run read its data",))
    cause = next(c for c in likely_causes(as_record(a), as_record(b), unbatched,
                                          manifest_differences(as_record(a), as_record(b)))  # fmt: skip
                 if c.summary.startswith("nondeterministic computation"))
    assert cause.summary == "nondeterministic computation: the same weights gave a different loss at step 0"
    assert cause.evidence == "the RNG state and the weights the optimizer updates were equal before the step"
    # what the trace cannot see (a tester's frozen layer written between steps, os.urandom in the data)
    assert "os.urandom" in cause.fix and "frozen layers" in cause.fix


def test_a_torch_flag_the_script_set_is_a_cause_saying_so() -> None:
    """The tester's script called torch.set_float32_matmul_precision("medium") in one run (490 ulp at
    step 0 on this CPU): the record held it (torch.flags), diff listed only the variable it read."""
    a, b = _record("a"), _record("b")
    a["torch"]["flags"] = {"float32_matmul_precision": "highest", "cudnn.benchmark": False}
    b["torch"]["flags"] = {"float32_matmul_precision": "medium", "cudnn.benchmark": False}
    (difference,) = manifest_differences(as_record(a), as_record(b))
    assert difference.summary == "the script set torch flags: float32_matmul_precision highest → medium"
    comparison = compare_traces([{"step": 0, "loss": {"bits": 1, "value": 1.0, "dtype": "float32"}}],
                                [{"step": 0, "loss": {"bits": 2, "value": 1.1, "dtype": "float32"}}])
    (cause, *_) = likely_causes(as_record(a), as_record(b), comparison, [difference])
    assert cause.summary == difference.summary and "sets them itself" in cause.fix


def test_an_input_that_differs_names_the_runs_that_wrote_it_on_each_side() -> None:
    """Two evaluations of models from two training runs: the diff says which runs; where only the
    writer differs (a deterministic re-run wrote the same bytes), the input is equal."""
    a, b = _record("a"), _record("b")
    a["inputs"] = [{"path": "model.pt", "size": 3, "sha256": "1" * 64, "written_by": "e" * 32}]
    b["inputs"] = [{"path": "model.pt", "size": 3, "sha256": "2" * 64, "written_by": "f" * 32}]
    (change,) = compare_records(as_record(a), as_record(b)).section("data").changes
    assert (change.key, change.note) == ("model.pt", "written by run eeeeeeee · written by run ffffffff")
    b["inputs"][0]["written_by"] = None
    (change,) = compare_records(as_record(a), as_record(b)).section("data").changes
    assert change.note == "written by run eeeeeeee · -"
    b["inputs"][0].update(sha256="1" * 64, written_by="f" * 32)
    assert compare_records(as_record(a), as_record(b)).section("data").changes == ()
