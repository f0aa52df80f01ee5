"""Fingerprints see every bit: ±0, NaN payloads, one ulp, dtype, shape and element order."""

from __future__ import annotations

import collections
import struct
from typing import Any

import pytest
import torch

from cascade_repro.determinism.fingerprint import InPlaceHashes, cpu_hash, device_checksums, fingerprints


def _nan(payload: int) -> torch.Tensor:
    value = struct.unpack("<f", struct.pack("<I", 0x7FC00000 | payload))[0]
    return torch.tensor([value], dtype=torch.float32)


def _both(t: torch.Tensor) -> tuple[str, str]:
    return cpu_hash(t), device_checksums(torch, [t])[0]


def _all_differ(*tensors: torch.Tensor) -> None:
    for index in range(2):  # CPU hash, then the on-device checksum run on the CPU
        values = [_both(t)[index] for t in tensors]
        assert len(set(values)) == len(values), values


def test_equal_bits_equal_fingerprints() -> None:
    x = torch.randn(7, 5)
    assert _both(x) == _both(x.clone())
    assert cpu_hash(x.t()) == cpu_hash(x.t().contiguous())


def test_signed_zeros_differ() -> None:
    _all_differ(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]))


def test_nan_payloads_differ() -> None:
    a, b = _nan(1), _nan(2)
    assert torch.isnan(a).all() and torch.isnan(b).all()
    _all_differ(a, b)


def test_one_ulp_differs() -> None:
    x = torch.randn(1000)
    y = x.clone()
    y[537] = torch.nextafter(y[537], torch.tensor(float("inf")))
    _all_differ(x, y)


def test_dtype_and_shape_are_part_of_the_fingerprint() -> None:
    x = torch.randn(4, 6)
    _all_differ(x, x.bfloat16().float(), x.reshape(6, 4), x.reshape(24))
    assert cpu_hash(x.bfloat16()) != cpu_hash(x.half())
    zeros = torch.zeros(8)
    _all_differ(zeros, zeros.bfloat16(), zeros.double())


def test_a_permutation_differs() -> None:
    x = torch.arange(64, dtype=torch.float32)
    _all_differ(x, x.flip(0), x[torch.randperm(64, generator=torch.Generator().manual_seed(1))])


@pytest.mark.parametrize(
    "dtype", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int64, torch.float64]
)
def test_every_dtype_is_fingerprinted(dtype: torch.dtype) -> None:
    x = (torch.arange(10) % 3).to(dtype)
    y = x.clone()
    y[4] = ~x[4] if dtype == torch.bool else x[4] + 1  # one element changed
    assert not torch.equal(x, y)
    _all_differ(x, y)


def test_fingerprints_route_by_device_and_keep_order() -> None:
    tensors = [torch.randn(3), torch.randn(4, 4), torch.zeros(0)]
    assert fingerprints(torch, tensors) == [cpu_hash(t) for t in tensors]


def test_a_tensor_changed_in_place_gets_a_new_fingerprint() -> None:
    # The trace keeps a view of each parameter's memory between steps (InPlaceHashes): the view must
    # read what is there now, and another layout over the same memory (a square transpose) or a
    # non-contiguous tensor must not reuse it.
    hashes = InPlaceHashes(torch)
    w = torch.arange(9, dtype=torch.float32).reshape(3, 3)
    before = hashes([w])[0]
    assert before == cpu_hash(w)
    w[1, 2] = torch.nextafter(w[1, 2], torch.tensor(100.0))
    after = hashes([w])[0]
    assert before != after and after == cpu_hash(w)
    transposed = w.t()
    assert transposed.data_ptr() == w.data_ptr() and transposed.shape == w.shape
    assert hashes([transposed])[0] == cpu_hash(transposed.contiguous()) != after
    column = w[:, 1]
    assert hashes([column])[0] == cpu_hash(column.contiguous()) == cpu_hash(column)


def test_in_place_hashes_equal_fingerprints_as_the_list_changes() -> None:
    # The same object serves the gradients, which are new tensors at new addresses after a
    # zero_grad(set_to_none=True), and lists that grow or shrink (a parameter without a gradient).
    hashes = InPlaceHashes(torch)
    tensors = [torch.randn(5), torch.randn(2, 3, dtype=torch.float64), torch.zeros(0), torch.randn(4)]
    assert hashes(tensors) == fingerprints(torch, tensors)
    replaced = [torch.randn(5), *tensors[1:]]  # position 0: another tensor, same layout
    assert hashes(replaced) == fingerprints(torch, replaced) != fingerprints(torch, tensors)
    view_as_int = tensors[3].view(torch.int32)  # same address and shape, another dtype
    assert hashes([*tensors[:3], view_as_int])[3] == cpu_hash(view_as_int) != cpu_hash(tensors[3])
    assert hashes(tensors[:2]) == fingerprints(torch, tensors[:2])
    del tensors[1]
    assert hashes(tensors) == fingerprints(torch, tensors)


def test_a_batch_is_fingerprinted_the_same_on_the_fast_path() -> None:
    """A flat list or tuple of CPU tensors (the usual batch) takes a shorter path between steps; its
    fingerprint is the one the general path (nested batches, any device) gives, position-sensitive."""
    from cascade_repro.child import step_values

    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    general = step_values.combine([h.encode() for h in fingerprints(torch, [x, y])])
    assert step_values.batch_fingerprint(torch, [x, y]) == general
    assert step_values.batch_fingerprint(torch, (x, y)) == general
    assert step_values.batch_fingerprint(torch, {"x": x, "y": y}) == general  # a dict: the general path
    # a mapping that is not a dict: HF's BatchEncoding (what DataCollatorWithPadding yields) is a UserDict
    assert step_values.batch_fingerprint(torch, collections.UserDict({"y": y, "x": x})) == general
    assert step_values.batch_fingerprint(torch, [y, x]) != general
    assert step_values.batch_fingerprint(torch, [x.t()]) == fingerprints(torch, [x.t().contiguous()])[0]
    assert step_values.batch_fingerprint(torch, []) is None
    # read in place, without detach(): a tensor that requires grad gives the same fingerprint
    assert step_values.batch_fingerprint(torch, [x.clone().requires_grad_(), y]) == general
    # parts of another length than 16 digits are combined the general way
    assert step_values.joined(["ab", "0123456789abcdef"]) == step_values.combine([b"ab", b"0123456789abcdef"])


def test_a_cpu_fingerprint_is_xxh3_over_dtype_shape_and_bytes() -> None:
    """The formula every recorded trace used: a faster path must give the same digits."""
    xxhash = pytest.importorskip("xxhash")

    def formula(t: torch.Tensor) -> str:
        dense = t.detach().contiguous()
        header = f"{dense.dtype}|{tuple(dense.shape)}|".encode()
        return str(xxhash.xxh3_64(header + dense.numpy().tobytes()).hexdigest())

    x = torch.randn(5, 7)
    for t in (x, x.t(), x.clone().requires_grad_(), torch.zeros(0, 3), torch.arange(10, dtype=torch.int64),
              torch.tensor(2.5, dtype=torch.float64), x[:, 1:4]):  # fmt: skip
        assert cpu_hash(t) == formula(t) == cpu_hash(t)  # (the second call: from the kept layout)


def test_kept_headers_follow_each_tensors_dtype_and_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    from cascade_repro.determinism import fingerprint

    monkeypatch.setattr(fingerprint, "_LAYOUTS_KEPT", 3)
    monkeypatch.setattr(fingerprint, "_LAYOUTS", {})
    zeros = [torch.zeros(n) for n in range(1, 8)] + [torch.zeros(2, dtype=torch.float64), torch.zeros(1, 2)]
    hashed = [cpu_hash(t) for t in zeros]
    assert len(set(hashed)) == len(zeros) and len(fingerprint._LAYOUTS) <= 3
    assert [cpu_hash(t) for t in zeros] == hashed


def test_sparse_tensors_are_fingerprinted_by_what_they_store() -> None:
    """A sparse batch or a sparse embedding's gradient has no strided memory to read: its fingerprint
    is over the tensors that hold it (indices, values), with its layout, dtype and shape."""
    dense = torch.zeros(6, 5)
    dense[1, 2], dense[4, 0] = 1.5, -2.0
    coo, csr = dense.to_sparse(), dense.to_sparse_csr()
    assert cpu_hash(coo) == cpu_hash(dense.to_sparse()) != cpu_hash(csr)  # the layout counts
    assert len({cpu_hash(coo), cpu_hash(csr), cpu_hash(dense)}) == 3
    moved = dense.clone()
    moved[4, 0] = torch.nextafter(torch.tensor(-2.0), torch.tensor(0.0))  # one ulp in one value
    assert cpu_hash(moved.to_sparse()) != cpu_hash(coo) and cpu_hash(moved.to_sparse_csr()) != cpu_hash(csr)
    wider = torch.zeros(6, 6)
    wider[1, 2], wider[4, 0] = 1.5, -2.0
    assert cpu_hash(wider.to_sparse()) != cpu_hash(coo)  # same entries, another shape
    hashes = InPlaceHashes(torch)  # a sparse gradient among the dense ones, step after step
    expected = [cpu_hash(dense), cpu_hash(coo), cpu_hash(csr)]
    assert hashes([dense, coo, csr]) == expected == hashes([dense, coo, csr])


def test_a_sparse_gradient_on_a_device_is_read_from_what_it_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an accelerator (here: CPU tensors routed to the device path) a sparse gradient has no
    strided memory for the device checksum: it is read from its indices and values, the other
    tensors in one call as before, whether the caller reads now or later."""
    from cascade_repro.determinism import fingerprint

    monkeypatch.setattr(fingerprint.InPlaceHashes, "in_place_device", "none")
    weight, bias = torch.randn(6, 4), torch.randn(4)
    grad = torch.zeros(6, 4)
    grad[2] = 0.5
    hashes = fingerprint.InPlaceHashes(torch)
    first = hashes([weight, grad.to_sparse(), bias])
    later = hashes.later([weight, grad.to_sparse(), bias])
    assert (later if isinstance(later, list) else fingerprint.settle(torch, [later])[0]) == first
    assert [first[0], first[2]] == fingerprint.device_checksums(torch, [weight, bias])
    grad[2, 1] = torch.nextafter(torch.tensor(0.5), torch.tensor(1.0))
    moved = hashes([weight, grad.to_sparse(), bias])
    assert moved[1] != first[1] and [moved[0], moved[2]] == [first[0], first[2]]
    with pytest.raises(RuntimeError):  # what is not about sparsity still fails as it did
        hashes([weight, torch.empty(3, device="meta")])


def test_a_sparse_batch_on_a_device_is_read_from_what_it_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch on an accelerator holding a sparse tensor (a graph's adjacency; here CPU tensors routed
    to the device path) stopped the trace: its sparse tensor is read from its indices and values, the
    dense ones left on the device as before; the general path gives the same fingerprint."""
    from cascade_repro.child import step_values
    from cascade_repro.determinism import fingerprint

    monkeypatch.setattr(fingerprint.InPlaceHashes, "in_place_device", "none")
    adjacency = torch.zeros(5, 5)
    adjacency[0, 3] = adjacency[3, 0] = 1.0
    features, labels = torch.randn(5, 8), torch.arange(5)
    kept: dict[Any, Any] = {}

    def read(*tensors: torch.Tensor) -> str:
        batch = {f"t{i}": t for i, t in enumerate(tensors)}  # (a flat list of CPU tensors is hashed on CPU)
        taken = step_values.batch_fingerprint(torch, batch, kept)
        assert isinstance(taken, fingerprint.Later)  # the dense ones wait on the device
        return step_values.joined(fingerprint.settle(torch, [taken])[0])

    first = read(features, adjacency.to_sparse(), labels)
    general = fingerprint.fingerprints(torch, [features, adjacency.to_sparse(), labels])
    assert first == step_values.joined(general) == read(features, adjacency.to_sparse(), labels)
    assert general[0] == fingerprint.device_checksums(torch, [features])[0]
    assert read(features, adjacency.to_sparse_csr(), labels) != first  # the layout counts
    adjacency[1, 2] = 1.0
    assert read(features, adjacency.to_sparse(), labels) != first
    with pytest.raises(RuntimeError):  # what is not about sparsity still fails as it did
        read(features, torch.empty(3, device="meta"))
