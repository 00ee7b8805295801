#!/usr/bin/env python3
"""Rung 11's model of the ring, executable: when do P GPUs hide the passing of K/V shards behind the
local attention, and what parallel efficiency does that leave? (docs/11_ring_attention.md, "When
the ring hides its communication".)

A step of the ring computes the attention of a rank's L = N / P queries to one visiting K/V shard
while the next shard travels over the link. On its own stream the transfer overlaps the compute,
so a step takes max(compute, transfer), except the first (nothing to wait for) and, in the
backward, the last hop of the dK/dV accumulators (nothing to hide behind):

    forward    T_P = c_0 + sum_{s=1..P-1} max(c_s, x)              x = kv / beta
    backward   T_P = b_0 + sum_{s=1..P-1} max(b_s, x + x_acc) + x_acc   x_acc = dkv / beta

where c_s = flops of step s / F (a full step is 4·B·H·L²·d; zigzag causal: half of it at every
step), b_s = 2.5 c_s·F / F_bwd, kv = 2·B·Hkv·L·d·e and dkv = 2·B·Hkv·L·d·4. The same kernels on one
GPU take T_1 = (flops of the whole problem) / F. Parallel efficiency = T_1 / (P · T_P). F and beta
are taken as constants (the rates ring_probe measured): at short L the kernels run below F, so the
model is optimistic there; where it says the ring cannot hide, it cannot.

    python3 bench/ring_model.py --probe ring.json                  # the rates ring_probe measured
    python3 bench/ring_model.py --F 600 --F-bwd 450 --beta 300 --plot docs/figures/ring_model.png
    python3 bench/ring_model.py --self-test
"""
from __future__ import annotations

import argparse
import json
import math
import sys


def step_times(N: int, P: int, B: int, H: int, Hkv: int, d: int, e: int, causal: bool,
               F: float, F_bwd: float, beta: float) -> dict:
    """Seconds per step of the forward and backward, the transfers, and the one-GPU times."""
    L = N / P
    full = 4.0 * B * H * L * L * d                       # FLOPs of a full step
    frac = 0.5 if causal else 1.0                          # zigzag causal: half a shard every step
    c = frac * full / F
    b = 2.5 * frac * full / F_bwd
    kv = 2.0 * B * Hkv * L * d * e
    dkv = 2.0 * B * Hkv * L * d * 4
    whole = 4.0 * B * H * N * N * d * (0.5 if causal else 1.0)
    return dict(L=L, c=c, b=b, x=kv / beta, x_acc=dkv / beta, t1_fwd=whole / F, t1_bwd=2.5 * whole / F_bwd)


def efficiency(N: int, P: int, **kw) -> dict:
    """Predicted parallel efficiency of the forward, the backward, and both together."""
    t = step_times(N, P, **kw)
    fwd = t["c"] + (P - 1) * max(t["c"], t["x"])
    bwd = t["b"] + (P - 1) * max(t["b"], t["x"] + t["x_acc"]) + (t["x_acc"] if P > 1 else 0.0)
    return dict(N=N, L=t["L"], fwd=t["t1_fwd"] / (P * fwd), bwd=t["t1_bwd"] / (P * bwd),
                both=(t["t1_fwd"] + t["t1_bwd"]) / (P * (fwd + bwd)),
                fwd_hides=t["c"] >= t["x"], bwd_hides=t["b"] >= t["x"] + t["x_acc"])


def hiding_length(H: int, Hkv: int, e: int, causal: bool, F: float, F_bwd: float, beta: float) -> tuple:
    """L* of the forward and of the backward: the local length from which a step's compute covers
    its transfer (the chapter's closed forms)."""
    k = 2.0 if causal else 1.0
    return k * (Hkv / H) * e * F / (2 * beta), k * (Hkv / H) * (e + 4) * F_bwd / (5 * beta)


def self_test() -> int:
    kw = dict(B=1, H=32, Hkv=8, d=128, e=2, causal=True, F=600e12, F_bwd=450e12, beta=300e9)
    fails = []
    lf, lb = hiding_length(32, 8, 2, True, 600e12, 450e12, 300e9)
    # At L just above L*, a step's compute covers its transfer; just below, it does not.
    for L, hides in ((lf * 1.01, True), (lf * 0.99, False)):
        r = efficiency(int(2 * L), 2, **kw)
        if r["fwd_hides"] != hides:
            fails.append(f"forward at L = {L:.0f} (L* = {lf:.0f}) hides = {r['fwd_hides']}")
    for L, hides in ((lb * 1.01, True), (lb * 0.99, False)):
        if efficiency(int(2 * L), 2, **kw)["bwd_hides"] != hides:
            fails.append(f"backward at L = {L:.0f} (L* = {lb:.0f})")
    # One GPU: efficiency 1. Long sequences: the forward's tends to 1, the backward's stays below
    # by the unhidden last hop, which shrinks like 1/L.
    one = efficiency(4096, 1, **kw)
    if abs(one["fwd"] - 1) > 1e-12 or abs(one["bwd"] - 1) > 1e-12:
        fails.append(f"P = 1 gives {one}")
    big = efficiency(1 << 22, 2, **kw)
    if not (abs(big["fwd"] - 1) < 1e-9 and 0.99 < big["bwd"] < 1):
        fails.append(f"long sequence: {big}")
    # Far below L*, efficiency falls like L / L* (the transfer dominates every step).
    small = efficiency(64, 8, **kw)
    if not small["fwd"] < 0.05:
        fails.append(f"short sequence: {small}")
    for f in fails:
        print("ring_model self-test FAILED:", f)
    if not fails:
        print("ring_model self-test passed")
    return 1 if fails else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", help="JSON written by bench/ring_probe (F, F_bwd and the link's beta)")
    ap.add_argument("--F", type=float, help="forward kernel rate, TFLOP/s")
    ap.add_argument("--F-bwd", type=float, help="backward kernel rate, TFLOP/s")
    ap.add_argument("--beta", type=float, help="link rate each way, GB/s")
    ap.add_argument("--gpus", type=int, default=2, help="P (default 2)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--bytes", type=int, default=2, help="bytes an element (2: fp16/bf16)")
    ap.add_argument("--no-causal", dest="causal", action="store_false", help="full attention (default: causal, zigzag)")
    ap.add_argument("--plot", help="write efficiency against N to this PNG")
    ap.add_argument("--self-test", action="store_true", help="check the model against its limits")
    a = ap.parse_args(argv)
    if a.self_test:
        return self_test()
    F, F_bwd, beta, source = a.F, a.F_bwd, a.beta, "given"
    measured = []  # ring_probe --efficiency's entries: N, version, forward and forward + backward efficiency
    if a.probe:
        with open(a.probe) as f:
            p = json.load(f)
        links = p.get("links") or []
        if not links:
            sys.exit(f"ring_model: {a.probe} has no link measurement (ring_probe ran on one GPU)")
        F = F or p["fwd"]["tflops"]
        F_bwd = F_bwd or p["bwd"]["tflops"] or F / 1.4
        beta = beta or max(l["GBps"] for l in links)
        source = f"{p.get('device', '?')}, {p.get('date', '?')}"
        measured = [e for e in p.get("efficiency", []) if e.get("efficiency")]
    if not (F and F_bwd and beta):
        ap.error("give --probe, or --F, --F-bwd and --beta")
    kw = dict(B=a.batch, H=a.heads, Hkv=a.kv_heads, d=a.head_dim, e=a.bytes, causal=a.causal,
              F=F * 1e12, F_bwd=F_bwd * 1e12, beta=beta * 1e9)
    lf, lb = hiding_length(a.heads, a.kv_heads, a.bytes, a.causal, kw["F"], kw["F_bwd"], kw["beta"])
    print(f"rates ({source}): F = {F:g} TFLOP/s, F_bwd = {F_bwd:g} TFLOP/s, beta = {beta:g} GB/s each way")
    print(f"hiding lengths per GPU: forward L* = {lf:.0f}, backward L* = {lb:.0f}"
          f" ({'causal zigzag' if a.causal else 'full attention'}; N* = P·L*: {a.gpus * lf:.0f} and {a.gpus * lb:.0f})")
    rows = [efficiency(1 << k, a.gpus, **kw) for k in range(10, 22) if (1 << k) % (2 * a.gpus) == 0]
    print(f"{'N':>9} {'L':>8} {'fwd':>6} {'bwd':>6} {'both':>6}")
    for r in rows:
        print(f"{r['N']:>9} {r['L']:>8.0f} {r['fwd']:6.3f} {r['bwd']:6.3f} {r['both']:6.3f}")
    for e in measured:  # the ring as timed, beside the model at the same N
        m = efficiency(e["N"], a.gpus, **kw)
        both = e.get("efficiency_fwd_bwd")
        print(f"measured at N = {e['N']}, {e.get('version', 'v2_nccl')}: forward {e['efficiency']:.3f} (model {m['fwd']:.3f})"
              + (f", forward + backward {both:.3f} (model {m['both']:.3f})" if both else ""))
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for key, label in (("fwd", "forward"), ("bwd", "backward"), ("both", "forward + backward")):
            ax.plot([r["N"] for r in rows], [r[key] for r in rows], marker="o", label=label)
        styles = {"v2_nccl": "kx", "v3_kept": "k+", "v4_overlap": "k^", "v5_backward": "ks"}
        for v in sorted({e.get("version", "v2_nccl") for e in measured}):
            pts = [e for e in measured if e.get("version", "v2_nccl") == v]
            ax.plot([e["N"] for e in pts], [e["efficiency"] for e in pts], styles.get(v, "ko"), ms=7, mfc="none",
                    label=f"forward, measured ({v})")
            both = [e for e in pts if e.get("efficiency_fwd_bwd")]
            if both:
                ax.plot([e["N"] for e in both], [e["efficiency_fwd_bwd"] for e in both], "r*", ms=11,
                        label=f"forward + backward, measured ({v})")
        ax.axvline(a.gpus * lf, ls=":", color="gray")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, max([1.05] + [e["efficiency"] + 0.05 for e in measured]))
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(f"parallel efficiency on {a.gpus} GPUs")
        ax.set_title(f"The ring's model ({source})")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
        print("wrote", a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
