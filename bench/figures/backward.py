#!/usr/bin/env python3
"""Rung 07: the dataflow of one step of the recomputing backward pass (a figure of the idea).

    python3 bench/figures/backward.py [--out docs/figures]

writes backward_dataflow.png: one thread block keeps K_j, V_j on chip and dK_j, dV_j in registers
while the Q blocks stream past; per step (i, j) it recomputes Sᵀ and Pᵀ from Q_i and the saved
log-sum-exp L_i, forms dPᵀ and dSᵀ = Pᵀ ∘ (dPᵀ − D_i), accumulates dV_j and dK_j in registers and
adds dQ_i += dS K_j to an fp32 buffer in HBM with atomics. The structure is
steps/07_backward_recompute/v1_mma.cu's (4 warps, 16 keys each, B_c = 64, B_r = 64); later
versions change the split across warps, not the dataflow.
"""
import argparse

import matplotlib.pyplot as plt

from figkit import (DEFAULT_OUT, EDGE, HBM, HBM_DARK, HBM_PALE, REG, REG_DARK, SMEM, SMEM_DARK, arrow, blank, box,
                    out_path, save)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="folder for the PNG files (default docs/figures)")
    args = ap.parse_args(argv)

    fig, ax = plt.subplots(figsize=(14, 8.2))
    blank(ax, (-2.6, 22.2), (-0.6, 13.4))
    # the three levels as bands
    bands = [(0, 2.6, HBM_PALE, "HBM", HBM_DARK), (3.4, 3.0, "#fff1e4", "Shared\nmemory", SMEM_DARK),
             (7.2, 5.6, "#edf8e9", "Registers", REG_DARK)]
    for y, h, fc, name, tc in bands:
        box(ax, -2.4, y, 24.4, h, fc=fc, ec="#bbbbbb", z=0)
        ax.text(-1.5, y + h / 2, name, ha="center", va="center", fontsize=11, fontweight="bold", color=tc)

    fs = 8.5
    # HBM
    box(ax, 0.0, 0.4, 3.2, 1.8, fc=HBM_PALE, text="K$_j$, V$_j$\nread once per\nthread block", fs=fs)
    box(ax, 4.0, 0.4, 3.6, 1.8, fc=HBM, text="Q$_i$, dO$_i$  (bf16/fp16)\nL$_i$, D$_i$  (fp32)\nread every step", fs=fs)
    box(ax, 11.2, 0.4, 4.4, 1.8, fc=HBM, text="dQ accumulator, fp32\n[B, H, N, d]: atomicAdd\nevery step", fs=fs)
    box(ax, 17.0, 0.4, 4.6, 1.8, fc=HBM_PALE, text="dK$_j$, dV$_j$\nwritten once, after the\nlast Q block", fs=fs)
    # shared memory
    box(ax, 0.0, 3.8, 3.2, 2.2, fc=SMEM, text="K$_j$, V$_j$\n64 keys × d\nresident", fs=fs)
    box(ax, 4.0, 3.8, 3.6, 2.2, fc=SMEM, text="Q$_i$, dO$_i$, L$_i$, D$_i$\ntwo buffers: step s+1\narrives (cp.async)\n"
        "while step s computes", fs=fs)
    box(ax, 11.2, 3.8, 3.2, 2.2, fc=SMEM, text="dS$_i^T$\n(16-bit, 64 × 64)\nso dQ can take it\nby query rows", fs=fs)
    # registers: the five products and the elementwise steps
    bw, bh = 3.5, 1.6
    box(ax, 0.0, 10.7, bw, bh, fc=REG, text="S$^T$ = K$_j$ Q$_i^T$\n(mma)", fs=fs)
    box(ax, 4.4, 10.7, bw, bh, fc=REG, text="P$^T$ = exp(S$^T$·scale − L$_i$)\n(exp2, recomputed)", fs=fs)
    box(ax, 0.0, 7.7, bw, bh, fc=REG, text="dP$^T$ = V$_j$ dO$_i^T$\n(mma)", fs=fs)
    box(ax, 4.4, 7.7, bw, bh, fc=REG, text="dS$^T$ = P$^T$ ∘ (dP$^T$ − D$_i$)\n(in place)", fs=fs)
    box(ax, 9.6, 10.7, 3.8, bh, fc=REG, ec=REG_DARK, lw=2, text="dV$_j$ += P$^T$ dO$_i$\n(mma, C is A: P$^T$ stays)",
        fs=fs)
    box(ax, 9.6, 7.7, 3.8, bh, fc=REG, ec=REG_DARK, lw=2, text="dK$_j$ += dS$^T$ Q$_i$\n(mma, C is A: dS$^T$ stays)",
        fs=fs)
    box(ax, 15.2, 7.7, 3.6, bh, fc=REG, text="dQ$_i$ part = dS$_i$ K$_j$\n(mma; dS by query rows,\nldmatrix.trans)", fs=fs)
    ax.text(11.5, 10.35, "accumulated in registers over every Q block i", ha="center", fontsize=8, color=REG_DARK)

    c = "#333333"
    # registers chain
    arrow(ax, (3.5, 11.5), (4.4, 11.5), color=c)
    arrow(ax, (3.5, 8.5), (4.4, 8.5), color=c)
    arrow(ax, (6.15, 10.7), (6.15, 9.3), color=c)          # Pᵀ into dSᵀ
    arrow(ax, (7.9, 11.5), (9.6, 11.5), color=c)          # Pᵀ to dV
    arrow(ax, (7.9, 8.5), (9.6, 8.5), color=c)            # dSᵀ to dK
    # shared -> registers (ldmatrix)
    arrow(ax, (1.0, 6.0), (1.0, 7.7), color=SMEM_DARK, text="K$_j$, V$_j$\n(ldmatrix)", fs=7.5, toff=(-0.05, 0),
          ha="right")
    arrow(ax, (5.2, 6.0), (5.2, 7.7), color=SMEM_DARK, text="Q$_i$, dO$_i$,\nL$_i$, D$_i$", fs=7.5, toff=(-0.1, 0),
          ha="right")
    arrow(ax, (7.6, 5.7), (9.9, 7.7), color=SMEM_DARK, rad=-0.1)
    ax.text(9.35, 7.5, "Q$_i$, dO$_i$", fontsize=7.5, color=SMEM_DARK, ha="right", va="center")
    arrow(ax, (2.7, 6.0), (2.7, 7.7), color=SMEM_DARK)
    # dSᵀ regs -> smem -> dQ
    arrow(ax, (7.0, 7.7), (11.2, 5.0), color=SMEM_DARK, rad=0.25)
    ax.text(10.4, 6.5, "dS$^T$ (16-bit)", fontsize=7.5, color=SMEM_DARK, ha="left", va="center")
    arrow(ax, (14.4, 5.2), (16.2, 7.7), color=SMEM_DARK, rad=0.15)
    ax.text(15.6, 6.2, "dS (ldmatrix.trans), K$_j$", fontsize=7.5, color=SMEM_DARK, ha="left", va="center")
    # HBM -> shared
    arrow(ax, (1.6, 2.2), (1.6, 3.8), color=HBM_DARK, text="once", fs=7.5, toff=(0.15, 0), ha="left")
    arrow(ax, (5.8, 2.2), (5.8, 3.8), color=HBM_DARK, text="cp.async,\nevery step", fs=7.5, toff=(0.15, 0), ha="left")
    # dQ atomics, dK/dV at the end
    arrow(ax, (17.0, 7.7), (14.6, 2.2), color=HBM_DARK, lw=1.8, rad=0.1, text="float2 atomicAdd\nevery step", fs=8,
          toff=(1.15, 0))
    ax.plot([13.4, 21.2], [11.7, 11.7], color=HBM_DARK, ls="--", lw=1.4, zorder=5)
    ax.plot([13.4, 13.9], [9.0, 9.0], color=HBM_DARK, ls="--", lw=1.4, zorder=5)
    ax.plot([13.9, 13.9], [9.0, 11.7], color=HBM_DARK, ls="--", lw=1.4, zorder=5)
    arrow(ax, (21.2, 11.7), (21.2, 2.2), color=HBM_DARK, ls="--", lw=1.4)
    ax.text(21.0, 4.9, "after the last i:\ndK$_j$ · scale, dV$_j$\n(once)", fontsize=8, color=HBM_DARK, ha="right",
            va="center")
    ax.text(17.5, 12.15, "for every Q block i of the group's query heads: one step, as drawn", ha="center",
            fontsize=8.5, color="#333333")
    fig.suptitle("Rung 07: one step (i, j) of the backward pass. K$_j$, V$_j$ stay on chip, Q$_i$, dO$_i$, L$_i$, D$_i$ "
                 "stream past, P is recomputed", fontsize=12.5, fontweight="bold")
    fig.text(0.01, 0.01, "One thread block per (K/V block j, key/value head, batch); in v1_mma 4 warps own 16 keys each "
             "(B$_c$ = 64), steps take B$_r$ = 64 query rows. Sᵀ and dPᵀ are computed transposed so that each warp\n"
             "holds its keys' rows as C fragments, which are the A operands of dV$_j$ and dK$_j$. L = log-sum-exp saved by "
             "the forward. Around this kernel: D = rowsum(dO ∘ O) and dQ's zeroed accumulator\nbefore it, "
             "dQ = scale · accumulator (in the dtype) after it.", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    save(fig, out_path(args.out, "backward_dataflow.png"))


if __name__ == "__main__":
    main()
