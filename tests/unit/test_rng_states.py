"""The generators' states a trace record holds (child/step_values.RngStates): read the fast way
between training steps, they give the fingerprints the plain reads give, so records made before and
after agree."""

from __future__ import annotations

import array
import random
import sys

import numpy
import pytest
import torch

from cascade_repro.child import step_values
from cascade_repro.determinism import fingerprint


def plain(others: bool) -> dict[str, str]:
    """The fingerprints as `torch.get_rng_state`, `random.getstate` and `numpy.random.get_state` give them."""
    out = {"torch": fingerprint.cpu_hash(torch.get_rng_state())}
    if others:
        _, internal, gauss_next = random.getstate()
        out["python"] = step_values.combine([array.array("Q", internal).tobytes(), repr(gauss_next).encode()])
        out["numpy"] = step_values.numpy_state(numpy)
    return out


def hashed(states: dict[str, object]) -> dict[str, str]:
    return {name: step_values.rng_hash(state) for name, state in states.items()}


def test_the_states_read_between_steps_hash_to_the_plain_reads_fingerprints() -> None:
    reader = step_values.RngStates(torch)
    seen = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        random.seed(seed)
        numpy.random.seed(seed)
        for _ in range(3):
            kept = reader(others=True)
            assert hashed(kept) == plain(others=True)
            seen.append(hashed(kept))
            torch.rand(7)
            numpy.random.rand(5)  # numpy's position moves, and past the key's end it is refilled
            numpy.random.bytes(4000)
            random.random()
            assert hashed(reader(others=False)) == plain(others=False)
    assert len({s["torch"] for s in seen}) == len({s["numpy"] for s in seen}) == len(seen)
    assert reader._numpy is not None  # numpy's state was read from its memory, not get_state


def test_a_state_kept_for_the_flush_is_the_one_at_its_read() -> None:
    reader = step_values.RngStates(torch)
    torch.manual_seed(3)
    expected = plain(others=False)
    kept = reader(others=False)
    torch.rand(100)  # the generator moves on before the record is written
    assert hashed(kept) == expected != plain(others=False)


def test_numpy_read_through_memory_that_disagrees_with_get_state_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = numpy.random.MT19937(12345)  # another generator's memory: its key is not the global one's
    wrong = (numpy, step_values._numpy_bit_generator(numpy), int(other.ctypes.state_address))
    monkeypatch.setattr(step_values, "_numpy_memory", lambda np: wrong)
    reader = step_values.RngStates(torch)
    numpy.random.seed(5)
    for _ in range(3):
        assert reader(others=True)["numpy"] == step_values.numpy_state(numpy)
        numpy.random.rand(3)
    assert reader._numpy is None


def test_a_script_without_numpy_has_no_numpy_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "numpy")
    assert set(step_values.RngStates(torch)(others=True)) == {"torch", "python"}
