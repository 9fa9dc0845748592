"""Palette and helpers shared by the matplotlib diagrams (the .dot files repeat the same hex colours).

Sizes are in display pixels: a figure of W x H is shown at W x H CSS px on a 1280x720 slide and saved
at 2x (SCALE) for a sharp projector image. Font sizes are points at 100 dpi: 13 pt = 18 px.
"""
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

# One colour per role: (strong colour for lines and text, light tint for fills).
DATA = ("#0072B2", "#D4E8F6")      # data, batches
WEIGHTS = ("#009E73", "#D2F0E5")   # parameters
GRADS = ("#E69F00", "#FCE9C2")     # gradients
OPTIM = ("#CC79A7", "#F5DDEB")     # optimizer (AdamW) state
COMM = ("#5E3C99", "#E4DCF1")      # communication: all-reduce, all-gather, reduce-scatter
STORAGE = ("#5A5A5A", "#E6E6E6")   # storage, processes, neutral
CRASH = "#C62828"                  # a crash, a limit
INK = "#222222"

SCALE = 2          # PNG pixels per display pixel
DPI = 100          # display pixels per inch: figsize (11, 4.5) is 1100 x 450

plt.rcParams.update({
    "font.family": "DejaVu Sans",
    "font.size": 15,
    "text.color": INK,
    "axes.labelcolor": INK,
    "xtick.color": INK,
    "ytick.color": INK,
    "svg.fonttype": "none",     # SVG keeps real text
})


def canvas(width_px, height_px, xmax=None, ymax=None):
    """A blank figure whose data coordinates are display pixels (or xmax x ymax units), origin bottom left."""
    fig = plt.figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI)
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, xmax or width_px)
    ax.set_ylim(0, ymax or height_px)
    ax.axis("off")
    return fig, ax


def box(ax, x, y, w, h, text="", color=STORAGE, size=15, weight="normal", fill=None, lw=2,
        ls="-", tc=None, rounding=6, **kw):
    """A rounded box with centred text; color is a (line, fill) pair."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=f"round,pad=0,rounding_size={rounding}",
                                fc=fill or color[1], ec=color[0], lw=lw, ls=ls))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
                weight=weight, color=tc or INK, **kw)


def arrow(ax, start, end, color=INK, lw=2.5, style="-|>", ms=18, **kw):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=ms, color=color, lw=lw,
                                 shrinkA=0, shrinkB=0, **kw))


def save(fig, name, out_dir=None):
    """Write NAME.png (at SCALE x) and NAME.svg next to this file (or in out_dir); return the PNG path."""
    out = Path(out_dir or Path(__file__).parent)
    png = out / f"{name}.png"
    fig.savefig(png, dpi=DPI * SCALE, facecolor="white")
    fig.savefig(out / f"{name}.svg", facecolor="white")
    plt.close(fig)
    return png


def out_dir_arg():
    """The output folder: the first command-line argument, else this folder."""
    return sys.argv[1] if len(sys.argv) > 1 else None
