"""The README's account of the reproduction is the one oomlab.reproduction.honesty computes."""

from pathlib import Path

from oomlab.reproduction.honesty import FigureRole, honest_reproduction

README = Path(__file__).parents[2] / "README.md"


def test_readme_says_inputs_fitted_predicted_as_computed() -> None:
    """'2 inputs, 1 fitted, 2 predicted' is what honest_reproduction counts, and 'figure for figure' is gone."""
    counts = honest_reproduction().counts
    phrase = (f"{counts[FigureRole.INPUT]} inputs, {counts[FigureRole.FITTED]} fitted, "
              f"{counts[FigureRole.PREDICTED]} predicted")
    text = README.read_text()
    assert phrase in text and "figure for figure" not in text
