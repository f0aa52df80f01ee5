"""Why two runs differ: the record comparison summed up per cause, and causes ranked by the trace.

The record differences are those of the one comparator (`record_compare`), which `cascade diff`
shows too. Class A differences make bitwise equality impossible (another torch build, CPU
capability, GPU); class B differences should never exist in a faithful rerun and are likely root
causes (params, seed, code, flags, threads, environment). The trace adds what the records cannot
know, and its first divergent facet says which of them come first: the RNG already differing at
step 0 implicates the seed before a learning rate that only acts later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from cascade_repro.determinism import script_seeds
from cascade_repro.determinism.compare import FACET_WORDS, TraceComparison
from cascade_repro.determinism.record_compare import Change, compare_records
from cascade_repro.manifest import Manifest
from cascade_repro.redaction import is_redacted

# The order differences are listed in (class B, then class A), and causes where the trace says nothing.
KINDS = (
    "params", "seed", "code", "command", "determinism", "threads", "environment", "environment_read",
    "data", "packages", "image", "torch", "gpu", "cpu", "python", "world_size", "nnodes",
)  # fmt: skip
_NONDETERMINISM = ("nondeterministic_ops", "nondeterministic", "determinism", "threads", "torch", "cpu",
                   "gpu", "python", "environment", "packages", "image")  # fmt: skip
# What the first divergent facet implicates, most likely first: kinds of record differences and of
# causes read from the trace. Kinds not named rank after these, in their usual order.
IMPLICATED: dict[str, tuple[str, ...]] = {
    # the RNG differs before any batch or weight: what seeds it (or a generator only one side has)
    # (data that differs may change what is drawn before step 0: a vocabulary, so a model's shape)
    "rng": ("installed_in_one", "seed", "unseeded", "code", "command", "data", "environment_read", "secrets",
            "environment", "packages", "image"),
    # the same RNG, another batch: the data, then what orders it (seeded workers, the loader's code)
    # (a variable the script read that differs is more specific than the trace's "the data differs")
    "batch": ("data", "world_size", "seed", "environment_read", "outside", "batch", "code", "command",
              "params", "secrets", "environment"),
    # the first weights differ: what builds and initializes the model
    "params_before": ("seed", "code", "command", "params", "data", "environment_read", "outside", "secrets",
                      "environment", "packages"),
    # the same batch and weights give another loss or gradient: nondeterministic computation
    # (first what the script read that differs: a variable, a data file; then a file no record holds)
    "loss": ("environment_read", "data", "outside", *_NONDETERMINISM, "code", "command", "params",
             "secrets"),
    "grads": ("environment_read", "data", "outside", *_NONDETERMINISM, "code", "command", "params",
              "secrets"),
    # only the weights after the step: the update itself (an optimizer param), or a write outside it
    "params_after": ("params", "environment_read", "secrets", "outside_write", "code", "command",
                     "determinism", "nondeterministic_ops", "threads", "environment"),
}  # fmt: skip
_INPUTS = {"seed", "code", "params", "command"}  # differences that explain any divergence by themselves


@dataclass(frozen=True)
class Difference:
    """One cause-sized difference of two records: all changes of one kind, summed up."""

    kind: str  # one of KINDS
    klass: str  # "A" or "B"
    summary: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "class": self.klass, "summary": self.summary}


@dataclass(frozen=True)
class Cause:
    summary: str
    evidence: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {"summary": self.summary, "evidence": self.evidence, "fix": self.fix}


def manifest_differences(a: Manifest, b: Manifest) -> list[Difference]:
    """The class A and B changes of `compare_records(a, b)`, one `Difference` per kind."""
    by_kind: dict[str, list[Change]] = {}
    for change in compare_records(a, b).changes:
        if change.klass in ("A", "B"):
            by_kind.setdefault(change.kind, []).append(change)
    out = []
    for kind in sorted(by_kind, key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS)):
        changes = by_kind[kind]
        summary = _SUMMARIES.get(kind, _generic)(changes, a, b)
        out.append(Difference(kind, min(c.klass for c in changes), summary))
    return out


def likely_causes(
    a: Manifest, b: Manifest, comparison: TraceComparison, differences: list[Difference]
) -> list[Cause]:
    """Most likely first: ranked by what the first divergent facet implicates (`IMPLICATED`)."""
    kinds = {d.kind for d in differences}
    step = comparison.step
    facets = comparison.facets() if step is not None else []
    first = facets[0] if facets else None
    fixes = {
        "params": "rerun with the recorded params (cascade restore does), or accept the change as intended",
        "seed": _seed_fix(a, b),
        "code": "rerun the recorded commit and patch (cascade restore materializes them)",
        "command": "pass the same script arguments",
        "determinism": _determinism_fix(a, differences),
        "threads": "pin the thread count (OMP_NUM_THREADS / torch.set_num_threads) to the recorded value",
        "environment": "export the recorded values of those variables (cascade restore sets them)",
        "environment_read": "export the recorded values of those variables (cascade restore sets them)",
        "data": _data_fix(a, b),
        "packages": "install the recorded versions (cascade restore --docker reuses the recorded image)",
        "image": "run in the recorded image: cascade restore --docker",
    }
    candidates: list[tuple[str, Cause]] = [
        (d.kind, Cause(d.summary, "the two run records differ", fixes[d.kind]))
        for d in differences
        if d.klass == "B"
    ]
    if first is not None:
        candidates += _from_the_trace(a, b, comparison, first, kinds)
    candidates += _secrets(a, b, step)
    candidates += _read_outside(a, b, step)
    candidates += _nondeterministic_ops(a, b)
    across = "compare within tolerance (--rtol/--atol), or rerun where the record was made"
    fixes_a = {"world_size": f"rerun with the recorded number of processes: cascade run --nproc-per-node "
                             f"{a.world_size} (cascade restore does)",
               "nnodes": f"rerun on {a.nnodes} nodes: cascade run --nnodes {a.nnodes} --rdzv-endpoint "
                         "HOST:PORT on each (cascade restore runs every rank on one machine)"}  # fmt: skip
    candidates += [
        (d.kind, Cause(d.summary, "bitwise equality is not expected across this difference",
                       fixes_a.get(d.kind, across)))
        for d in differences
        if d.klass == "A"
    ]  # fmt: skip
    if first is not None:
        order = IMPLICATED[first]
        ranked = sorted(enumerate(candidates), key=lambda ic: (_rank(order, ic[1][0]), ic[0]))
        candidates = [candidate for _, candidate in ranked]
    return [cause for _, cause in candidates]


def _rank(order: Sequence[str], kind: str) -> int:
    return order.index(kind) if kind in order else len(order)


def _from_the_trace(a: Manifest, b: Manifest, comparison: TraceComparison, first: str,
                    kinds: set[str]) -> list[tuple[str, Cause]]:  # fmt: skip
    """Causes the trace shows where the records are silent on them."""
    step, facets = comparison.step, comparison.facets()
    names = comparison.differences[0].names
    out: list[tuple[str, Cause]] = []
    missing = _installed_in_one(a, b, names) if first == "rng" else []
    if missing:
        out.append(("installed_in_one", Cause(
            f"{', '.join(missing)} is installed in only one of the two environments",
            f"the RNG state of {', '.join(missing)} exists in one trace only: cascade seeds and fingerprints "
            "a generator only where its library is installed",
            "install the same packages in both (a lock file for the image, or cascade restore --docker)",
        )))  # fmt: skip
    elif first == "rng" and not kinds & {*_INPUTS, "data"}:
        out.append(("unseeded", Cause(
            f"unseeded randomness: the RNG state ({', '.join(names)}) already differs at step {step}",
            f"{FACET_WORDS['rng']} differs before any batch or weight",
            "seed every generator (cascade run seeds by default; do not pass --seed random or reseed from "
            "the clock in the script)",
        )))  # fmt: skip
    if first == "batch" and not kinds & {*_INPUTS, "data"}:
        out.append(("batch", Cause(
            f"the data differs at step {step}: order or content of the batch",
            "the batch fingerprint differs while the RNG state is equal",
            "check the data files (DVC md5s) and DataLoader worker seeding",
        )))  # fmt: skip
    # (a variable the script read or a data file that differs explains it without nondeterminism)
    if first in ("loss", "grads") and not kinds & {*_INPUTS, *_NONDETERMINISM, "environment_read", "data"}:
        other = "a different loss" if first == "loss" else "different gradients"
        bracket = comparison.bracket_start
        # a batch the trace never fingerprinted (no DataLoader) is not evidence of anything
        batched = not any(note.startswith("batches are not compared") for note in comparison.notes)
        inputs = "the RNG state, the batch" if batched else "the RNG state"
        evidence = f"{inputs} and the weights the optimizer updates were equal before the step" \
            if bracket is None else (
            f"{inputs} {'are' if batched else 'is'} equal at step {step}; the weights were last compared "
            f"(equal) before step {bracket}: `cascade verify --replay` compares them at every step between")
        where = f"at step {step}"
        if bracket is not None:
            where += f", or at a step from {bracket} on, where the weights were not compared"
        out.append(("nondeterministic", Cause(
            f"nondeterministic computation: the same {'batch and ' if batched else ''}weights gave {other} "
            + where,
            evidence,
            "rerun with --deterministic strict (it stops at an op without a deterministic implementation) "
            "and pin the thread count; if it still differs, look for what the trace does not see: input "
            "drawn from the clock or os.urandom, weights the optimizer does not update (frozen layers, "
            "buffers) written between steps",
        )))  # fmt: skip
    if facets == ["params_after"] and not kinds & _INPUTS:
        grads_hashed = all(m.trace_header.get("grads", True) for m in (a, b))
        out.append(("outside_write", Cause(
            f"a write outside the optimizer changed {', '.join(names[:3])} after step {step} (a hook, an "
            "EMA, an in-place edit), or nondeterministic code between steps"
            + ("" if grads_hashed else ", or a nondeterministic backward or optimizer step"),
            "loss and gradients are equal at that step; only the weights after it differ"
            if grads_hashed
            else "the loss is equal at that step and the weights after it differ; gradients were not "
            "hashed (trace_grads: auto skips them on CPU for models over 1 MiB)",
            "look for code that writes parameters between optimizer steps"
            + ("" if grads_hashed else "; set trace_grads: true in cascade.yaml to tell the two apart"),
        )))  # fmt: skip
    return out


def _secrets(a: Manifest, b: Manifest, step: int | None) -> list[tuple[str, Cause]]:
    read_a, read_b = a.variables_read, b.variables_read
    both = {**read_a, **read_b}
    secrets = sorted(k for k in both if is_redacted(read_a.get(k)) or is_redacted(read_b.get(k)))
    if step is None or not secrets:
        return []
    return [("secrets", Cause(
        "the script read secret-looking variables whose values are not recorded: " + ", ".join(secrets[:5]),
        "their names are recorded, their values are redacted, so neither verify nor restore can compare or "
        "set them",
        "make sure they hold the same values for both runs, or pass such settings as params",
    ))]  # fmt: skip


def _read_outside(a: Manifest, b: Manifest, step: int | None) -> list[tuple[str, Cause]]:
    """Files a run read outside the repository: named in its record, never hashed, so they may differ."""
    paths: dict[str, None] = {}
    for manifest in (a, b):
        far = manifest.outcome.get("read_outside")
        for path in (far.get("paths") if isinstance(far, dict) else None) or []:
            if isinstance(path, str):
                paths[path] = None
    if step is None or not paths:
        return []
    return [("outside", Cause(
        "the script read files outside the repository that no record holds: " + _listed(list(paths), 3),
        "their names are recorded, not their contents: they may differ between the runs",
        "keep the data inside the repository (`dvc add` it) or compare those files by hand",
    ))]  # fmt: skip


def _nondeterministic_ops(a: Manifest, b: Manifest) -> list[tuple[str, Cause]]:
    for manifest in (a, b):
        ops = manifest.determinism.get("nondeterministic_ops")
        if ops:
            return [("nondeterministic_ops", Cause(
                f"nondeterministic ops ran: {', '.join(ops[:5])}",
                "torch reported them under use_deterministic_algorithms(warn_only=True)",
                "rerun with --deterministic strict to find where they are called, and replace them",
            ))]  # fmt: skip
    return []


# -- one summary per kind of difference ---------------------------------------------------------
Summary = Callable[[list[Change], Manifest, Manifest], str]


def _pairs(changes: list[Change], limit: int, key: Callable[[Change], str] = lambda c: c.key,
           shown: Callable[[Any], str] = lambda v: "—" if v is None else str(v)) -> str:  # fmt: skip
    return _listed([f"{key(c)} {shown(c.a)} → {shown(c.b)}" for c in changes], limit)


def _generic(changes: list[Change], a: Manifest, b: Manifest) -> str:
    return f"{changes[0].kind} differs: " + _pairs(changes, 6)


def _seed(changes: list[Change], a: Manifest, b: Manifest) -> str:
    def shown(value: Any) -> str:
        return "none" if value is None else str(value)

    return "; ".join(
        f"the script's seeds {shown(c.a)} → {shown(c.b)}"
        if c.key == "script_seeds"
        else f"seed {c.a} → {c.b}"
        for c in changes
    )


def _data_fix(a: Manifest, b: Manifest) -> str:
    """Where the data differs: DVC's data is checked out; files neither git nor DVC tracks are put
    back as the run read them (a copy only where --track-inputs kept one)."""
    fixes = []
    if dict(a.data_objects) != dict(b.data_objects):
        fixes.append("check out the recorded data (dvc checkout at the recorded commit; cascade restore "
                     "does)")  # fmt: skip
    if {i.path: i.sha256 for i in a.inputs} != {i.path: i.sha256 for i in b.inputs}:
        fixes.append("put back the files neither git nor DVC tracks as the run read them (their sha256 is "
                     "in the record; cascade restore puts them back where the run had --track-inputs), "
                     "then track them: dvc add, or cascade run --track-inputs")  # fmt: skip
    return "; ".join(fixes) or "check out the recorded data (cascade restore does)"


def _seed_fix(a: Manifest, b: Manifest) -> str:
    fix = "rerun with the recorded seed: --seed " + str(a.seed)
    if script_seeds.described(a.determinism) == script_seeds.described(b.determinism):
        return fix
    own = "the script sets its own seeds: give it the recorded ones (its code or arguments decide them)"
    return own if script_seeds.had_no_effect(a.determinism) else f"{fix}; {own}"


def _code(changes: list[Change], a: Manifest, b: Manifest) -> str:
    parts = [f"commit {str(c.a)[:12]} → {str(c.b)[:12]}" for c in changes if c.key == "commit"]
    if any(c.key != "commit" for c in changes):
        parts.append("uncommitted changes differ (patch or untracked files)")
    return "; ".join(parts)


def _command(changes: list[Change], a: Manifest, b: Manifest) -> str:
    return f"command differs: {a.command.get('argv')} → {b.command.get('argv')}"


def _determinism(changes: list[Change], a: Manifest, b: Manifest) -> str:
    parts = [f"determinism mode {c.a} → {c.b}" for c in changes if c.key == "determinism.mode"]
    flags = [c.key.removeprefix("flags.") for c in changes if c.key.startswith("flags.")]
    if flags:
        parts.append("flags differ: " + ", ".join(flags))
    scripts = [c for c in changes if c.key.startswith("script_flags.")]
    if scripts:
        def shown(value: Any) -> str:  # (a run whose script left the flag as it was: none)
            return "as at the start" if value is None else str(value)

        names = lambda c: c.key.removeprefix("script_flags.")  # noqa: E731
        parts.append("the script set torch flags: " + _pairs(scripts, 4, key=names, shown=shown))
    return "; ".join(parts)


def _determinism_fix(a: Manifest, differences: list[Difference]) -> str:
    fix = f"rerun with --deterministic {_mode(a)} and the same flags"
    if any("the script set torch flags" in d.summary for d in differences if d.kind == "determinism"):
        fix += ("; the script sets them itself (torch.set_float32_matmul_precision, torch.backends...): "
                "its code or what it read decides them")  # fmt: skip
    return fix


def _threads(changes: list[Change], a: Manifest, b: Manifest) -> str:
    words = {"torch.num_threads": "torch threads", "torch.num_interop_threads": "torch interop threads"}
    return "; ".join(f"{words.get(c.key, c.key)} {c.a} → {c.b}" for c in changes)


def _packages(changes: list[Change], a: Manifest, b: Manifest) -> str:
    changed = [c for c in changes if c.note is None]
    only_a = [c.key for c in changes if c.note == "removed"]
    only_b = [c.key for c in changes if c.note == "added"]
    parts = [_pairs(changed, 6)] if changed else []
    for which, names in (("first", only_a), ("second", only_b)):
        if names:
            parts.append(f"{len(names)} only in the {which} ({_listed(names, 4)})")
    return "packages differ: " + "; ".join(parts)


def _image(changes: list[Change], a: Manifest, b: Manifest) -> str:
    def image(manifest: Manifest) -> str:
        return manifest.container.image_id or manifest.container.image or "none (not in Docker)"

    return f"image {image(a)} → {image(b)}"


def _environment_read(changes: list[Change], a: Manifest, b: Manifest) -> str:
    listed = _pairs(changes, 5, key=lambda c: c.key.removeprefix("read:"), shown=_shown)
    return f"the script read environment variables that differ: {listed}"


def _torch(changes: list[Change], a: Manifest, b: Manifest) -> str:
    listed = _pairs(changes, 11, key=lambda c: c.key.removeprefix("torch."), shown=str)
    return f"torch stack differs: {listed}"


def _one_line(word: str) -> Summary:
    def shown(value: Any) -> str:
        return "none" if value is None or value == [] else str(value)

    return lambda changes, a, b: "; ".join(f"{word} {shown(c.a)} → {shown(c.b)}" for c in changes)


_SUMMARIES: dict[str, Summary] = {
    "params": lambda changes, a, b: "params differ: " + _pairs(changes, 6),
    "seed": _seed,
    "code": _code,
    "command": _command,
    "determinism": _determinism,
    "threads": _threads,
    "environment": lambda changes, a, b: "environment differs: " + _pairs(changes, 5, shown=_shown),
    "environment_read": _environment_read,
    "data": lambda changes, a, b: "data differs: " + _pairs(changes, 4, shown=lambda v: str(v or "none")[:8]),
    "packages": _packages,
    "image": _image,
    "torch": _torch,
    "gpu": _one_line("GPUs"),
    "cpu": _one_line("CPU"),
    "python": _one_line("Python"),
    "world_size": lambda changes, a, b: f"world size differs: {a.world_size} processes vs {b.world_size}",
    "nnodes": lambda changes, a, b: f"node count differs: {a.nnodes} nodes vs {b.nnodes}",
}


def _listed(items: list[str], limit: int) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _installed_in_one(a: Manifest, b: Manifest, streams: Any) -> list[str]:
    """RNG streams named after a package (numpy) that only one of the two environments has."""
    pa, pb = a.python.packages, b.python.packages
    if not pa or not pb:
        return []
    return [s for s in streams if s not in ("torch", "python", "cuda") and (s in pa) != (s in pb)]


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value)


def _mode(manifest: Manifest) -> str:
    return str(manifest.determinism.get("mode"))
