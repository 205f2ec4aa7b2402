"""Tests for oomlab.report.figures: the remedies figure (bars against capacity, the recommended fix marked)."""

from __future__ import annotations

import pytest

from oomlab.budget.result import Fit
from oomlab.core.units import GiB, format_size
from oomlab.report import story
from oomlab.report.figures import FIT_COLORS, RemedyBar, plot_remedies

CAP = 15 * GiB


def remedy(name: str, peak_gib: float, fits: bool) -> dict:
    peak = int(peak_gib * GiB)
    return {"name": name, "per_gpu_peak_bytes": peak, "headroom_bytes": CAP - peak, "fits": fits}


def plan_results(recommended: str | None, n: int = 14) -> dict:
    remedies = [remedy(f"remedy {i}", 5 + i / 2, True) for i in range(1, n + 1)]
    rec = next((x for x in remedies if x["name"] == recommended), None)
    return {"plan": {"configured": remedy("DDP · full", 300, False), "remedies": remedies,
                     "recommended": rec}}


def test_bars_follow_the_ranked_table() -> None:
    """The user's configuration first, then the top ten in rank order, each labelled with its rank."""
    bars = story.remedy_bars(plan_results("remedy 3"))
    assert [b.label for b in bars] == ["as configured · DDP · full", *(f"{i} · remedy {i}" for i in range(1, 11))]
    assert [b.chosen for b in bars].index(True) == 3 and sum(b.chosen for b in bars) == 1


def test_the_configured_row_is_never_the_marked_fix() -> None:
    """The configured row's name is its configuration's, so it may equal the recommended row's: only the ranked
    row is marked."""
    results = plan_results("remedy 3")
    results["plan"]["configured"]["name"] = "remedy 3"
    bars = story.remedy_bars(results)
    assert bars[0].label == "as configured · remedy 3" and not bars[0].chosen
    assert [b.chosen for b in bars].index(True) == 3 and sum(b.chosen for b in bars) == 1


def test_recommended_below_the_top_is_added() -> None:
    """A recommended fix ranked 13th is drawn after the top ten, marked."""
    bars = story.remedy_bars(plan_results("remedy 13"))
    assert len(bars) == 12 and bars[-1].label == "13 · remedy 13" and bars[-1].chosen


def test_no_recommendation_marks_nothing() -> None:
    assert not any(b.chosen for b in story.remedy_bars(plan_results(None)))


def test_capacity_is_peak_plus_headroom() -> None:
    bars = story.remedy_bars(plan_results("remedy 1"))
    assert {b.capacity_bytes for b in bars} == {CAP}


def drawn(fig):
    ax = fig.axes[0]
    return ax, [p for p in ax.patches if p.get_height() > 0.5], [t.get_text() for t in ax.texts]


def test_figure_draws_each_bar_with_its_value() -> None:
    """One bar per remedy, coloured by fit, the values printed, the recommended one outlined and named."""
    bars = [RemedyBar("as configured", 300 * GiB, CAP, False), RemedyBar("1 · a", 9 * GiB, CAP, True, chosen=True),
            RemedyBar("2 · b", 12 * GiB, CAP, False)]  # fits the GPU but not host RAM
    ax, patches, texts = drawn(plot_remedies(bars))
    assert len(patches) == 3
    colors = [tuple(round(c, 3) for c in p.get_facecolor()[:3]) for p in patches]
    from matplotlib.colors import to_rgb

    assert colors == [tuple(round(c, 3) for c in to_rgb(FIT_COLORS[k].fill)) for k in (Fit.NO, Fit.FITS, Fit.GPU_ONLY)]
    assert patches[1].get_linewidth() == 2 and patches[0].get_linewidth() == 0
    assert any(t.startswith(format_size(9 * GiB)) and "recommended" in t for t in (s.strip() for s in texts))
    assert any(format_size(300 * GiB) in t for t in texts)  # the cut bar keeps its value
    assert any("capacity " + format_size(CAP) in t for t in texts)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["as configured", "1 · a", "2 · b"]


def test_long_bar_is_cut_at_twice_capacity() -> None:
    """A 300 GiB bar on a 15 GiB GPU does not squash the others: the axis ends at twice the capacity."""
    ax, patches, _ = drawn(plot_remedies([RemedyBar("x", 300 * GiB, CAP, False), RemedyBar("y", 9 * GiB, CAP, True)]))
    assert ax.get_xlim()[1] == pytest.approx(2 * CAP / GiB)
    assert max(p.get_width() for p in patches) < 2 * CAP / GiB
    assert patches[1].get_width() == pytest.approx(9)
