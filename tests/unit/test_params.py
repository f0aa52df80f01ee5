from __future__ import annotations

from pathlib import Path

import pytest

from cascade_repro.errors import ConfigError, UsageError
from cascade_repro.params import find_params_file, flatten, resolve_params


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    path = tmp_path / "hyperparameters.yaml"
    path.write_text("seed: 5\nepochs: 3\noptimizer:\n  lr: 0.1\n  betas: [0.9, 0.99]\nname: base\n")
    return path


def test_overrides_are_typed_as_yaml(params_file: Path) -> None:
    resolved = resolve_params(
        params_file, params_file.parent,
        sets=["optimizer.lr=1e-3", "epochs=10", "name=run 2", "optimizer.betas=[0.5, 0.6]"],
    )  # fmt: skip
    assert resolved.values["optimizer"]["lr"] == 0.001
    assert resolved.values["epochs"] == 10
    assert resolved.values["name"] == "run 2"
    assert resolved.values["optimizer"]["betas"] == [0.5, 0.6]
    assert resolved.overrides == {
        "optimizer.lr": 0.001,
        "epochs": 10,
        "name": "run 2",
        "optimizer.betas": [0.5, 0.6],
    }
    assert resolved.source == "hyperparameters.yaml"


def test_unknown_key_suggests_closest_and_add_creates(params_file: Path) -> None:
    with pytest.raises(UsageError, match=r"did you mean optimizer\.lr\?") as info:
        resolve_params(params_file, params_file.parent, sets=["optimizer.lrr=1"])
    assert "--add optimizer.lrr" in str(info.value)
    resolved = resolve_params(params_file, params_file.parent, adds=["scheduler.gamma=0.5"])
    assert resolved.values["scheduler"] == {"gamma": 0.5}


def test_add_below_a_scalar_is_refused(params_file: Path) -> None:
    with pytest.raises(UsageError, match="holds a int"):
        resolve_params(params_file, params_file.parent, adds=["epochs.inner=1"])


@pytest.mark.parametrize(("option", "seed", "source"), [(None, 5, "params"), ("9", 9, "option")])
def test_seed_sources(params_file: Path, option: str | None, seed: int, source: str) -> None:
    resolved = resolve_params(params_file, params_file.parent, seed=option)
    assert (resolved.seed, resolved.seed_source, resolved.values["seed"]) == (seed, source, seed)


def test_random_seed_is_recorded_and_default_is_zero(tmp_path: Path) -> None:
    first = resolve_params(None, tmp_path, seed="random")
    second = resolve_params(None, tmp_path, seed="random")
    assert first.seed_source == "random" and 0 <= first.seed < 2**31
    assert first.seed != second.seed or first.seed == second.seed == 0  # 1 in 2^31 to collide
    default = resolve_params(None, tmp_path)
    assert (default.seed, default.seed_source, default.values) == (0, "default", {})


def test_malformed_yaml_names_line(tmp_path: Path) -> None:
    bad = tmp_path / "hp.yaml"
    bad.write_text("a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(ConfigError, match=r"hp\.yaml:\d+"):
        resolve_params(bad, tmp_path)


def test_params_file_lookup_prefers_the_scripts_directory(tmp_path: Path) -> None:
    (tmp_path / "hyperparameters.yaml").write_text("a: 1\n")
    sub = tmp_path / "exp"
    sub.mkdir()
    script = sub / "train.py"
    script.write_text("")
    assert find_params_file(tmp_path, script, None, None) == tmp_path / "hyperparameters.yaml"
    (sub / "hyperparameters.yaml").write_text("a: 2\n")
    assert find_params_file(tmp_path, script, None, None) == sub / "hyperparameters.yaml"
    with pytest.raises(UsageError, match="params file not found"):
        find_params_file(tmp_path, script, str(tmp_path / "missing.yaml"), None)


def test_flatten() -> None:
    assert flatten({"a": {"b": 1, "c": {"d": [1]}}, "e": {}}) == {"a.b": 1, "a.c.d": [1], "e": {}}
