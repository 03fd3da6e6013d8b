"""What the evaluation's report sections are drawn with: escaped Markdown table rows and pyplot-free figures.

Every section of report.md (the metrics, the judge's Table 2, the motion sweep) writes its tables and plots
with these, so a section can live beside what it shows without importing the report.
"""
from __future__ import annotations

from typing import Any


def markdown_cell(text: Any) -> str:
    """``text`` as one Markdown table cell: a ``|`` (or a line break) in a reason or an answer would
    otherwise end the cell (or the row) and shift what the table shows. Backslashes are escaped too, so
    a ``\\|`` in the text cannot undo the escape."""
    flat = " ".join(str(text).splitlines())
    return flat.replace("\\", "\\\\").replace("|", "\\|")


def markdown_row(*cells: Any) -> str:
    """One Markdown table row, every cell escaped (:func:`markdown_cell`)."""
    return "| " + " | ".join(markdown_cell(cell) for cell in cells) + " |"


def figure(width: float = 6.0, height: float = 4.0):
    """A pyplot-free Agg figure: no global backend switch, no figure registry to leak."""
    # matplotlib is slow to import: loaded only when a report draws its plots.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig
