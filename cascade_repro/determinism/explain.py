"""Why two runs differ: manifest differences by fingerprint class, and ranked likely causes.

Class A differences make bitwise equality impossible (another torch build, CPU capability, GPU);
class B differences should never exist in a faithful rerun and are likely root causes (params,
seed, code, flags, threads, environment). The trace adds what the manifests cannot know (e.g.
the RNG already differs at step 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from cascade_repro.determinism.compare import FACET_WORDS, TraceComparison
from cascade_repro.params import flatten
from cascade_repro.redaction import is_redacted

CLASS_A_TORCH = (
    "version",
    "git_version",
    "cuda",
    "cudnn",
    "nccl",
    "hip",
    "cpu_capability",
    "mkl_version",
    "onednn_version",
)
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTHONHASHSEED",
    "ATEN_CPU_CAPABILITY",
)


@dataclass(frozen=True)
class Difference:
    kind: str  # params seed code determinism threads environment command packages image torch gpu cpu
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


def manifest_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    out: list[Difference] = []
    pa, pb = flatten(a.get("params", {}).get("values", {})), flatten(b.get("params", {}).get("values", {}))
    changed = sorted(k for k in set(pa) | set(pb) if k != "seed" and pa.get(k) != pb.get(k))
    if changed:
        listed = ", ".join(f"{k} {pa.get(k, '—')} → {pb.get(k, '—')}" for k in changed[:6])
        out.append(Difference("params", "B", f"params differ: {listed}"))
    sa, sb = a.get("params", {}).get("seed"), b.get("params", {}).get("seed")
    if sa != sb:
        out.append(Difference("seed", "B", f"seed {sa} → {sb}"))
    ga, gb = a.get("git", {}), b.get("git", {})
    if ga.get("commit") != gb.get("commit"):
        out.append(
            Difference("code", "B", f"commit {str(ga.get('commit'))[:12]} → {str(gb.get('commit'))[:12]}")
        )
    if _patch(ga) != _patch(gb) or _untracked(ga) != _untracked(gb):
        out.append(Difference("code", "B", "uncommitted changes differ (patch or untracked files)"))
    ca, cb = a.get("command", {}), b.get("command", {})
    if (ca.get("script"), ca.get("argv")) != (cb.get("script"), cb.get("argv")):
        out.append(Difference("command", "B", f"command differs: {ca.get('argv')} → {cb.get('argv')}"))
    da, db = a.get("determinism", {}), b.get("determinism", {})
    if da.get("mode") != db.get("mode"):
        out.append(Difference("determinism", "B", f"determinism mode {da.get('mode')} → {db.get('mode')}"))
    fa, fb = da.get("flags_at_start", {}), db.get("flags_at_start", {})
    flags = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
    if flags:
        out.append(Difference("determinism", "B", "flags differ: " + ", ".join(flags)))
    ta, tb = a.get("torch", {}), b.get("torch", {})
    if ta.get("num_threads") != tb.get("num_threads"):
        out.append(
            Difference("threads", "B", f"torch threads {ta.get('num_threads')} → {tb.get('num_threads')}")
        )
    ea, eb = a.get("environment", {}), b.get("environment", {})
    env = sorted(
        k
        for k in set(ea) | set(eb)
        if k in THREAD_VARS or k.startswith(("NCCL_", "TORCH", "CUDA_"))
        if ea.get(k) != eb.get(k)
    )
    if env:
        out.append(Difference("environment", "B", "environment differs: " + ", ".join(env)))
    ra, rb = a.get("environment_read") or {}, b.get("environment_read") or {}
    read = sorted(k for k in set(ra) & set(rb) if ra[k] != rb[k])
    if read:
        listed = ", ".join(f"{k} {_shown(ra[k])} → {_shown(rb[k])}" for k in read[:5])
        out.append(
            Difference("environment", "B", f"the script read environment variables that differ: {listed}")
        )
    changed, only_a, only_b = _package_changes(a.get("python") or {}, b.get("python") or {})
    if changed or only_a or only_b:
        parts = [_listed(changed, 6)] if changed else []
        for which, names in (("first", only_a), ("second", only_b)):
            if names:
                parts.append(f"{len(names)} only in the {which} ({_listed(names, 4)})")
        out.append(Difference("packages", "B", "packages differ: " + "; ".join(parts)))
    ia, ib = _image(a), _image(b)
    if ia != ib:
        none = "none (not in Docker)"
        out.append(Difference("image", "B", f"image {ia or none} → {ib or none}"))
    torch_changed = [k for k in CLASS_A_TORCH if ta.get(k) != tb.get(k) and (ta.get(k) or tb.get(k))]
    if torch_changed:
        listed = ", ".join(f"{k} {ta.get(k)} → {tb.get(k)}" for k in torch_changed)
        out.append(Difference("torch", "A", f"torch stack differs: {listed}"))
    gpus_a, gpus_b = _gpus(a), _gpus(b)
    if gpus_a != gpus_b:
        out.append(Difference("gpu", "A", f"GPUs {gpus_a or 'none'} → {gpus_b or 'none'}"))
    cpu_a = a.get("hardware", {}).get("cpu", {}).get("model")
    cpu_b = b.get("hardware", {}).get("cpu", {}).get("model")
    if cpu_a != cpu_b:
        out.append(Difference("cpu", "A", f"CPU {cpu_a} → {cpu_b}"))
    return out


def likely_causes(
    a: Mapping[str, Any], b: Mapping[str, Any], comparison: TraceComparison, differences: list[Difference]
) -> list[Cause]:
    """Most likely first: what differs in the record, then what the trace itself shows."""
    causes: list[Cause] = []
    kinds = {d.kind for d in differences}
    step = comparison.step
    fixes = {
        "params": "rerun with the recorded params (cascade restore does), or accept the change as intended",
        "seed": "rerun with the recorded seed: --seed " + str(a.get("params", {}).get("seed")),
        "code": "rerun the recorded commit and patch (cascade restore materializes them)",
        "command": "pass the same script arguments",
        "determinism": f"rerun with --deterministic {_mode(a)} and the same flags",
        "threads": "pin the thread count (OMP_NUM_THREADS / torch.set_num_threads) to the recorded value",
        "environment": "export the recorded values of those variables",
        "packages": "install the recorded versions (cascade restore --docker reuses the recorded image)",
        "image": "run in the recorded image: cascade restore --docker",
    }
    for difference in differences:
        if difference.klass == "B":
            causes.append(Cause(difference.summary, "the two run records differ", fixes[difference.kind]))
    facets = comparison.facets()
    missing = _installed_in_one(a, b, comparison.differences[0].names) if step is not None and facets else []
    if step is not None and facets and facets[0] == "rng" and missing:
        causes.insert(0, Cause(
            f"{', '.join(missing)} is installed in only one of the two environments",
            f"the RNG state of {', '.join(missing)} exists in one trace only: cascade seeds and fingerprints "
            "a generator only where its library is installed",
            "install the same packages in both (a lock file for the image, or cascade restore --docker)",
        ))  # fmt: skip
    elif step is not None and facets and facets[0] == "rng" and not kinds & {"seed", "code", "params"}:
        streams = ", ".join(comparison.differences[0].names)
        causes.append(
            Cause(
                f"unseeded randomness: the RNG state ({streams}) already differs at step {step}",
                f"{FACET_WORDS['rng']} differs before any batch or weight",
                "seed every generator (cascade run seeds by default; do not pass --seed random or reseed "
                "from "
                "the clock in the script)",
            )
        )
    if step is not None and facets and facets[0] == "batch" and not kinds & {"seed", "code", "params"}:
        causes.append(
            Cause(
                f"the data differs at step {step}: order or content of the batch",
                "the batch fingerprint differs while the RNG state is equal",
                "check the data files (DVC md5s) and DataLoader worker seeding",
            )
        )
    if step is not None and facets == ["params_after"] and not kinds & {"seed", "code", "params", "command"}:
        names = ", ".join(comparison.differences[0].names[:3])
        grads_hashed = all((m.get("trace") or {}).get("grads", True) for m in (a, b))
        causes.append(
            Cause(
                f"a write outside the optimizer changed {names} after step {step} (a hook, an EMA, an "
                "in-place edit), or nondeterministic code between steps"
                + ("" if grads_hashed else ", or a nondeterministic backward or optimizer step"),
                "loss and gradients are equal at that step; only the weights after it differ"
                if grads_hashed
                else "the loss is equal at that step and the weights after it differ; gradients were not "
                "hashed (trace_grads: auto skips them on CPU for models over 1 MiB)",
                "look for code that writes parameters between optimizer steps"
                + ("" if grads_hashed else "; set trace_grads: true in cascade.yaml to tell the two apart"),
            )
        )
    read_a, read_b = a.get("environment_read") or {}, b.get("environment_read") or {}
    secrets = sorted(
        k for k in {**read_a, **read_b} if is_redacted(read_a.get(k)) or is_redacted(read_b.get(k))
    )
    if step is not None and secrets:
        causes.append(
            Cause(
                "the script read secret-looking variables whose values are not recorded: "
                + ", ".join(secrets[:5]),
                "their names are recorded, their values are redacted, so neither verify nor restore can "
                "compare or set them",
                "make sure they hold the same values for both runs, or pass such settings as params",
            )
        )
    for ops in (
        a.get("determinism", {}).get("nondeterministic_ops"),
        b.get("determinism", {}).get("nondeterministic_ops"),
    ):
        if ops:
            causes.append(
                Cause(
                    f"nondeterministic ops ran: {', '.join(ops[:5])}",
                    "torch reported them under use_deterministic_algorithms(warn_only=True)",
                    "rerun with --deterministic strict to find where they are called, and replace them",
                )
            )
            break
    for difference in differences:
        if difference.klass == "A":
            causes.append(
                Cause(
                    difference.summary,
                    "bitwise equality is not expected across this difference",
                    "compare within tolerance (--rtol/--atol), or rerun where the record was made",
                )
            )
    return causes


def _package_changes(pa: Mapping[str, Any], pb: Mapping[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """Versions that changed (`name a → b`), and names installed only in the first / only in the second.

    torch is class A (see the torch section) and cascade itself is not a cause.
    """
    a, b = pa.get("packages") or {}, pb.get("packages") or {}
    if not a or not b:
        return [], [], []  # a record without a package list cannot say what changed
    ignored = {"cascade-repro", "torch", "pip", "setuptools", "wheel"}
    both = sorted((set(a) & set(b)) - ignored)
    changed = [f"{n} {a[n].get('version')} → {b[n].get('version')}" for n in both
               if a[n].get("version") != b[n].get("version")]  # fmt: skip
    return changed, sorted(set(a) - set(b) - ignored), sorted(set(b) - set(a) - ignored)


def _listed(items: list[str], limit: int) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _installed_in_one(a: Mapping[str, Any], b: Mapping[str, Any], streams: Any) -> list[str]:
    """RNG streams named after a package (numpy) that only one of the two environments has."""
    pa = (a.get("python") or {}).get("packages") or {}
    pb = (b.get("python") or {}).get("packages") or {}
    if not pa or not pb:
        return []
    return [s for s in streams if s not in ("torch", "python", "cuda") and (s in pa) != (s in pb)]


def _image(manifest: Mapping[str, Any]) -> str | None:
    container = manifest.get("container") or {}
    return str(container.get("image_id") or container.get("image") or "") or None


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value)


def _mode(manifest: Mapping[str, Any]) -> str:
    return str(manifest.get("determinism", {}).get("mode"))


def _patch(git: Mapping[str, Any]) -> Any:
    return (git.get("patch") or {}).get("sha256")


def _untracked(git: Mapping[str, Any]) -> Any:
    return sorted((u.get("path"), u.get("sha256")) for u in git.get("untracked") or [])


def _gpus(manifest: Mapping[str, Any]) -> list[str]:
    gpus = manifest.get("torch", {}).get("gpus") or manifest.get("hardware", {}).get("gpus") or []
    return [str(g.get("name")) for g in gpus] if isinstance(gpus, list) else []
