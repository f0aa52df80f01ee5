from __future__ import annotations

from pathlib import Path

import pytest

from cascade_repro.errors import ConfigError, UsageError
from cascade_repro.params import MAX_PARAMS, SEED_RANGE, find_params_file, flatten, resolve_params


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


def test_aliased_mappings_past_the_param_limit_are_refused(tmp_path: Path) -> None:
    # 475 bytes of mapping aliases once logged 27,900 params: 10 * 10 * 10 * 10 = 10,000 keys here.
    lines = ["k0: &k0 {" + ", ".join(f"a{i}: {i}" for i in range(10)) + "}"]
    for level in range(1, 4):
        lines.append(f"k{level}: &k{level} {{" + ", ".join(f"b{i}: *k{level - 1}" for i in range(10)) + "}")
    path = tmp_path / "hyperparameters.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert len(path.read_bytes()) < 500
    with pytest.raises(ConfigError) as info:
        resolve_params(path, tmp_path)
    message = f"{path} holds 11,110 params (flattened keys); cascade takes at most {MAX_PARAMS:,}"
    assert message in str(info.value)


def test_the_param_limit_is_inclusive(tmp_path: Path) -> None:
    path = tmp_path / "hyperparameters.yaml"
    path.write_text("".join(f"p{i}: {i}\n" for i in range(MAX_PARAMS)))
    assert len(resolve_params(path, tmp_path).values) == MAX_PARAMS
    with pytest.raises(UsageError, match=f"--set/--add make {MAX_PARAMS + 1:,} params"):
        resolve_params(path, tmp_path, adds=["one=more"])


def test_alias_bombs_and_recursive_aliases_in_overrides_are_usage_errors(params_file: Path) -> None:
    # One flow value: each level a list of an anchored list and 9 aliases of it (10**6 values).
    nested = "&l0 [x,x,x,x,x,x,x,x,x,x]"
    for level in range(1, 6):
        nested = f"[{nested}," + ",".join([f"*l{level - 1}"] * 9) + "]"
        nested = f"&l{level} {nested}" if level < 5 else nested
    with pytest.raises(UsageError, match=r"--set epochs \(&l4\): more than 100,000 values once its aliases"):
        resolve_params(params_file, params_file.parent, sets=[f"epochs={nested}"])
    with pytest.raises(UsageError, match=r"--add loop: &a contains itself"):
        resolve_params(params_file, params_file.parent, adds=["loop=&a [*a]"])


@pytest.mark.parametrize("seed", ["99999999999999999999999", "-1", str(2**64)])
def test_seed_option_out_of_range_is_a_usage_error(params_file: Path, seed: str) -> None:
    expected = rf"--seed {seed} is out of range; expected an integer from 0 to {SEED_RANGE[1]}"
    with pytest.raises(UsageError, match=expected):
        resolve_params(params_file, params_file.parent, seed=seed)


def test_seed_range_ends_are_accepted(params_file: Path) -> None:
    assert SEED_RANGE == (0, 2**64 - 1)
    for seed in SEED_RANGE:
        assert resolve_params(params_file, params_file.parent, seed=str(seed)).seed == seed


@pytest.mark.parametrize("value", ["99999999999999999999999", "-3", "true", "1.5", "abc"])
def test_seed_in_the_file_out_of_range_names_the_file(tmp_path: Path, value: str) -> None:
    path = tmp_path / "hyperparameters.yaml"
    path.write_text(f"seed: {value}\n")
    with pytest.raises(ConfigError, match=rf"{path}: seed is .*; expected an integer from 0 to {2**64 - 1}"):
        resolve_params(path, tmp_path)
    with pytest.raises(UsageError, match=r"--set seed is -1; expected an integer from 0"):
        resolve_params(path, tmp_path, sets=["seed=-1"])
    assert resolve_params(path, tmp_path, seed="4").seed == 4  # --seed wins over the file


def test_keys_become_the_strings_the_script_sees(tmp_path: Path) -> None:
    path = tmp_path / "hyperparameters.yaml"
    path.write_text("layers: {1: 64, all: 3, 2.5: x, null: y, false: z}\n")
    assert resolve_params(path, tmp_path).values == {
        "layers": {"1": 64, "all": 3, "2.5": "x", "null": "y", "false": "z"}
    }
    path.write_text("layers: {1: 64, '1': 32}\n")
    with pytest.raises(ConfigError, match="keys 1 and '1' are both '1' to the script"):
        resolve_params(path, tmp_path)


def test_set_keeps_the_files_kind_where_the_text_allows_it(params_file: Path) -> None:
    resolved = resolve_params(
        params_file, params_file.parent,
        sets=["optimizer.lr=1", "name=2024", "optimizer.betas=!!str none", "epochs=null"],
    )  # fmt: skip
    assert resolved.values["optimizer"]["lr"] == 1.0 and isinstance(resolved.values["optimizer"]["lr"], float)
    assert resolved.values["epochs"] is None  # null: unset, whatever the kind
    assert resolved.values["name"] == "2024"  # a string param takes the text typed
    whole = resolve_params(params_file, params_file.parent, sets=["epochs=1e1"]).values["epochs"]
    assert whole == 10 and isinstance(whole, int)
    assert resolved.values["optimizer"]["betas"] == "none"  # a YAML tag forces the kind


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("optimizer.lr=abc", "optimizer.lr is a float in hyperparameters.yaml (0.1), and 'abc' is a string"),
        ("optimizer=3", "optimizer is a mapping in hyperparameters.yaml"),
        ("epochs=2.5", "epochs is an integer in hyperparameters.yaml (3), and '2.5' is a float"),
        ("optimizer.betas=0.9", "optimizer.betas is a list in hyperparameters.yaml ([0.9, 0.99])"),
        ("name={a: 1}", "name is a string in hyperparameters.yaml (\"base\"), and '{a: 1}' is a mapping"),
        ("optimizer.lr=[1,", "'[1,' is not valid YAML"),
        ("name={a: 1", "'{a: 1' is not valid YAML"),
    ],
)  # fmt: skip
def test_set_refuses_a_change_of_kind(params_file: Path, override: str, said: str) -> None:
    with pytest.raises(UsageError) as info:
        resolve_params(params_file, params_file.parent, sets=[override])
    assert said in info.value.message
    assert info.value.hint is not None


def test_add_refuses_a_key_the_file_has(params_file: Path) -> None:
    with pytest.raises(UsageError, match=r"--add optimizer.lr: optimizer.lr is already in hyperparameters"):
        resolve_params(params_file, params_file.parent, adds=["optimizer.lr=0.5"])
