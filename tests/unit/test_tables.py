"""One owner for paths and variables (issue 16): the sources name cascade's variables and project paths
only through settings' tables (and the child's protocol), read here with `ast` from every module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cascade_repro.child import protocol
from cascade_repro.settings import OWN_DIR, SETTINGS_VARIABLES, VARIABLES, ProjectPaths
from tests.sources import modules

VARIABLE = re.compile(r"CASCADE_[A-Z0-9_]*")
PREFIXES = ("CASCADE_", "CASCADE_SECRET_")  # filters on a family, not a variable of their own


def _strings(skip: tuple[str, ...] = ()) -> list[tuple[str, int, str]]:
    """(module, line, value) of every string constant in the package's modules."""
    return [
        (rel, n.lineno, n.value)
        for rel, text in modules(skip)
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _protocol_variables() -> set[str]:
    return {value for name, value in vars(protocol).items() if name.startswith("ENV_")}


def test_every_cascade_variable_is_in_a_table() -> None:
    documented = {name for name in VARIABLES if "<" not in name} | _protocol_variables()
    unknown, found = [], []
    for rel, line, text in _strings():
        if not VARIABLE.fullmatch(text):
            continue
        found.append(text)
        if text not in documented | set(PREFIXES) and not text.startswith("CASCADE_SECRET_"):
            unknown.append(f"{rel}:{line}: {text}")
    assert unknown == []
    assert len(found) > 10, "the reader found hardly any CASCADE_ variable"


def test_user_variables_and_the_child_protocol_overlap_only_where_said() -> None:
    """The child's protocol is not a user setting; CASCADE_DETERMINISM alone is both (settings says why)."""
    assert set(VARIABLES) & _protocol_variables() == {"CASCADE_DETERMINISM"}
    assert set(SETTINGS_VARIABLES) <= set(VARIABLES)


def test_project_paths_are_built_only_by_the_table() -> None:
    spelled = [
        f"{rel}:{line}: {text!r}"
        for rel, line, text in _strings(skip=("settings.py",))
        if text == OWN_DIR or text.startswith(OWN_DIR + "/")
    ]
    assert spelled == []


def test_the_path_table_keeps_everything_under_the_ignored_directory(tmp_path: Path) -> None:
    paths = ProjectPaths(tmp_path)
    properties = [name for name, value in vars(ProjectPaths).items() if isinstance(value, property)]
    assert len(properties) >= 8
    for name in properties:
        where = getattr(paths, name)
        assert where == paths.own or paths.own in where.parents, name
    assert paths.own == tmp_path / ".cascade"
