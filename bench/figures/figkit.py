"""Drawing helpers shared by the figure scripts in bench/figures/ (matplotlib only).

The colours are one code for every figure of the ideas: where a piece of data lives while a step
runs. HBM (device memory) blue, shared memory (SRAM) orange, registers green, and grey for what the
step does not touch.
"""
import os

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Polygon, Rectangle  # noqa: E402

HBM = "#9ecae1"       # device memory, moved by this step
HBM_PALE = "#e6f0f8"  # device memory, not touched by this step
HBM_DARK = "#3182bd"
SMEM = "#fdae6b"      # shared memory
SMEM_DARK = "#e6550d"
REG = "#a1d99b"       # registers
REG_DARK = "#31a354"
IDLE = "#f0f0f0"
EDGE = "#444444"

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_OUT = os.path.join(REPO, "docs", "figures")


def out_path(out_dir, name):
    os.makedirs(out_dir, exist_ok=True)
    return os.path.join(out_dir, name)


def save(fig, path, dpi=110):
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    print(path)


def box(ax, x, y, w, h, fc=IDLE, ec=EDGE, lw=1.0, ls="-", text=None, fs=9, tc="black", z=2, **kw):
    """A rectangle with its lower-left corner at (x, y), optionally with centred text."""
    ax.add_patch(Rectangle((x, y), w, h, facecolor=fc, edgecolor=ec, linewidth=lw, linestyle=ls, zorder=z))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs, color=tc, zorder=z + 1, **kw)


def blocked(ax, x, y, w, h, rows, cols, fc="white", ec=EDGE, ls="-", lw=1.0, grid_ls=":"):
    """A matrix outline cut into rows × cols blocks; block (r, c) counts from the top left."""
    ax.add_patch(Rectangle((x, y), w, h, facecolor=fc, edgecolor=ec, linewidth=lw, linestyle=ls, zorder=1))
    for r in range(1, rows):
        yy = y + h - r * h / rows
        ax.plot([x, x + w], [yy, yy], color="#999999", lw=0.6, ls=grid_ls, zorder=1.5)
    for c in range(1, cols):
        xx = x + c * w / cols
        ax.plot([xx, xx], [y, y + h], color="#999999", lw=0.6, ls=grid_ls, zorder=1.5)


def cell(x, y, w, h, rows, cols, r, c, nr=1, nc=1):
    """(x, y, w, h) of blocks r..r+nr-1, c..c+nc-1 of a blocked matrix drawn at (x, y, w, h)."""
    bw, bh = w / cols, h / rows
    return (x + c * bw, y + h - (r + nr) * bh, nc * bw, nr * bh)


def arrow(ax, p, q, color=EDGE, lw=1.4, style="-|>", rad=0.0, ls="-", ms=12, z=5, text=None, fs=8, toff=(0, 0),
          tcolor=None, ha="center", va="center"):
    ax.add_patch(FancyArrowPatch(p, q, arrowstyle=style, mutation_scale=ms, color=color, lw=lw, linestyle=ls,
                                 connectionstyle="arc3,rad=%g" % rad, zorder=z))
    if text:
        mx, my = (p[0] + q[0]) / 2 + toff[0], (p[1] + q[1]) / 2 + toff[1]
        ax.text(mx, my, text, fontsize=fs, color=tcolor or color, ha=ha, va=va, zorder=z + 1)


def hierarchy(ax, levels, x0=0.0, y0=0.0, w=4.2, h=7.6):
    """The memory pyramid: levels from the top (registers) to the bottom (HBM), each a tuple
    (name, detail, colour, [lines of what this rung keeps there]). Drawn as stacked trapezoids."""
    n = len(levels)
    lh = h / n
    for k, (name, detail, color, items) in enumerate(levels):
        top = y0 + h - k * lh
        bot = top - lh + 0.12
        # width grows downwards: a pyramid, narrow (fast, small) at the top, wide (slow, big) below
        wt = w * (0.55 + 0.45 * k / n)
        wb = w * (0.55 + 0.45 * (k + 1) / n)
        cx = x0 + w / 2
        ax.add_patch(Polygon([(cx - wb / 2, bot), (cx + wb / 2, bot), (cx + wt / 2, top), (cx - wt / 2, top)],
                             closed=True, facecolor=color, edgecolor=EDGE, lw=1.0, zorder=1))
        ax.text(cx, top - 0.2, name, ha="center", va="top", fontsize=10, fontweight="bold", zorder=3)
        ax.text(cx, top - 0.55, detail, ha="center", va="top", fontsize=7.5, color="#333333", zorder=3)
        for m, line in enumerate(items):
            ax.text(cx, top - 0.98 - 0.33 * m, line, ha="center", va="top", fontsize=8, zorder=3)


def legend_where(fig, y=0.085, x=0.64, fs=8.5):
    """The colour key (where data lives), one row, centred at figure coordinates (x, y)."""
    from matplotlib.patches import Patch
    keys = [(HBM_PALE, "in HBM"), (HBM, "in HBM, moved by this step"), (SMEM, "in shared memory (SRAM)"),
            (REG, "in registers")]
    fig.legend(handles=[Patch(facecolor=c, edgecolor=EDGE, label=t) for c, t in keys], loc="center",
               bbox_to_anchor=(x, y), ncol=len(keys), fontsize=fs, frameon=False, handlelength=1.5)


def blank(ax, xlim, ylim):
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")
