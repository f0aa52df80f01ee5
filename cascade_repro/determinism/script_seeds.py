"""What the seeds a script set itself mean for cascade's: which generators the run's seed still governs.

A record's `determinism.script_seeds` lists the script's own seeding calls (child/script_seeds.py) and
`determinism.applied` the generators cascade seeded. The script's seed is *in force* for a generator
when the script set it before step 0's RNG fingerprint was read (`step` 0, or null without a trace)
and nothing had drawn from that generator since cascade seeded it (`drawn_before`): cascade's seed
then decided nothing about it. Pure: a record's `determinism` section in, generator names and
words out.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

GENERATORS = ("torch", "python", "numpy")  # in the order they are named
CASCADE_SEEDED = {"torch.manual_seed": "torch", "random.seed": "python", "numpy.random.seed": "numpy"}
WORDS = {"python": "random"}  # what a user calls Python's generator


def calls(determinism: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The script's seeding calls; None for a record made before they were recorded (or `current`)."""
    found = determinism.get("script_seeds")
    return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else None


def seeded_by_cascade(determinism: Mapping[str, Any]) -> list[str]:
    applied = determinism.get("applied") or {}
    seeded = {generator for key, generator in CASCADE_SEEDED.items() if key in applied}
    return [g for g in GENERATORS if g in seeded]


def overridden(determinism: Mapping[str, Any]) -> list[str]:
    """The generators cascade seeded whose seed in force at step 0 is the script's."""
    out = []
    for generator in seeded_by_cascade(determinism):
        first = next((c for c in calls(determinism) or [] if generator in (c.get("generators") or [])), None)
        if (
            first is not None
            and first.get("step") in (None, 0)
            and generator not in (first.get("drawn_before") or [])
        ):
            out.append(generator)
    return out


def still_governed(determinism: Mapping[str, Any]) -> list[str]:
    """The generators cascade seeded that its seed still decided (the script did not take them over)."""
    taken = overridden(determinism)
    return [g for g in seeded_by_cascade(determinism) if g not in taken]


def had_no_effect(determinism: Mapping[str, Any]) -> bool:
    """cascade's seed decided nothing: the script's own seeds were in force for every generator."""
    return bool(overridden(determinism)) and not still_governed(determinism)


def described(determinism: Mapping[str, Any], only: Sequence[str] = ()) -> list[str]:
    """`torch.manual_seed(1337)`, `random.seed(7) in step 5`, ...: the calls (those that set `only`)."""
    out = []
    for call in calls(determinism) or []:
        if only and not set(only) & set(call.get("generators") or []):
            continue
        step = call.get("step")
        out.append(f"{call.get('function')}({call.get('seed')})" + (f" in step {step}" if step else ""))
    omitted = determinism.get("script_seeds_omitted")
    if omitted and not only:
        out.append(f"{omitted} more")
    return out


def words(generators: Sequence[str]) -> str:
    """`torch, random and numpy`."""
    names = [WORDS.get(g, g) for g in generators]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
