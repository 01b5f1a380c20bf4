"""Charts of benchmark figures, drawn to PNGs under ``docs/img/`` for docs/benchmarks.md.

    from benchmarks import plots
    plots.draw("upsert-table", [("", [("ours", sizes, seconds), ...])],
               xlabel="table rows", ylabel="upsert, s")

matplotlib is imported inside ``draw`` only: a benchmark run without
``--plot`` must not need it (it is in the ``bench`` extra, not the
package's dependencies).
"""

from __future__ import annotations

import math
import os
import platform
import time
from typing import Sequence, Tuple

IMG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "img")
DPI = 100
STYLES = ("o-", "s--", "^-.", "D:", "v-", "P--")

Series = Tuple[str, Sequence[float], Sequence[float]]


def machine_note() -> str:
    """Machine, UTC time and load, printed under a chart: the cores are shared."""
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load}")


def _two_and_five(v: float, _pos) -> str:
    """Labels 2 and 5 of each decade between a log axis' powers of ten."""
    if v <= 0:
        return ""
    return f"{v:,.10g}" if round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""


def draw(name: str, panels: Sequence[Tuple[str, Sequence[Series]]], *, xlabel: str,
         ylabel: str, title: str = "", xlog: bool = False, ylog: bool = False,
         size: Tuple[float, float] = (6, 4), ncols: int = 0, note: str = "") -> str:
    """One PNG of line charts, a panel per ``(panel title, series)``; returns its path.

    A series' label keeps its colour and line style in every panel, so one
    legend serves them all.
    """
    import matplotlib
    matplotlib.use("Agg")   # no display on a benchmark machine
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ncols = ncols or min(len(panels), 3)
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=size, dpi=DPI, squeeze=False)
    labels = list(dict.fromkeys(label for _, series in panels for label, _, _ in series))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles = {}
    for ax, (panel, series) in zip(axes.flat, panels):
        for label, xs, ys in series:
            i = labels.index(label)
            (line,) = ax.plot(xs, ys, STYLES[i % len(STYLES)], color=colours[i % len(colours)],
                              label=label, markersize=4, linewidth=1.2)
            handles[label] = line
        # Log axes label their ticks as powers of ten; the figures are read as plain
        # numbers, and on x at the sizes measured.
        if xlog:
            ax.set_xscale("log")
            ax.set_xticks(sorted({x for _, xs, _ in series for x in xs}))
            ax.xaxis.set_minor_formatter(NullFormatter())
        if ylog:
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(FuncFormatter(_two_and_five))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
        ax.set_title(panel, fontsize=9)
        ax.tick_params(which="both", labelsize=7)
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel(xlabel, fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=8)
    spare = list(axes.flat[len(panels):])
    for ax in spare:
        ax.axis("off")
    legend = [handles[label] for label in labels]
    if spare:
        spare[0].legend(legend, labels, loc="center", fontsize=8, frameon=False)
    else:
        axes.flat[0].legend(legend, labels, fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    if note:
        fig.text(0.99, 0.005, note, ha="right", va="bottom", fontsize=6, color="0.4")
    fig.tight_layout(rect=(0, 0.03 if note else 0, 1, 1))
    os.makedirs(IMG, exist_ok=True)
    path = os.path.join(IMG, f"{name}.png")
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
