"""report.timeline.memory_timeline_svg and explanation.snapshot_timeline: the step's memory over time as inline SVG --
stacked to the budget's peak, phases named, the capacity and the OOM drawn, user text escaped, nothing live."""

from __future__ import annotations

from xml.etree import ElementTree

from oomlab.budget.api import estimate
from oomlab.budget.snapshot import simulate_allocator, snapshot_dict
from oomlab.budget.timeline import step_timeline
from oomlab.core.units import format_size
from oomlab.explanation.snapshot import SnapshotCategory
from oomlab.explanation.snapshot_format import parse_snapshot
from oomlab.explanation.snapshot_timeline import memory_timeline
from oomlab.report.figures import PALETTE
from oomlab.report.sanitize import live_markup
from oomlab.report.timeline import TimelineSeries, memory_timeline_svg

FITS = {"model": "llama-2-7b", "gpu": "a100-80gb", "gpus": 1, "method": "lora", "precision": "bf16-mixed"}
SVG = "{http://www.w3.org/2000/svg}"


def texts(svg: str) -> list[str]:
    return ["".join(t.itertext()) for t in ElementTree.fromstring(svg).iter(f"{SVG}text")]


def test_step_series_peaks_at_the_budget() -> None:
    """The series of a budgeted step peaks at the budget's allocated peak, and the SVG says so, with each phase
    named, the capacity line labelled and no OOM mark for a step that fits."""
    result = estimate(**FITS)
    timeline = step_timeline(result)
    series = TimelineSeries.of_step(timeline, simulate_allocator(result, timeline))
    assert series.peak_bytes == result.allocated_peak_bytes
    svg = memory_timeline_svg(series, title="a step")
    shown = texts(svg)
    assert f"allocations and frees of one step, in order (peak {format_size(result.allocated_peak_bytes)})" in shown
    assert {"between steps", "forward", "optimizer"} <= set(shown)
    assert f"capacity {format_size(result.capacity_bytes)}" in shown
    assert not any(t.startswith("out of memory") for t in shown)
    assert svg.count("<polygon") == len([c for c in PALETTE if any(p.get(c.value) for p in series.points)])


def test_seed_series_marks_the_oom() -> None:
    """The seed dies loading its weights: the red mark sits at the allocator model's failed request."""
    result = estimate()
    timeline = step_timeline(result)
    replay = simulate_allocator(result, timeline)
    series = TimelineSeries.of_step(timeline, replay)
    assert series.oom_point == replay.oom_event - 1 == 11
    assert f"out of memory asking {format_size(replay.oom_size_bytes)}" in texts(memory_timeline_svg(series))
    assert 'fill="#b42318"' in memory_timeline_svg(series)


def test_snapshot_timeline_is_the_step_timeline() -> None:
    """Read back from the written snapshot, the timeline has one point per allocation or free with the same live
    bytes (by the snapshot's categories) and the same phases."""
    result = estimate(**FITS)
    step = step_timeline(result)
    read = memory_timeline(parse_snapshot(snapshot_dict(result)))
    assert len(read.points) == len(step.events)
    assert [sum(p.values()) for p in read.points] == [sum(p.values()) for p in step.live_after]
    assert read.points[-1] == {SnapshotCategory.WEIGHTS: result.phases[result.peak_phase][
        next(c for c in result.phases[result.peak_phase] if c.value == "weights")],
        SnapshotCategory.OPTIMIZER_STATE: 67_108_864}
    assert [p for p, _, _ in read.phases] == ["between steps", "forward", "backward", "optimizer"]
    assert read.oom_point is None and read.peak_bytes == result.allocated_peak_bytes


def test_user_text_is_escaped_and_nothing_is_live() -> None:
    """A title with markup is text in the SVG; the figure holds no script, handler or address."""
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    series = TimelineSeries.of_step(step_timeline(estimate(**FITS)))
    svg = memory_timeline_svg(series, title=evil)
    assert evil not in svg and "&lt;script&gt;" in svg
    assert evil in "".join(ElementTree.fromstring(svg).find(f"{SVG}title").itertext())
    elements = list(ElementTree.fromstring(svg).iter())
    assert {e.tag.removeprefix(SVG) for e in elements} <= {"svg", "title", "rect", "text", "polygon", "line", "circle"}
    assert not [a for e in elements for a in e.attrib if a.startswith("on") or "href" in a or a == "style"]
    assert [f for f in live_markup(f"<html><body><div>{svg}</div></body></html>") if "<svg>" not in f] == []


def test_explorer_redraws_the_timeline() -> None:
    """The explorer's timeline widget follows the controls: the seed's step dies loading (an OOM mark), the same
    model on an 80 GB GPU with LoRA does not; an invalid model leaves it empty."""
    from oomlab.explorer import build_explorer

    explorer = build_explorer()
    assert "out of memory asking" in explorer.timeline.value
    explorer.controls["method"].value = "lora"
    explorer.controls["gpu"].value = "a100-80gb"
    shown = texts(explorer.timeline.value)
    assert not any(t.startswith("out of memory") for t in shown)
    peak = explorer.exploration.result.allocated_peak_bytes
    assert f"allocations and frees of one step, in order (peak {format_size(peak)})" in shown
    explorer.controls["model"].value = "no-such-model"
    assert explorer.timeline.value == ""


def test_snapshot_timeline_svg_of_the_pipeline_snapshot(tmp_path) -> None:
    """The report's figure, drawn from the snapshot file the pipeline writes (read with the restricted reader):
    the seed's step stops at its OOM, marked, against the T4's capacity and what PyTorch may use of it."""
    from oomlab.budget.result import MemCategory
    from oomlab.budget.snapshot import STEP_SNAPSHOT_NAME, write_snapshot
    from oomlab.explanation.snapshot_format import read_snapshot
    from oomlab.report.timeline import snapshot_timeline_svg

    result = estimate()
    path = write_snapshot(result, tmp_path / STEP_SNAPSHOT_NAME)
    outside = result.components[MemCategory.OUTSIDE_PYTORCH]
    shown = texts(snapshot_timeline_svg(read_snapshot(path), result.capacity_bytes, outside, title="seed"))
    assert "out of memory asking 1.18 GiB" in shown
    assert f"capacity {format_size(result.capacity_bytes)}" in shown
    assert f"for PyTorch {format_size(result.capacity_bytes - outside)}" in shown
    assert any(t.startswith("source: oomlab's simulated snapshot: oomlab analytic budget: llama-13b") for t in shown)


def test_story_draws_the_run_snapshot(tmp_path) -> None:
    """The report's story draws the run's results/step-snapshot.pickle (a matplotlib figure: the report embeds
    rasters only) against the configured budget's capacity, reading only what budget_results writes; a run without
    the file gets None."""
    from oomlab.budget.snapshot import STEP_SNAPSHOT_NAME, write_snapshot
    from oomlab.report import story

    result = estimate(**FITS)
    r = {"budget": {"configured": result.to_dict()}}
    assert story.plot_step_timeline(r, tmp_path) is None
    (tmp_path / "results").mkdir()
    write_snapshot(result, tmp_path / "results" / STEP_SNAPSHOT_NAME)
    fig = story.plot_step_timeline(r, tmp_path)
    ax = fig.axes[0]
    shown = {t.get_text() for t in ax.texts} | {t.get_text() for t in ax.get_legend().get_texts()}
    assert f"allocations and frees of one step, in order (peak {format_size(result.allocated_peak_bytes)})" in \
        ax.get_xlabel()
    assert f"capacity {format_size(result.capacity_bytes)}" in shown
    assert {"forward", "optimizer"} <= shown
