"""The suite's plugin: a capability marker skips in one place, saying why; helpers come from it."""

from __future__ import annotations

import pytest

from tests import capabilities


def test_a_missing_capability_skips_with_its_reason(pytester: pytest.Pytester,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setitem(capabilities.CAPABILITIES, "requires_docker",
                        ("a Docker engine answers", lambda: "no engine here (test)"))  # fmt: skip
    monkeypatch.setitem(capabilities.CAPABILITIES, "requires_root", ("root", lambda: None))
    capabilities.missing.cache_clear()
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.requires_docker
        def test_needs_docker():
            raise AssertionError("must not run")

        @pytest.mark.requires_root
        def test_needs_root():
            pass

        def test_plain(project):
            assert (project.root / "train.py").is_file()
        """
    )
    try:
        result = pytester.runpytest("-p", "tests.plugin", "-rs", "--strict-markers")
    finally:
        capabilities.missing.cache_clear()
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*no engine here (test)*"])


def test_every_capability_probe_answers_none_or_a_reason() -> None:
    for name in capabilities.CAPABILITIES:
        if name == "requires_cuda":
            continue  # importing torch here costs seconds; the GPU suite's marker runs it
        reason = capabilities.missing(name)
        assert reason is None or (isinstance(reason, str) and reason), name
