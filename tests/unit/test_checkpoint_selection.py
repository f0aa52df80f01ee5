"""Top-k pruning in the child and checkpoint selection for checkout (pure logic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cascade_repro.checkout import choose_checkpoint, select_checkpoint
from cascade_repro.child.checkpoints import Policy, _Saved, _to_prune
from cascade_repro.errors import DataError, UnsafeRecord, UsageError
from cascade_repro.manifest import Manifest
from cascade_repro.record_sections import CheckpointEntry, DataEntry


def _saved(values: list[float | None]) -> list[_Saved]:
    return [_Saved(Path(f"s{i}.pt"), i, v) for i, v in enumerate(values)]


def test_top_k_keeps_the_best_and_the_last() -> None:
    saved = _saved([5, 3, 4, 1, 2, 6])
    pruned = _to_prune(saved, Policy(monitor="val_loss", mode="min", save_top_k=3, save_last=True))
    assert sorted(s.step for s in pruned) == [0, 2]
    pruned = _to_prune(saved, Policy(monitor="val_loss", mode="max", save_top_k=2, save_last=False))
    assert sorted(s.step for s in pruned) == [1, 2, 3, 4]  # 6 (step 5) and 5 (step 0) stay


def test_nothing_is_pruned_without_a_metric_or_with_top_k_minus_one() -> None:
    assert _to_prune(_saved([1, None, 3, 4]), Policy(monitor="val_loss", save_top_k=1)) == []
    assert _to_prune(_saved([1, 2, 3, 4]), Policy(monitor="val_loss", save_top_k=-1)) == []
    assert _to_prune(_saved([1, 2, 3, 4]), Policy(monitor=None, save_top_k=1)) == []


def _ckpt(step: int, loss: float | None, status: str = "kept", path: str | None = None) -> CheckpointEntry:
    entry: dict[str, Any] = {
        "step": step,
        "status": status,
        "md5": f"m{step}",
        "path": path or f"c/s{step}.pt",
    }
    if loss is not None:
        entry.update(metrics={"val_loss": loss}, monitor="val_loss", mode="min")
    return CheckpointEntry(entry)


def test_select_best_last_step_and_path() -> None:
    entries = [_ckpt(1, 0.5), _ckpt(2, 0.2), _ckpt(3, 0.1, status="pruned"), _ckpt(4, 0.9)]
    assert select_checkpoint(entries, "best").step == 2  # the pruned 0.1 is gone
    assert select_checkpoint(entries, "last").step == 4
    assert select_checkpoint(entries, "1").step == 1
    assert select_checkpoint(entries, "c/s4.pt").step == 4
    assert select_checkpoint(entries, "s2.pt").step == 2
    with pytest.raises(UsageError, match="no kept checkpoint matches '3'"):
        select_checkpoint(entries, "3")


def test_a_path_saved_many_times_is_chosen_by_md5_and_a_save_before_step_0_is_named() -> None:
    """Found on nanoGPT: a resumed run saves ckpt.pt at its first eval, before any optimizer step
    (step null), then again; by path the later one came back, by md5 none ("no kept checkpoint
    matches"), and the hint printed "(step None)"."""
    saved = {"path": "out/ckpt.pt", "status": "kept"}
    early = CheckpointEntry({**saved, "step": None, "md5": "50c8aff4899f" + "0" * 20})
    later = CheckpointEntry({**saved, "step": 9, "md5": "ebd446e1aa00" + "1" * 20})
    assert select_checkpoint([early, later], "out/ckpt.pt") is later  # a path: its last version
    assert select_checkpoint([early, later], "50c8aff4899f") is early  # as `show --checkpoints` prints it
    assert choose_checkpoint([early, later], "50c8aff4").why == "md5 50c8aff4899f"
    with pytest.raises(UsageError) as refused:
        select_checkpoint([early, later], "deadbeef")
    assert "out/ckpt.pt (before step 0, md5 50c8aff4899f)" in str(refused.value.hint)
    assert "None" not in str(refused.value.hint)
    twin = CheckpointEntry({**saved, "step": 10, "md5": "50c8af00" + "2" * 24})
    with pytest.raises(UsageError, match="the start of the md5 of 2 checkpoints"):
        select_checkpoint([early, later, twin], "50c8af")  # never one of them by chance


def test_best_needs_a_monitored_metric_and_no_kept_checkpoint_is_an_error() -> None:
    with pytest.raises(UsageError, match="none is 'best'"):
        select_checkpoint([_ckpt(1, None)], "best")
    with pytest.raises(DataError, match=r"no kept checkpoint .* \(1 were pruned\)"):
        select_checkpoint([_ckpt(1, 0.3, status="pruned")], "best")


def test_data_objects_are_the_bytes_the_run_read() -> None:
    data = [
        {"path": "a.bin", "md5": "committed", "matches": True},
        {"path": "b.bin", "md5": "committed", "matches": False, "workspace_md5": "dirty"},
        {"path": "c.bin", "md5": "committed", "matches": False, "note": "missing"},
        {"path": "dir", "md5": "x.dir", "matches": True},  # `dvc add DIR`: its .dir object, expanded
        {"path": "mod", "md5": "y.dir", "matches": False, "workspace_md5": "z.dir"},
        {"path": "old", "md5": "w.dir", "matches": False, "note": "not restorable: a modified directory"},
    ]
    assert Manifest("r", "e", data=DataEntry.each(data)).data_objects == [
        ("a.bin", "committed"),
        ("b.bin", "dirty"),
        ("dir", "x.dir"),
        ("mod", "z.dir"),
    ]


def test_checkout_never_writes_outside_its_base(tmp_path: Path) -> None:
    from cascade_repro.checkout import Fetched, deliver

    base, outside = tmp_path / "base", tmp_path / "outside"
    base.mkdir()
    outside.mkdir()
    obj = tmp_path / "object"
    obj.write_bytes(b"12345")
    fetched = Fetched("data/x.bin", "827ccb0eea8a706c4c34a16891f84e7b", 5, "local cache", obj)
    assert deliver(fetched, base, "data/x.bin", force=False).written_to == (base / "data" / "x.bin").resolve()
    assert (base / "data" / "x.bin").read_bytes() == b"12345"
    (base / "link").symlink_to(outside)
    for bad in ("../x.bin", "data/../../x.bin", "/etc/passwd", "link/x.bin"):
        with pytest.raises(UnsafeRecord, match="leads out of|through the symlink"):
            deliver(fetched, base, bad, force=False)
    assert list(outside.iterdir()) == []


def test_the_default_is_the_best_when_monitored_else_the_last_and_says_why() -> None:
    monitored = [_ckpt(1, 0.5), _ckpt(2, 0.2), _ckpt(4, 0.9)]
    chosen = choose_checkpoint(monitored, None)
    assert chosen.entry.step == 2 and chosen.why == "best by val_loss"
    plain = [_ckpt(1, None), _ckpt(4, None), _ckpt(2, None)]
    chosen = choose_checkpoint(plain, None)
    assert chosen.entry.step == 4 and chosen.why == "last: no metric monitored"
    assert choose_checkpoint(plain, "last").why == "last"
    assert choose_checkpoint(plain, "2").why == "step 2"
    with pytest.raises(UsageError, match="none is 'best'"):  # asked for by name: still refused
        choose_checkpoint(plain, "best")


def test_a_directory_listing_from_a_shared_remote_cannot_lead_out(tmp_path: Path) -> None:
    """A `.dir` object names files by relative path; one that climbs out or names a non-md5 is refused."""
    import hashlib
    import json
    import subprocess
    import sys

    from cascade_repro.store.dvc_store import Cache

    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    cache = Cache(tmp_path)

    def stored(listing: Any) -> str:
        data = json.dumps(listing).encode()
        md5 = hashlib.md5(data).hexdigest() + ".dir"
        cache.object_path(md5).parent.mkdir(parents=True, exist_ok=True)
        cache.object_path(md5).write_bytes(data)
        return md5

    try:
        for listing in ([{"md5": "0" * 32, "relpath": "../../x"}], [{"md5": "../y", "relpath": "a"}],
                        [{"md5": "0" * 32, "relpath": "/etc/passwd"}], {"not": "a list"}):  # fmt: skip
            with pytest.raises(UnsafeRecord):
                cache.directory_entries(stored(listing))
        good = stored([{"md5": "a" * 32, "relpath": "sub/model.safetensors"}])
        assert cache.directory_entries(good) == [("sub/model.safetensors", "a" * 32)]
    finally:
        cache.close()


def test_a_checkpoint_pruned_while_it_is_hashed_is_gone_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning's top-k deletes a checkpoint it saved moments before: deleted while the parent hashed
    it, it raised FileNotFoundError, shown as a warning at the run's end, where `show --checkpoints`
    listed it as pruned. (The deletion is made to fall inside the hashing: its timing cannot be.)"""
    import subprocess
    import sys

    from cascade_repro.store import dvc_store

    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    checkpoint = tmp_path / "epoch=0-step=8.ckpt"
    checkpoint.write_bytes(b"weights" * 1000)
    hashing = dvc_store.md5_of

    def pruned_meanwhile(path: Path) -> Any:
        result = hashing(path)
        checkpoint.unlink()
        return result

    monkeypatch.setattr(dvc_store, "md5_of", pruned_meanwhile)
    cache = dvc_store.Cache(tmp_path)
    try:
        assert cache.add(checkpoint, hardlink=True) is None
    finally:
        cache.close()


def test_the_not_cached_warning_names_each_path_once() -> None:
    """Found on word_language_model (model.pt saved every epoch): the warning read "model.pt, model.pt"."""
    from cascade_repro.store.checkpoint_keeper import CheckpointEntry, _not_cached

    reason = "no DVC repository (run `cascade init`)"

    def not_cached(path: str, step: int) -> CheckpointEntry:
        return CheckpointEntry(path, step, {}, "torch.save", status="not_cached", reason=reason)

    assert _not_cached([not_cached("model.pt", 1), not_cached("model.pt", 2)]) == [
        f"checkpoints not in the DVC cache: model.pt ({reason})"
    ]
    many = [not_cached(f"ck{s}.pt", s) for s in range(5)]
    (warning,) = _not_cached(many)
    assert warning == f"checkpoints not in the DVC cache: ck0.pt, ck1.pt, ck2.pt and 2 more ({reason})"
    assert _not_cached([CheckpointEntry("kept.pt", 1, {}, "torch.save")]) == []


def test_a_directory_checkpoint_without_dvc_has_the_size_of_its_files(tmp_path: Path) -> None:
    """Found on HF Trainer without `cascade init`: every checkpoint-N/ was listed at 4.0 KB, the size
    of the directory itself (its files held 383 KB)."""
    import json
    import os

    from cascade_repro.store.checkpoint_keeper import CheckpointKeeper

    saved = tmp_path / "out" / "checkpoint-8"
    (saved / "sub").mkdir(parents=True)
    (saved / "model.safetensors").write_bytes(bytes(300_000))
    (saved / "sub" / "optimizer.pt").write_bytes(bytes(83_000))
    announced = {"event": "saved", "path": str(saved), "step": 8, "size": os.stat(saved).st_size}
    events = tmp_path / "run" / "checkpoints.jsonl"
    events.parent.mkdir()
    events.write_text(json.dumps(announced) + "\n")
    (entry,) = CheckpointKeeper(tmp_path, events, cache=None).stop()
    assert (entry.status, entry.size, entry.files) == ("not_cached", 383_000, 2)
