"""The plan's verdict as typed facts (:class:`VerdictFacts`: what the results JSON holds) and its one renderer
(:func:`render_verdict`: the Markdown sentence ``plan``'s display and the report both show)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oomlab.core.gpus import load_gpu
from oomlab.core.units import format_size
from oomlab.remedies.ladder import ALLOCATOR_ADVICE, Rung, rung_words
from oomlab.remedies.plan import Outcome, Plan


@dataclass(frozen=True)
class VerdictFacts:
    """Everything the verdict sentence says, as fields: the outcome, where, the margin, the fix and its rungs, the
    tight alternative, the host-RAM shortfall."""

    outcome: Outcome
    gpus_in_all: int
    gpu: str  # the GPU's name in oomlab's table
    margin: str  # the margin band in words ("" without a ladder decision)
    fix: str | None  # the recommended remedy's name
    fix_rungs: tuple[Rung, ...]  # the ladder's steps to it (() where the fix is not the ladder's)
    fix_is_first: bool  # the recommendation is row 1 of the shown table
    recommendation_note: str
    configured_tight: bool  # the run as configured fits only inside the margin
    tight_rungs: tuple[Rung, ...]  # the first rungs that fit inside the margin
    host_ram_short: int  # sound remedies that fit every GPU but not the host RAM
    host_ram_least: str | None  # the one of those needing the least host RAM
    host_ram_least_bytes: int
    host_ram_bytes: int
    host_ram_source: str

    @classmethod
    def of(cls, plan: Plan) -> VerdictFacts:
        d = plan.decision
        rec = plan.recommended or (plan.remedies[0] if plan.remedies else None)
        short = plan.host_ram_short if plan.outcome is Outcome.HOST_RAM else ()
        return cls(outcome=plan.outcome, gpus_in_all=plan.nodes * plan.gpus, gpu=plan.gpu,
                   margin=d.verdict.margin.words if d is not None else "",
                   fix=None if rec is None else rec.name,
                   fix_rungs=tuple(s.rung for s in d.steps) if d is not None and plan.fix is not None else (),
                   fix_is_first=bool(plan.shown) and rec is plan.shown[0],
                   recommendation_note=plan.recommendation_note,
                   configured_tight=d is not None and d.verdict.tight,
                   tight_rungs=tuple(s.rung for s in d.tight) if d is not None else (),
                   host_ram_short=len(short), host_ram_least=short[0].name if short else None,
                   host_ram_least_bytes=(short[0].host_ram_bytes or 0) if short else 0,
                   host_ram_bytes=plan.host_ram_bytes, host_ram_source=plan.host_ram_source)

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome.value, "gpus_in_all": self.gpus_in_all, "gpu": self.gpu, "margin": self.margin,
                "fix": self.fix, "fix_rungs": [r.value for r in self.fix_rungs], "fix_is_first": self.fix_is_first,
                "recommendation_note": self.recommendation_note, "configured_tight": self.configured_tight,
                "tight_rungs": [r.value for r in self.tight_rungs], "host_ram_short": self.host_ram_short,
                "host_ram_least": self.host_ram_least, "host_ram_least_bytes": self.host_ram_least_bytes,
                "host_ram_bytes": self.host_ram_bytes, "host_ram_source": self.host_ram_source}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> VerdictFacts:
        return cls(outcome=Outcome(raw["outcome"]), gpus_in_all=int(raw["gpus_in_all"]), gpu=raw["gpu"],
                   margin=raw["margin"], fix=raw["fix"], fix_rungs=tuple(Rung(r) for r in raw["fix_rungs"]),
                   fix_is_first=bool(raw["fix_is_first"]), recommendation_note=raw["recommendation_note"],
                   configured_tight=bool(raw["configured_tight"]),
                   tight_rungs=tuple(Rung(r) for r in raw["tight_rungs"]), host_ram_short=int(raw["host_ram_short"]),
                   host_ram_least=raw["host_ram_least"], host_ram_least_bytes=int(raw["host_ram_least_bytes"]),
                   host_ram_bytes=int(raw["host_ram_bytes"]), host_ram_source=raw["host_ram_source"])


def render_verdict(v: VerdictFacts) -> str:
    """The plan's outcome in one Markdown sentence, every figure from the facts: a fix, host RAM the only obstacle
    (never "nothing fits" then), only harmful changes, or nothing."""
    where = f"{v.gpus_in_all} × {load_gpu(v.gpu).display_name}"
    if v.outcome is Outcome.FITS:
        return f"**It fits as configured** on {where}" + (f", with the margin ({v.margin})." if v.margin else ".")
    if v.outcome is Outcome.FIXED:
        if v.fix_rungs:
            kinds = "; ".join(rung_words(r) for r in v.fix_rungs)
            return (f"**It fits with a change:** {v.fix} on {where}, with the margin — the least disruptive "
                    f"change that does: {kinds}.")
        why = "" if v.fix_is_first else f" ({v.recommendation_note})"
        return f"**It fits with a change:** {v.fix} on {where}{why}."
    if v.outcome is Outcome.TIGHT:
        what = ("as configured" if v.configured_tight or not v.tight_rungs else
                "with " + "; ".join(rung_words(r) for r in v.tight_rungs))
        return (f"**It fits {where} only inside the margin** ({what}): the estimate leaves less headroom than "
                f"this setup class needs ({v.margin}); nothing on the ladder fits with it. If you run it: "
                f"{ALLOCATOR_ADVICE}.")
    if v.outcome is Outcome.HOST_RAM:
        return (f"**It fits the GPUs but not the assumed host RAM — set `host_ram`.** {v.host_ram_short} "
                f"sound remedies fit every GPU of {where}, but need more host RAM than "
                f"{format_size(v.host_ram_bytes)} ({v.host_ram_source}); the least, {v.host_ram_least}, needs "
                f"{format_size(v.host_ram_least_bytes)} per node.")
    if v.outcome is Outcome.HARMFUL_ONLY:
        return (f"**It fits {where} only with harmful changes** (pure half precision without master weights, or "
                "SGD): no sound configuration oomlab knows fits.")
    return f"**No configuration oomlab knows fits {where}**, on the GPUs or in host RAM."
