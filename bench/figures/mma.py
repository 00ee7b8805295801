#!/usr/bin/env python3
"""Rung 06's register and shared-memory layouts, drawn from the formulas the kernels use.

    python3 bench/figures/mma.py [--out docs/figures]

writes
  mma_fragments.png  which lane (0-31) holds which element of the A (16×16), B (16×8, k × n) and
                     C/D (16×8, fp32) fragments of mma.sync.m16n8k16, coloured by register;
  mma_c_is_a.png     two C tiles of S = Q Kᵀ side by side hold, lane for lane, one A tile of P:
                     P feeds P·V without leaving the registers;
  ldmatrix_x4.png    which lane gives the row address of which 8-value row of a 16×16 piece for
                     ldmatrix.x4 (a_pattern and b_pattern), and which register receives each 8×8;
  swizzle.png        the XOR swizzle of 16-byte chunks: chunk c of row r stored at c ^ (r % 8),
                     and the banks one ldmatrix 8×8 read touches with and without it.

The formulas are Python copies of steps/06_tensor_core_mma/mma_layout.hpp (a_elem, b_elem,
c_elem) and swizzle.hpp (swz, a_pattern, b_pattern). Before drawing, check() compares them with
tables written out independently from the PTX ISA's "Matrix Fragments for mma.m16n8k16" and
"ldmatrix" sections, checks that every element has exactly one owner, and checks the C-is-A
identity and the swizzle's bank property; a mismatch stops the script.
"""
import argparse

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from figkit import DEFAULT_OUT, EDGE, out_path, save

# ---- the kernels' formulas, copied from the headers ----------------------------------------------


def a_elem(lane, e):
    """mma_layout.hpp a_elem: element e (0..7, two per register, low half first) of lane's A."""
    g, t, reg, half = lane // 4, lane % 4, e // 2, e % 2
    return (g + 8 * (reg % 2), 2 * t + half + 8 * (reg // 2))


def b_elem(lane, e):
    """mma_layout.hpp b_elem: element e (0..3) of lane's B fragment, as (k, n)."""
    g, t, reg, half = lane // 4, lane % 4, e // 2, e % 2
    return (2 * t + half + 8 * reg, g)


def c_elem(lane, e):
    """mma_layout.hpp c_elem: element e (0..3) of lane's C/D fragment."""
    g, t = lane // 4, lane % 4
    return (g + 8 * (e // 2), 2 * t + e % 2)


def swz(ld, row, col):
    """swizzle.hpp swz<LD>: element (row, col) of a swizzled tile with LD values per row."""
    assert ld >= 64 and ld % 64 == 0
    return row * ld + (((col >> 3) ^ (row & 7)) << 3) + (col & 7)


def a_pattern(lane):
    """swizzle.hpp a_pattern: (row, chunk) of the 16×16 piece whose address this lane gives."""
    return (lane % 16, lane // 16)


def b_pattern(lane):
    return (lane % 8 + 8 * (lane // 16), lane // 8 % 2)


# ---- independent tables and checks ---------------------------------------------------------------


def ptx_tables():
    """The fragments as the PTX ISA lists them: a0..a7, b0..b3, c0..c3 per lane, written out from
    its row/col rules (groupID = lane >> 2, threadID_in_group = lane % 4), not from the formulas."""
    A, B, C = {}, {}, {}
    for lane in range(32):
        gid, tig = lane >> 2, lane % 4
        for i in range(8):
            row = gid if i in (0, 1, 4, 5) else gid + 8
            col = tig * 2 + (i & 1) + (8 if i >= 4 else 0)
            A[(lane, i)] = (row, col)
        for i in range(4):
            B[(lane, i)] = (tig * 2 + (i & 1) + (8 if i >= 2 else 0), gid)
            C[(lane, i)] = (gid if i < 2 else gid + 8, tig * 2 + (i & 1))
    return A, B, C


def check():
    A, B, C = ptx_tables()
    for lane in range(32):
        for e in range(8):
            assert a_elem(lane, e) == A[(lane, e)], ("a_elem", lane, e)
        for e in range(4):
            assert b_elem(lane, e) == B[(lane, e)], ("b_elem", lane, e)
            assert c_elem(lane, e) == C[(lane, e)], ("c_elem", lane, e)
    # every element of each tile owned exactly once
    for f, n, rows, cols in ((a_elem, 8, 16, 16), (b_elem, 4, 16, 8), (c_elem, 4, 16, 8)):
        owned = sorted(f(lane, e) for lane in range(32) for e in range(n))
        assert owned == [(r, c) for r in range(rows) for c in range(cols)], f.__name__
    # C is A: C tile 0 (columns 0-7) is A's registers 0-1, C tile 1 (columns 8-15) registers 2-3
    for lane in range(32):
        for e in range(4):
            r, c = c_elem(lane, e)
            assert a_elem(lane, e) == (r, c)
            assert a_elem(lane, 4 + e) == (r, c + 8)
    # ldmatrix.x4 (PTX): lanes 8m..8m+7 give the row addresses of matrix m, and register m of lane l
    # receives row l/4, columns 2(l%4), 2(l%4)+1 of matrix m. a_pattern orders the matrices
    # top-left, bottom-left, top-right, bottom-right: then register m is A's register m.
    quad = {0: (0, 0), 1: (8, 0), 2: (0, 8), 3: (8, 8)}  # A register m covers rows +0/+8, cols +0/+8
    for lane in range(32):
        for m in range(4):
            src = 8 * m + lane // 4  # the lane that gave the address of the row this lane receives
            row, chunk = a_pattern(src)
            for half in range(2):
                got = (row, 8 * chunk + 2 * (lane % 4) + half)
                assert got == a_elem(lane, 2 * m + half), ("a_pattern", lane, m)
                assert (got[0] - quad[m][0], got[1] - quad[m][1]) == (lane // 4, 2 * (lane % 4) + half)
    # swizzle: the 8 rows of one chunk column fall in 8 different groups of 4 banks, for every column
    for ld in (64, 128):
        for chunk in range(ld // 8):
            groups = {(2 * swz(ld, r, 8 * chunk) // 4) % 32 // 4 for r in range(8)}
            assert len(groups) == 8, (ld, chunk)
    return True


# ---- drawing --------------------------------------------------------------------------------------

REG_COLORS = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072"]


def grid(ax, x0, y0, rows, cols, owner, color_of, s=1.0, fs=7, title=None, col_label=None, row_label=None,
         text_of=None):
    """A rows × cols grid of cells, (0, 0) at the top left; owner(r, c) -> key for color_of/text_of."""
    for r in range(rows):
        for c in range(cols):
            k = owner(r, c)
            ax.add_patch(Rectangle((x0 + c * s, y0 - (r + 1) * s), s, s, facecolor=color_of(k), edgecolor="white",
                                   lw=0.8))
            ax.text(x0 + (c + 0.5) * s, y0 - (r + 0.5) * s, text_of(k) if text_of else str(k), ha="center",
                    va="center", fontsize=fs)
    ax.add_patch(Rectangle((x0, y0 - rows * s), cols * s, rows * s, fill=False, edgecolor=EDGE, lw=1.2))
    if title:
        ax.text(x0 + cols * s / 2, y0 + 1.3 * s, title, ha="center", va="bottom", fontsize=10, fontweight="bold")
    for c in range(cols):
        ax.text(x0 + (c + 0.5) * s, y0 + 0.15 * s, str(c), ha="center", va="bottom", fontsize=6, color="#666666")
    for r in range(rows):
        ax.text(x0 - 0.15 * s, y0 - (r + 0.5) * s, str(r), ha="right", va="center", fontsize=6, color="#666666")
    if col_label:
        ax.text(x0 + cols * s / 2, y0 + 0.75 * s, col_label, ha="center", va="bottom", fontsize=7.5, color="#444444")
    if row_label:
        ax.text(x0 - 1.0 * s, y0 - rows * s / 2, row_label, ha="center", va="center", fontsize=7.5, color="#444444",
                rotation=90)


def inverse(f, n):
    """(row, col) -> (lane, e) for a fragment function f with n elements per lane."""
    return {f(lane, e): (lane, e) for lane in range(32) for e in range(n)}


def blank(ax, xlim, ylim):
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")


def fragments(out):
    fig, ax = plt.subplots(figsize=(14, 7.2))
    A, B, C = inverse(a_elem, 8), inverse(b_elem, 4), inverse(c_elem, 4)
    grid(ax, 1.5, 17, 16, 16, lambda r, c: A[(r, c)], lambda k: REG_COLORS[k[1] // 2], text_of=lambda k: k[0],
         title="A  (16 × 16, row-major: Q or P)", col_label="column k", row_label="row m")
    grid(ax, 20, 17, 16, 8, lambda r, c: B[(r, c)], lambda k: REG_COLORS[k[1] // 2], text_of=lambda k: k[0],
         title="B  (16 × 8, k × n: Kᵀ or V)", col_label="column n", row_label="row k")
    grid(ax, 31, 17, 16, 8, lambda r, c: C[(r, c)], lambda k: REG_COLORS[k[1]], text_of=lambda k: k[0],
         title="C / D  (16 × 8, fp32)", col_label="column n", row_label="row m")
    for k, (color, text) in enumerate([(REG_COLORS[0], "A reg 0 (a0, a1)\nB reg 0 (b0, b1)\nC: c0"),
                                       (REG_COLORS[1], "A reg 1 (a2, a3)\nB reg 1 (b2, b3)\nC: c1"),
                                       (REG_COLORS[2], "A reg 2 (a4, a5)\nC: c2"),
                                       (REG_COLORS[3], "A reg 3 (a6, a7)\nC: c3")]):
        y = 16 - 2.6 * k
        ax.add_patch(Rectangle((40.2, y - 0.3), 0.7, 0.7, facecolor=color, edgecolor=EDGE, lw=0.6))
        ax.text(41.2, y + 0.05, text, va="center", fontsize=7.5)
    ax.text(40.2, 5.2, "Each cell: the lane that holds\nthe element. lane = 4g + t,\n"
            "g = lane / 4, t = lane % 4.\n\nA: rows g, g+8;\n    cols 2t, 2t+1 (+8)\n"
            "B: rows k = 2t, 2t+1 (+8);\n    col n = g\nC: rows g, g+8;\n    cols 2t, 2t+1",
            va="top", fontsize=7.5, family="monospace")
    blank(ax, (0, 47), (-0.5, 19.5))
    fig.suptitle("mma.sync.m16n8k16: which lane holds which element (steps/06_tensor_core_mma/mma_layout.hpp)",
                 fontsize=12, fontweight="bold")
    fig.text(0.01, 0.01, "One warp, 32 lanes. A: 8 bf16/fp16 values a lane in 4 registers; B: 4 values in 2 registers; "
             "C/D: 4 fp32 values. D = A·B + C, fp32 accumulate. Colours: register.", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.03, 1, 0.96))
    save(fig, out_path(out, "mma_fragments.png"))


def c_is_a(out):
    fig, ax = plt.subplots(figsize=(14, 6.6))
    A, C = inverse(a_elem, 8), inverse(c_elem, 4)
    # C tiles coloured by the A register their values become: tile 0 c0,c1 -> reg 0, c2,c3 -> reg 1; tile 1 -> 2, 3
    grid(ax, 1.5, 17, 16, 8, lambda r, c: C[(r, c)], lambda k: REG_COLORS[k[1] // 2], text_of=lambda k: k[0],
         title="C tile n = 2k", col_label="keys 16k … 16k+7", row_label="query row")
    grid(ax, 10.3, 17, 16, 8, lambda r, c: C[(r, c)], lambda k: REG_COLORS[2 + k[1] // 2], text_of=lambda k: k[0],
         title="C tile n = 2k+1", col_label="keys 16k+8 … 16k+15")
    ax.text(9.9, 19.9, "S = Q Kᵀ:  two 16 × 8 fp32 C tiles  →  exp2, ℓ, m  →  P in fp32", ha="center", fontsize=10)
    ax.annotate("", xy=(24.2, 9), xytext=(19.3, 9), arrowprops=dict(arrowstyle="-|>", lw=2.5, color="#333333"))
    ax.text(21.75, 9.6, "pack pairs to bf16\n(cvt, in place:\nno shuffle, no\nshared memory)", ha="center", va="bottom",
            fontsize=8.5)
    grid(ax, 25, 17, 16, 16, lambda r, c: A[(r, c)], lambda k: REG_COLORS[k[1] // 2], text_of=lambda k: k[0],
         title="A tile of P for P·V (16 × 16)", col_label="keys 16k … 16k+15 = the k-step of P·V")
    for k in range(4):
        y = 15.5 - 1.4 * k
        ax.add_patch(Rectangle((42.3, y - 0.3), 0.7, 0.7, facecolor=REG_COLORS[k], edgecolor=EDGE, lw=0.6))
    texts = ["tile 2k: c0, c1  →  A reg 0", "tile 2k: c2, c3  →  A reg 1", "tile 2k+1: c0, c1  →  A reg 2",
             "tile 2k+1: c2, c3  →  A reg 3"]
    for k, t in enumerate(texts):
        ax.text(43.3, 15.55 - 1.4 * k, t, va="center", fontsize=8)
    ax.text(42.3, 9, "Same lane, same (row, column)\nin both pictures: the C layout\nof Q·Kᵀ is the A layout of P·V.",
            va="top", fontsize=8.5)
    blank(ax, (0, 52), (-0.5, 21))
    fig.suptitle("C is A: the scores' accumulators are already P·V's A operand (FlashAttention-2 keeps P in registers)",
                 fontsize=12, fontweight="bold")
    fig.text(0.01, 0.01, "Cells: the lane holding the element (c_elem, a_elem of mma_layout.hpp); colours: the A "
             "register the value ends up in. Checked for all 32 lanes: a_elem(lane, e) = c_elem(lane, e), "
             "a_elem(lane, 4+e) = c_elem(lane, e) + (0, 8).", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.03, 1, 0.96))
    save(fig, out_path(out, "mma_c_is_a.png"))


def ldmatrix(out):
    fig, axs = plt.subplots(1, 2, figsize=(13, 7.4))
    M_COLORS = REG_COLORS
    for ax, (name, pat, order, use) in zip(axs, [
            ("a_pattern: row lane % 16, chunk lane / 16", a_pattern, "top-left, bottom-left, top-right, bottom-right",
             "→ A fragment: register m = A reg m\n   (or, with .trans, B of two n8 tiles\n   of a row-major K × N tile: V)"),
            ("b_pattern: row lane % 8 + 8·(lane / 16), chunk (lane / 8) % 2", b_pattern,
             "top-left, top-right, bottom-left, bottom-right",
             "→ B fragments of two n8 tiles of an\n   N × K tile (K for Q·Kᵀ): registers\n   0, 1 = tile n, registers 2, 3 = tile n+1")]):
        who = {}
        for lane in range(32):
            who[pat(lane)] = lane
        s = 1.0
        x0, y0 = 2.5, 17
        for r in range(16):
            for ch in range(2):
                lane = who[(r, ch)]
                m = lane // 8
                ax.add_patch(Rectangle((x0 + ch * 4 * s, y0 - (r + 1) * s), 4 * s, s, facecolor=M_COLORS[m],
                                       edgecolor="white", lw=1.0))
                ax.text(x0 + (ch * 4 + 2) * s, y0 - (r + 0.5) * s, "lane %d" % lane, ha="center", va="center",
                        fontsize=7.5)
            ax.text(x0 - 0.2, y0 - (r + 0.5) * s, str(r), ha="right", va="center", fontsize=7, color="#666666")
        for ch in range(2):
            ax.text(x0 + (ch * 4 + 2) * s, y0 + 0.2, "columns %d–%d\n(16-byte chunk %d)" % (8 * ch, 8 * ch + 7, ch),
                    ha="center", va="bottom", fontsize=7.5)
        ax.add_patch(Rectangle((x0, y0 - 16 * s), 8 * s, 16 * s, fill=False, edgecolor=EDGE, lw=1.4))
        ax.plot([x0, x0 + 8 * s], [y0 - 8 * s] * 2, color=EDGE, lw=1.4)
        ax.plot([x0 + 4 * s] * 2, [y0, y0 - 16 * s], color=EDGE, lw=1.4)
        ax.text(x0 + 4 * s, y0 + 2.1, name, ha="center", va="bottom", fontsize=9.5, fontweight="bold")
        for m in range(4):
            ax.add_patch(Rectangle((11.6, 15.6 - 1.2 * m), 0.7, 0.7, facecolor=M_COLORS[m], edgecolor=EDGE, lw=0.6))
            ax.text(12.6, 15.95 - 1.2 * m, "lanes %d–%d: 8×8 matrix %d\n→ register %d of every lane" % (8 * m, 8 * m + 7, m, m),
                    va="center", fontsize=7.5)
        ax.text(11.6, 10.2, "matrices in order:\n" + order.replace(", b", ",\nb") + "\n\n" + use, va="top", fontsize=7.5)
        ax.text(x0 - 1.1, y0 - 8, "row of the 16 × 16 piece", rotation=90, ha="center", va="center", fontsize=7.5,
                color="#444444")
        blank(ax, (0, 20.5), (-0.5, 21))
    fig.suptitle("ldmatrix.x4: each lane gives one row address; register m of each lane receives a piece of 8×8 matrix m",
                 fontsize=11.5, fontweight="bold")
    fig.text(0.01, 0.01, "steps/06_tensor_core_mma/swizzle.hpp a_pattern, b_pattern (LaneRow). Register m of lane l "
             "receives row l / 4, columns 2(l % 4), 2(l % 4)+1 of matrix m: the\nsame positions as mma's fragments, "
             "so with a_pattern register m is A register m (checked for all lanes). In a swizzled tile the chunk's "
             "address is then swz(row, 8·chunk).", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    save(fig, out_path(out, "ldmatrix_x4.png"))


def swizzle(out):
    LDV = 64  # values per row: d = 64 in bf16, 128 bytes, one 8-chunk group
    fig, axs = plt.subplots(1, 2, figsize=(13.5, 6.4))
    chunk_colors = plt.get_cmap("Set3")
    for ax, (title, place) in zip(axs, [
            ("row-major, no swizzle: chunk c of row r at position c", lambda r, c: r * LDV + 8 * c),
            ("swizzled (v4_swizzle and later): chunk c of row r at position c ^ (r % 8)", lambda r, c: swz(LDV, r, 8 * c))]):
        x0, y0, s = 1.6, 9.0, 1.0
        for r in range(8):
            for c in range(8):
                byte = 2 * place(r, c)
                pos = (byte % (2 * LDV)) // 16  # chunk position within the 128-byte row
                ax.add_patch(Rectangle((x0 + pos * s, y0 - (r + 1) * s), s, s, facecolor=chunk_colors(c),
                                       edgecolor="white", lw=1.0))
                ax.text(x0 + (pos + 0.5) * s, y0 - (r + 0.5) * s, "c%d" % c, ha="center", va="center", fontsize=8)
                if c == 0:  # what one 8×8 ldmatrix piece at chunk column 0 reads: rows 0..7, chunk 0
                    ax.add_patch(Rectangle((x0 + pos * s + 0.05, y0 - (r + 1) * s + 0.05), s - 0.1, s - 0.1,
                                           fill=False, edgecolor="#d62728", lw=2.2))
            ax.text(x0 - 0.2, y0 - (r + 0.5) * s, "row %d" % r, ha="right", va="center", fontsize=7.5)
        for p in range(8):
            ax.text(x0 + (p + 0.5) * s, y0 + 0.1, "banks\n%d–%d" % (4 * p, 4 * p + 3), ha="center", va="bottom",
                    fontsize=6.5)
        ax.add_patch(Rectangle((x0, y0 - 8 * s), 8 * s, 8 * s, fill=False, edgecolor=EDGE, lw=1.2))
        ax.text(x0 + 4 * s, y0 + 1.3, title, ha="center", va="bottom", fontsize=9.5, fontweight="bold")
        groups = sorted({(2 * place(r, 0) // 4) % 32 // 4 for r in range(8)})
        verdict = ("chunk c0 of rows 0–7 (red): all in banks 0–3\n→ 8-way bank conflict: 8 shared-memory wavefronts"
                   if len(groups) == 1 else
                   "chunk c0 of rows 0–7 (red): 8 different groups\nof 4 banks → no conflict, one wavefront, no padding")
        ax.text(x0 + 4 * s, y0 - 8 * s - 0.4, verdict, ha="center", va="top", fontsize=8.5)
        blank(ax, (-0.4, 10.2), (-1.6, 11.2))
    fig.suptitle("The XOR swizzle of 16-byte chunks (steps/06_tensor_core_mma/swizzle.hpp swz): a 64-column bf16 "
                 "tile, 128 bytes a row", fontsize=11.5, fontweight="bold")
    fig.text(0.01, 0.01, "Shared memory has 32 banks of 4 bytes; a 128-byte row covers each bank once, so without a "
             "swizzle chunk c of every row lies in the same 4 banks. An ldmatrix 8×8 piece reads one\n16-byte chunk "
             "from each of 8 rows at once. swz(r, col) = r·LD + ((col/8) ^ (r % 8))·8 + col % 8 moves chunk c to "
             "position c ^ (r % 8): the same 8 chunks per row, in another order.", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    save(fig, out_path(out, "swizzle.png"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="folder for the PNG files (default docs/figures)")
    args = ap.parse_args(argv)
    check()
    fragments(args.out)
    c_is_a(args.out)
    ldmatrix(args.out)
    swizzle(args.out)


if __name__ == "__main__":
    main()
