#!/usr/bin/env python3
"""The tiling and loop order of rungs 03, 04 and 05 over the memory hierarchy (figures of ideas).

    python3 bench/figures/tiling.py [--out docs/figures]

writes tiling_03_block_matmul.png, tiling_04_fa1_loop_order.png and tiling_05_fa2_loop_order.png.
Each shows, on the left, the memory pyramid (registers, shared memory, HBM) with what the rung's
kernel keeps at each level, and on the right the matrices of one step with the blocks it touches,
coloured by where they live, and the loops that walk over the blocks. The block sizes are the
kernels' own (steps/03_block_matmul/block_matmul.hpp kTile, steps/04_fa1_loop_order/
fa1_loop_order.hpp blocks_for(kKernelM, d), steps/05_fa2_loop_order/fa2_loop_order.hpp kBr, kBc);
the hardware sizes are the H100's (docs: /work/shared/anchors.md "Physical limits").
"""
import argparse

import matplotlib.pyplot as plt

from figkit import (DEFAULT_OUT, EDGE, HBM, HBM_DARK, HBM_PALE, IDLE, REG, REG_DARK, SMEM, SMEM_DARK, arrow, blank, blocked,
                    box, cell, hierarchy, legend_where, out_path, save)

REGS = "64K 32-bit registers per SM (256 KB)"
SHARED = "up to 228 KB per SM"
HBM_TEXT = "80 GB, 3.35 TB/s spec (~3.0 measured copy)"

NB = 6        # blocks drawn along N
LN = 6.0      # length drawn for N
LD = 1.2      # width drawn for d


def frame(title, levels, caption):
    fig = plt.figure(figsize=(13.5, 6.6))
    axh = fig.add_axes([0.005, 0.10, 0.27, 0.80])
    axm = fig.add_axes([0.285, 0.10, 0.71, 0.80])
    blank(axh, (-0.1, 4.4), (-0.1, 7.8))
    hierarchy(axh, levels)
    fig.suptitle(title, fontsize=13, fontweight="bold", y=0.975)
    fig.text(0.01, 0.015, caption, fontsize=8.5, va="bottom", color="#222222")
    return fig, axh, axm


def matrices(ax, i, j, q_fc, k_fc, v_fc, s_fc, o_fc, s_label, s_ls="--", o_stats=True):
    """Q (N×d), Kᵀ (d×N), S (N×N), V (N×d), O (N×d) with block row i and block column j lit."""
    qx, sx, vx, ox = 0.6, 2.3, 9.0, 11.0
    # Q and its block row i
    blocked(ax, qx, 0, LD, LN, NB, 1, fc=HBM_PALE)
    box(ax, *cell(qx, 0, LD, LN, NB, 1, i, 0), fc=q_fc, text="Q$_i$", fs=10)
    ax.text(qx + LD / 2, -0.3, "Q  (N × d)", ha="center", va="top", fontsize=9)
    # Kᵀ and its block column j
    blocked(ax, sx, LN + 0.5, LN, LD, 1, NB, fc=HBM_PALE)
    box(ax, *cell(sx, LN + 0.5, LN, LD, 1, NB, 0, j), fc=k_fc, text="K$_j^T$", fs=10)
    ax.text(sx + LN + 0.15, LN + 0.5 + LD / 2, "Kᵀ  (d × N)", ha="left", va="center", fontsize=9)
    # S = Q Kᵀ, dashed where it never exists in device memory
    blocked(ax, sx, 0, LN, LN, NB, NB, ls=s_ls, ec="#777777")
    box(ax, *cell(sx, 0, LN, LN, NB, NB, i, j), fc=s_fc, text="S$_{ij}$", fs=10)
    ax.text(sx + LN / 2, 0.15, s_label, ha="center", va="bottom", fontsize=8.5, color="#555555")
    # V and its block row j (the keys of S's block column j)
    blocked(ax, vx, 0, LD, LN, NB, 1, fc=HBM_PALE)
    box(ax, *cell(vx, 0, LD, LN, NB, 1, j, 0), fc=v_fc, text="V$_j$", fs=10)
    ax.text(vx + LD / 2, -0.3, "V  (N × d)", ha="center", va="top", fontsize=9)
    # O (and ℓ, m) and block row i
    blocked(ax, ox, 0, LD, LN, NB, 1, fc=HBM_PALE)
    box(ax, *cell(ox, 0, LD, LN, NB, 1, i, 0), fc=o_fc, text="O$_i$", fs=10)
    ax.text(ox + LD / 2, -0.3, "O  (N × d)", ha="center", va="top", fontsize=9)
    if o_stats:
        for k, name in enumerate(("ℓ", "m")):
            x = ox + LD + 0.15 + 0.35 * k
            blocked(ax, x, 0, 0.25, LN, NB, 1, fc=HBM_PALE)
            box(ax, *cell(x, 0, 0.25, LN, NB, 1, i, 0), fc=o_fc)
            ax.text(x + 0.125, -0.3, name, ha="center", va="top", fontsize=9)
    # the key index j links S's column block to V's row block
    sxj = cell(sx, 0, LN, LN, NB, NB, i, j)
    vj = cell(vx, 0, LD, LN, NB, 1, j, 0)
    arrow(ax, (sxj[0] + sxj[2], sxj[1] + sxj[3] / 2), (vj[0], vj[1] + vj[3] / 2), color="#555555", lw=1.0, rad=-0.15,
          text="× V$_j$", fs=8, toff=(0, 0.35))
    return dict(qx=qx, sx=sx, vx=vx, ox=ox)


def rung03(out):
    T = 16
    levels = [
        ("Registers", REGS, REG, ["one element of S (or O)", "per thread: acc"]),
        ("Shared memory", SHARED, SMEM, ["Qs[16][17], Ks[16][17]  (pass 1)", "Ps[16][17], Vs[16][17]  (pass 3)",
                                         "+1 column: no bank conflicts"]),
        ("HBM", HBM_TEXT, HBM, ["Q, K, V, O", "S and P: N × N fp32 each,", "written and read back"]),
    ]
    fig, axh, ax = frame(
        "Rung 03: block matmul. T × T tiles (T = 16) staged in shared memory; S and P still go through HBM",
        levels,
        "One thread block of 16×16 threads computes one 16×16 tile of S (pass 1) or of O (pass 3), one element a thread. "
        "It walks the shared dimension in steps of T:\nload a 16×16 piece of each operand into shared memory once, "
        "then every thread reads it 16 times from there, so device-memory reads drop by T = 16. "
        "Pass 2 (softmax, rung 02's kernel) is unchanged.")
    blank(ax, (-0.3, 13.4), (-1.0, 8.6))
    i, j, c = 2, 3, 1
    # Pass 1: S = Q Kᵀ ------------------------------------------------------------------------
    qx, kx, w = 0.2, 1.7, 3.6
    nd = 4  # pieces of T along d drawn (d = 64 = 4·T)
    blocked(ax, qx, 0, LD, w, NB, nd, fc=HBM_PALE)
    box(ax, *cell(qx, 0, LD, w, NB, nd, i, c), fc=SMEM)
    box(ax, *cell(qx, 0, LD, w, NB, nd, i, 0, 1, nd), fc="none", ec=SMEM_DARK, lw=1.8)
    ax.text(qx + LD / 2, -0.3, "Q  (N × d)", ha="center", va="top", fontsize=9)
    blocked(ax, kx, w + 0.4, w, LD, nd, NB, fc=HBM_PALE)
    box(ax, *cell(kx, w + 0.4, w, LD, nd, NB, c, j), fc=SMEM)
    box(ax, *cell(kx, w + 0.4, w, LD, nd, NB, 0, j, nd, 1), fc="none", ec=SMEM_DARK, lw=1.8)
    ax.text(kx, w + 0.4 + LD + 0.15, "Kᵀ  (d × N)", ha="left", va="bottom", fontsize=9)
    blocked(ax, kx, 0, w, w, NB, NB, fc=HBM_PALE)
    box(ax, *cell(kx, 0, w, w, NB, NB, i, j), fc=REG, text="S tile\n16×16", fs=7)
    ax.text(kx + w / 2, -0.3, "S = Q Kᵀ · scale  (N × N, in HBM)", ha="center", va="top", fontsize=9)
    ax.text(kx + w / 2, w + 0.4 + LD + 0.75, "pass 1: S = Q Kᵀ", ha="center", fontsize=11, fontweight="bold")
    # loop over the shared dimension d: pieces c0 = 0, T, 2T, ...
    qc = cell(qx, 0, LD, w, NB, nd, i, 0, 1, nd)
    arrow(ax, (qc[0], qc[1] - 0.2), (qc[0] + qc[2], qc[1] - 0.2), color=SMEM_DARK, lw=1.2)
    kc = cell(kx, w + 0.4, w, LD, nd, NB, 0, j, nd, 1)
    arrow(ax, (kc[0] + kc[2] + 0.15, kc[1] + kc[3]), (kc[0] + kc[2] + 0.15, kc[1]), color=SMEM_DARK, lw=1.2,
          text="loop c0 = 0, T, …\n(d / T steps)", fs=7.5, toff=(0.2, 0), ha="left")
    # Pass 2 label
    ax.text(6.15, 1.8, "pass 2:\nsoftmax\nrow by row\n(rung 02)\nS → P\nin HBM", ha="center", va="center", fontsize=8.5,
            bbox=dict(boxstyle="round", fc=IDLE, ec=EDGE))
    arrow(ax, (5.5, 0.3), (6.9, 0.3), color=HBM_DARK)
    # Pass 3: O = P V ---------------------------------------------------------------------------
    px = 7.3
    vx = ox = px + w + 0.3
    blocked(ax, px, 0, w, w, NB, NB, fc=HBM_PALE)
    box(ax, *cell(px, 0, w, w, NB, NB, i, j), fc=SMEM)
    box(ax, *cell(px, 0, w, w, NB, NB, i, 0, 1, NB), fc="none", ec=SMEM_DARK, lw=1.8)
    ax.text(px + w / 2, -0.3, "P  (N × N, in HBM)", ha="center", va="top", fontsize=9)
    pc = cell(px, 0, w, w, NB, NB, i, 0, 1, NB)
    arrow(ax, (pc[0], pc[1] - 0.2), (pc[0] + pc[2], pc[1] - 0.2), color=SMEM_DARK, lw=1.2)
    ax.text(px + w / 2, pc[1] - 0.45, "loop j0 = 0, T, … (N / T steps)", ha="center", va="top", fontsize=7.5,
            color=SMEM_DARK)
    blocked(ax, vx, w + 0.4, LD, w, NB, nd, fc=HBM_PALE)
    box(ax, *cell(vx, w + 0.4, LD, w, NB, nd, j, c), fc=SMEM)
    box(ax, *cell(vx, w + 0.4, LD, w, NB, nd, 0, c, NB, 1), fc="none", ec=SMEM_DARK, lw=1.8)
    ax.text(vx + LD + 0.15, w + 0.4 + w / 2, "V\n(N × d)", ha="left", va="center", fontsize=9)
    blocked(ax, ox, 0, LD, w, NB, nd, fc=HBM_PALE)
    box(ax, *cell(ox, 0, LD, w, NB, nd, i, c), fc=REG)
    ax.text(ox + LD / 2, -0.3, "O = P V", ha="center", va="top", fontsize=9)
    ax.text(px + w / 2, w + 0.5, "pass 3: O = P V", ha="center", fontsize=11, fontweight="bold")
    legend_where(fig, y=0.89)
    ax.text(kx + w / 2, w / 2 - 0.9, "tile written\nto HBM", ha="center", fontsize=7.5, color=HBM_DARK)
    save(fig, out_path(out, "tiling_03_block_matmul.png"))


def rung04(out):
    levels = [
        ("Registers", REGS, REG, ["S$_{ij}$: 4×4 entries a thread", "(256 threads, 64×64 block)"]),
        ("Shared memory", SHARED, SMEM, ["K$_j$, V$_j$: loaded once per j", "Q$_i$: loaded every (i, j) step",
                                         "$\\tilde{P}_{ij}$ = exp(S$_{ij}$ − $\\tilde{m}$)"]),
        ("HBM", HBM_TEXT, HBM, ["Q, K, V", "O$_i$, ℓ$_i$, m$_i$: read and written", "on every (i, j) step"]),
    ]
    fig, axh, ax = frame(
        "Rung 04: FlashAttention-1 loop order. K/V blocks outer, Q blocks inner; O, ℓ, m go back to HBM every step",
        levels,
        "One thread block per (batch, head) walks every (i, j) pair: B$_r$ × B$_c$ = 64 × 64 at d = 64 "
        "(budget M = 16384 floats: B$_c$ = ⌈M / 4d⌉, B$_r$ = min(B$_c$, d)). S and P never exist in HBM, "
        "but the running O$_i$, ℓ$_i$, m$_i$\nmake a round trip through HBM on every step, "
        "T$_c$ times over, and a 16-head problem keeps only 16 of the H100's 132 SMs busy.")
    blank(ax, (-1.6, 14.4), (-0.8, 8.6))
    i, j = 2, 3
    p = matrices(ax, i, j, SMEM, SMEM, SMEM, REG, HBM, "S = Q Kᵀ, dashed: never stored in HBM")
    # outer loop over j: along Kᵀ
    y = LN + 0.5 + LD + 0.25
    arrow(ax, (p["sx"], y), (p["sx"] + LN, y), color=SMEM_DARK, lw=2.0,
          text="OUTER loop over j = 1 … T$_c$: K$_j$, V$_j$ loaded into shared memory once", fs=9, toff=(0, 0.3))
    # inner loop over i: along Q
    arrow(ax, (p["qx"] - 0.3, LN), (p["qx"] - 0.3, 0), color=SMEM_DARK, lw=2.0)
    ax.text(p["qx"] - 0.85, LN / 2, "INNER loop over i = 1 … T$_r$\n(all of Q for every j)", rotation=90,
            ha="center", va="center", fontsize=9, color=SMEM_DARK)
    # the round trip of O_i, ℓ_i, m_i
    oc = cell(p["ox"], 0, LD, LN, NB, 1, i, 0)
    arrow(ax, (oc[0] - 0.3, oc[1] + oc[3] / 2), (oc[0] - 0.3, LN + 0.45), style="<|-|>", color=HBM_DARK, lw=1.6)
    ax.text(oc[0] + 0.9, LN + 0.55, "O$_i$, ℓ$_i$, m$_i$: read from and\nwritten back to HBM\non every (i, j) step",
            fontsize=8.5, color=HBM_DARK, ha="center", va="bottom")
    legend_where(fig)
    save(fig, out_path(out, "tiling_04_fa1_loop_order.png"))


def rung05(out):
    levels = [
        ("Registers", REGS, REG, ["S$_{ij}$: 4×4 entries a thread", "O$_i$, m$_i$, ℓ$_i$: for the block's life",
                                  "(divided by ℓ$_i$ once, at the end)"]),
        ("Shared memory", SHARED, SMEM, ["Q$_i$: loaded once", "K$_j^T$, V$_j$: streamed, one j a step",
                                         "$\\tilde{P}_{ij}$ reuses K$_j^T$'s space"]),
        ("HBM", HBM_TEXT, HBM, ["Q, K, V read", "O and log-sum-exp written once", "nothing else"]),
    ]
    fig, axh, ax = frame(
        "Rung 05: FlashAttention-2 loop order. Q blocks outer (one per thread block), K/V streamed, O, ℓ, m on chip",
        levels,
        "The grid is (Q block, head, batch): N = 4096 with 16 heads gives 64 × 16 = 1024 thread blocks (rung 04 had 16). "
        "B$_r$ = B$_c$ = 64; 256 threads as 16 × 16,\neach owning 4 rows × 4 keys of S$_{ij}$ and 4 rows of O$_i$. "
        "O$_i$ = diag(ℓ$_i$)⁻¹ $\\tilde{O}_i$ and lse$_i$ = m$_i$ + log ℓ$_i$ are written once, after the last K/V block.")
    blank(ax, (-1.6, 14.4), (-0.8, 8.6))
    i, j = 2, 3
    p = matrices(ax, i, j, SMEM, SMEM, SMEM, REG, REG, "S = Q Kᵀ, dashed: never stored in HBM")
    # other thread blocks: the other Q blocks, in parallel
    for r in range(NB):
        if r != i:
            x, yb, w, h = cell(p["qx"], 0, LD, LN, NB, 1, r, 0)
            ax.text(x + w / 2, yb + h / 2, "block %d" % r, ha="center", va="center", fontsize=6.5, color="#777777")
    y = LN + 0.5 + LD + 0.25
    arrow(ax, (p["sx"], y), (p["sx"] + LN, y), color=SMEM_DARK, lw=2.0,
          text="INNER loop over j = 1 … T$_c$: K$_j$, V$_j$ streamed through shared memory", fs=9, toff=(0, 0.3))
    ax.text(p["qx"] - 0.55, LN / 2, "OUTER \"loop\" over i: one thread block\nper Q block, all in parallel",
            rotation=90, ha="center", va="center", fontsize=9, color=REG_DARK)
    for r in range(NB):
        x, yb, w, h = cell(p["qx"], 0, LD, LN, NB, 1, r, 0)
        ax.plot([p["qx"] - 0.2, p["qx"] - 0.05], [yb + h / 2] * 2, color=REG_DARK, lw=1.5)
    ax.text(p["ox"] + 0.9, LN + 0.55, "O$_i$, m$_i$, ℓ$_i$ stay in registers;\nO$_i$ / ℓ$_i$ and lse$_i$ go to HBM\nonce, after the last j",
            fontsize=8.5, color=HBM_DARK, ha="center", va="bottom")
    legend_where(fig)
    save(fig, out_path(out, "tiling_05_fa2_loop_order.png"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="folder for the PNG files (default docs/figures)")
    args = ap.parse_args(argv)
    rung03(args.out)
    rung04(args.out)
    rung05(args.out)


if __name__ == "__main__":
    main()
