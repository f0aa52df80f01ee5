"""YAML input: aliases counted as written out, recursive aliases and binary files named with the line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cascade_repro.errors import ConfigError
from cascade_repro.yaml_io import MAX_YAML_CHARS, MAX_YAML_NODES, parse_yaml, read_yaml_mapping


def laughs(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs": each level a list of `width` aliases of the one before (width**levels)."""
    lines = [f"l0: &l0 [{','.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_before_it_is_built(tmp_path: Path) -> None:
    path = tmp_path / "hyperparameters.yaml"
    path.write_text(laughs())
    assert len(path.read_bytes()) < 400  # 9**9 = 387 million values from a few hundred bytes
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        read_yaml_mapping(path)
    assert time.monotonic() - started < 10  # (a loaded machine; the bomb itself takes minutes)
    message = str(info.value)
    assert f"{path}:" in message and f"more than {MAX_YAML_NODES:,} values" in message
    assert "aliases" in message and "hint:" in message


def test_long_text_repeated_by_aliases_is_refused() -> None:
    text = 'a: &a "' + "x" * 1000 + '"\n' + "b: &b [" + ", ".join(["*a"] * 40) + "]\n"
    text += "c: [" + ", ".join(["*b"] * 40) + "]\n"  # 1,600 copies of 1,000 characters
    with pytest.raises(ConfigError, match=f"more than {MAX_YAML_CHARS:,} characters"):
        parse_yaml(text, "p.yaml")


def test_aliases_within_the_limits_still_work() -> None:
    data = parse_yaml("base: &b {lr: 0.1, betas: [0.9, 0.99]}\nrun: {<<: *b, lr: 0.2}\ncopy: *b\n")
    assert data == {
        "base": {"lr": 0.1, "betas": [0.9, 0.99]},
        "run": {"lr": 0.2, "betas": [0.9, 0.99]},
        "copy": {"lr": 0.1, "betas": [0.9, 0.99]},
    }
    assert len(parse_yaml(laughs(levels=3, width=9), "p.yaml")["l2"]) == 9  # 9**3 values: fine


@pytest.mark.parametrize(
    ("text", "line", "anchor"),
    [("a: &a [*a]\n", 1, "&a"), ("x: 1\nb: &b {c: [1, *b]}\n", 2, "&b"), ("- &s [&t [*s]]\n", 1, "&s")],
)
def test_recursive_alias_names_file_line_anchor(tmp_path: Path, text: str, line: int, anchor: str) -> None:
    path = tmp_path / "cascade.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_yaml_mapping(path) if text[0] != "-" else parse_yaml(text, str(path))
    assert f"{path}:{line}: {anchor} contains itself" in str(info.value)


def test_binary_file_names_file_and_line(tmp_path: Path) -> None:
    png = tmp_path / "hyperparameters.yaml"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(ConfigError, match=rf"{png}:1: not UTF-8 text \(byte 0x89 at offset 0\)"):
        read_yaml_mapping(png)
    nul = tmp_path / "cascade.yaml"
    nul.write_bytes(b"a: 1\nb: 2\x00\x01\n")
    with pytest.raises(ConfigError, match=rf"{nul}:2: character U\+0000 is not allowed in YAML"):
        read_yaml_mapping(nul)


def test_too_deep_nesting_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_yaml("a: " + "[" * 5000 + "]" * 5000, "p.yaml")
