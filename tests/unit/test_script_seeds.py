"""The seeds a script sets itself (issue 14.3): the child's hooks on the frameworks' seed functions,
the record's shape check, and the comparator's "in force" rule."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cascade_repro.determinism import script_seeds
from cascade_repro.determinism.record_compare import compare_records
from cascade_repro.determinism.verdict import judge
from cascade_repro.errors import CascadeError
from cascade_repro.manifest import check_shape
from tests.plugin import as_record

# Stand-ins for the frameworks (not installed here), laid out as the real packages are, so that the
# child's import hooks find them by their module names.
FAKES = {
    "lightning/__init__.py": "",
    "lightning/fabric/__init__.py": "",
    "lightning/fabric/utilities/__init__.py": "",
    "lightning/fabric/utilities/seed.py": (
        "import random\nimport numpy as np\n"
        "def seed_everything(seed=None, workers=False):\n"
        "    seed = 42 if seed is None else seed\n"
        "    random.seed(seed)\n    np.random.seed(seed)\n    return seed\n"
    ),
    "pytorch_lightning/__init__.py": "",
    "pytorch_lightning/utilities/__init__.py": "",
    "pytorch_lightning/utilities/seed.py": "from lightning.fabric.utilities.seed import seed_everything\n",
    # transformers resolves its top-level names lazily, as the real one does
    "transformers/__init__.py": (
        "import importlib\n"
        "def __getattr__(name):\n"
        "    if name == 'set_seed':\n"
        "        return importlib.import_module('transformers.trainer_utils').set_seed\n"
        "    raise AttributeError(name)\n"
    ),
    "transformers/trainer_utils.py": (
        "import random\nimport numpy as np\n"
        "def set_seed(seed, deterministic=False):\n    random.seed(seed)\n    np.random.seed(seed)\n"
    ),
}

SCRIPT = """\
import random
import numpy
from lightning.fabric.utilities.seed import seed_everything
import pytorch_lightning.utilities.seed as pl_seed
from transformers import set_seed

assert seed_everything() == 42
pl_seed.seed_everything(3)  # the same function, re-exported: hooked once, named where it is defined
set_seed(7)
random.seed("text seed")
numpy.random.seed(11)
print(random.random(), numpy.random.rand())
"""


def _run_child(tmp_path: Path, script: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    packages = tmp_path / "packages"
    for rel, text in FAKES.items():
        (packages / rel).parent.mkdir(parents=True, exist_ok=True)
        (packages / rel).write_text(text)
    (tmp_path / "script.py").write_text(script)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    environ = {**os.environ, "CASCADE_RUN_DIR": str(run_dir), "CASCADE_SEED": "5",
               "PYTHONPATH": str(packages), "CASCADE_TRACE_INTERVAL": "0", **(env or {})}  # fmt: skip
    subprocess.run([sys.executable, "-m", "cascade_repro.child.bootstrap", "script.py"], cwd=tmp_path,
                   env=environ, check=True, timeout=120, capture_output=True)  # fmt: skip
    return dict(json.loads((run_dir / "child.json").read_text()))


def test_framework_seed_functions_are_hooked_when_imported_and_recorded_as_one_call(tmp_path: Path) -> None:
    facts = _run_child(tmp_path, SCRIPT)
    assert facts["determinism"]["script_seeds"] == [
        {"function": "lightning.fabric.utilities.seed.seed_everything", "seed": 42,
         "generators": ["numpy", "python"], "step": None},
        {"function": "lightning.fabric.utilities.seed.seed_everything", "seed": 3,
         "generators": ["numpy", "python"], "step": None},
        {"function": "transformers.trainer_utils.set_seed", "seed": 7, "generators": ["numpy", "python"],
         "step": None},
        {"function": "random.seed", "seed": "'text seed'", "generators": ["python"], "step": None},
        {"function": "numpy.random.seed", "seed": 11, "generators": ["numpy"], "step": None},
    ]  # fmt: skip
    # cascade's own seeding is not the script's
    assert facts["determinism"]["applied"]["random.seed"] == 5


def test_a_script_that_reseeds_every_step_keeps_a_bounded_record(tmp_path: Path) -> None:
    facts = _run_child(tmp_path, "import random\nfor i in range(100):\n    random.seed(i)\n")
    seeds = facts["determinism"]
    assert len(seeds["script_seeds"]) == 32 and seeds["script_seeds"][-1]["seed"] == 31
    assert seeds["script_seeds_omitted"] == 68


LOADER_GENERATORS = """\
import torch

data = torch.utils.data.TensorDataset(torch.arange(12.0))
unseeded = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator())
plain = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
own = torch.Generator()
by_sampler = torch.utils.data.DataLoader(data, sampler=torch.utils.data.RandomSampler(data, generator=own))
for epoch in range(3):
    own.manual_seed(10 + epoch // 2)  # the same seed for epochs 0 and 1: recorded once
    for loader in (unseeded, plain, by_sampler):
        list(loader)
"""


def test_a_dataloaders_own_generator_is_recorded_when_its_seed_is_not_the_default(tmp_path: Path) -> None:
    # with the step trace off: the generators are the seeds' hook's, not the tracer's
    facts = _run_child(tmp_path, LOADER_GENERATORS)
    assert facts["determinism"]["script_seeds"] == [
        {"function": "torch.Generator", "seed": 10, "generators": ["DataLoader"], "step": None},
        {"function": "torch.Generator", "seed": 11, "generators": ["DataLoader"], "step": None},
    ]


def test_the_child_imports_no_framework_and_no_numpy_itself(tmp_path: Path) -> None:
    facts = _run_child(
        tmp_path, "import sys\nassert 'numpy' not in sys.modules and 'torch' not in sys.modules\n"
    )
    assert facts["determinism"]["script_seeds"] == []


# -- the record: shape and comparison ------------------------------------------------------------


def _record(script_seed: int = 1337, seed: int = 1, **call: Any) -> dict[str, Any]:
    calls = [
        {"function": "torch.manual_seed", "seed": script_seed, "generators": ["torch"], "step": 0, **call},
        {"function": "random.seed", "seed": script_seed, "generators": ["python"], "step": 0},
    ]
    return {
        "schema": "cascade.run/1",
        "params": {"values": {}, "seed": seed},
        "determinism": {
            "mode": "warn",
            "applied": {"random.seed": seed, "torch.manual_seed": seed},
            "script_seeds": calls,
        },
    }


def _seed_changes(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    changes = compare_records(as_record(a), as_record(b), only=("seed",)).changes
    return {c.key: (c.klass, c.note) for c in changes}


def test_cascades_seed_is_not_a_cause_when_the_scripts_seeds_are_equal_and_in_force() -> None:
    changes = _seed_changes(_record(seed=1), _record(seed=2))
    assert changes == {"seed": ("C", "the script seeds torch and random itself: this seed had no effect")}
    assert script_seeds.overridden(_record()["determinism"]) == ["torch", "python"]


def test_cascades_seed_is_a_cause_where_the_script_does_not_hold_every_generator() -> None:
    # drawn from before the script seeded it: cascade's seed decided those draws
    assert _seed_changes(
        _record(seed=1, drawn_before=["torch"]), _record(seed=2, drawn_before=["torch"])
    ) == {"seed": ("B", None)}
    # seeded only from step 3 on: steps 0-2 ran on cascade's seed
    assert _seed_changes(_record(seed=1, step=3), _record(seed=2, step=3))["seed"] == ("B", None)
    a, b = _record(seed=1), _record(seed=2)
    for record in (a, b):  # numpy was imported too, and the script left it alone
        record["determinism"]["applied"]["numpy.random.seed"] = record["params"]["seed"]
    assert _seed_changes(a, b)["seed"] == ("B", None)
    old = _record(seed=2)
    del old["determinism"]["script_seeds"]  # a record made before script seeds were recorded
    assert _seed_changes(_record(seed=1), old) == {"seed": ("B", None)}


def test_other_script_seeds_are_a_cause_of_their_own() -> None:
    changes = _seed_changes(_record(script_seed=1), _record(script_seed=2))
    assert changes == {"script_seeds": ("B", None)}
    from cascade_repro.determinism.explain import manifest_differences

    (difference,) = manifest_differences(as_record(_record(script_seed=1)), as_record(_record(script_seed=2)))
    assert difference.kind == "seed"
    assert difference.summary == (
        "the script's seeds torch.manual_seed(1), random.seed(1) → torch.manual_seed(2), random.seed(2)"
    )


@pytest.mark.parametrize(
    "bad",
    [
        "not a list",
        [{"function": "random.seed"}] * 65,
        [{"function": 3, "seed": 1, "generators": [], "step": None}],
        [{"function": "random.seed", "seed": [1], "generators": [], "step": None}],
        [{"function": "random.seed", "seed": "x" * 201, "generators": [], "step": None}],
        [{"function": "random.seed", "seed": 2**200, "generators": [], "step": None}],
        [{"function": "random.seed", "seed": 1, "generators": "python", "step": None}],
        [{"function": "random.seed", "seed": 1, "generators": ["python"], "step": -1}],
        [
            {
                "function": "random.seed",
                "seed": 1,
                "generators": ["python"],
                "step": 0,
                "drawn_before": "torch",
            }
        ],
    ],
)
def test_malformed_script_seeds_are_refused(bad: Any) -> None:
    record = copy.deepcopy(_record())
    record["determinism"]["script_seeds"] = bad
    with pytest.raises(CascadeError, match="determinism.script_seeds"):
        check_shape(record)


def test_well_formed_script_seeds_pass() -> None:
    check_shape(_record(drawn_before=["torch"]))
    record = _record()
    record["determinism"]["script_seeds_omitted"] = 4
    check_shape(record)
    record["determinism"]["script_seeds_omitted"] = -1
    with pytest.raises(CascadeError, match="determinism.script_seeds_omitted"):
        check_shape(record)


def test_only_rng_states_differing_over_the_whole_trace_is_not_a_divergence() -> None:
    def step(k: int, python: str = "p") -> dict[str, Any]:
        loss = {"bits": k, "value": float(k), "dtype": "float32"}
        return {
            "step": k,
            "rng": {"torch": f"t{k}", "python": python},
            "loss": loss,
            "params_after": {"w": f"w{k}"},
        }

    a = [step(k) for k in range(3)]
    b = [step(k, python="other") for k in range(3)]
    record = {"run_id": "a", "trace": {"algorithm": "xxh3_64", "interval": 1}}
    verdict = judge(as_record(record), as_record({**record, "run_id": "b"}), a, b)
    assert verdict.verdict == "BITWISE_IDENTICAL" and verdict.comparison.step is None
    assert verdict.comparison.notes[0].startswith("the RNG state of python differs (first at step 0)")
    b[2]["params_after"] = {"w": "changed"}  # the generator did reach training: diverged where it shows first
    verdict = judge(as_record(record), as_record({**record, "run_id": "b"}), a, b)
    assert verdict.verdict == "DIVERGED" and verdict.comparison.step == 0
    assert verdict.comparison.facets() == ["rng"]
