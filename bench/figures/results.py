#!/usr/bin/env python3
"""Figures of the measured data: a roofline per GPU and the ladder's TFLOP/s at one shape.

    python3 bench/figures/results.py [--results docs/results] [--out docs/figures]

reads docs/results/io.json (DRAM bytes from Nsight Compute, bench/ncu_io.py), bench.json
(ladder_bench: time and modelled bytes per rung over N) and torch.json (bench/compare_torch.py:
every rung beside PyTorch's SDPA backends in the same run), and writes, per GPU found:

  roofline_<gpu>.png       every rung at the shapes io.json measured (B=1, H=16, d=64, N=1024 and
                           4096): x = FLOPs / DRAM bytes, y = TFLOP/s, under the GPU's roofs
                           (HBM bandwidth, FFMA and dense bf16 tensor-core peaks). Rungs io.json
                           has no measurement for are placed by their modelled bytes, hollow.
  ladder_tflops_<gpu>.png  one bar per rung (its best version) at N = 4096, d = 64, non-causal:
                           forward on the left (fp32 rungs at B=1, tensor-core rungs in bf16 at
                           B=4, as torch.json ran them), backward on the right, with PyTorch's
                           FlashAttention-2 and cuDNN (same run) as reference lines.

The peaks are the anchors' (see PEAKS below); a GPU without an entry gets no roofline.
"""
import argparse
import json
import os
import re
import sys
from collections import defaultdict

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from figkit import DEFAULT_OUT, REPO, save

# Physical limits (from the project's anchors): HBM copy bandwidth measured, peaks as specified.
PEAKS = {
    "H100": dict(bw=3.0e12, bw_text="HBM ~3.0 TB/s (measured copy; 3.35 spec)", ffma=67e12, tensor=989e12),
    "H200": dict(bw=4.3e12, bw_text="HBM ~4.3 TB/s (measured copy; 4.8 spec)", ffma=67e12, tensor=989e12),
}

RUNG_COLORS = {"00": "#7f7f7f", "01": "#bcbd22", "02": "#17becf", "03": "#9467bd", "04": "#d62728", "05": "#ff7f0e",
               "06": "#2ca02c", "07": "#1f77b4", "08": "#8c564b"}
SHORT = {"00_naive_eigen": "00 naive", "01_safe_softmax": "01 safe softmax", "02_online_softmax": "02 online softmax",
         "03_block_matmul": "03 block matmul", "04_fa1_loop_order": "04 FA1 order", "05_fa2_loop_order": "05 FA2 order",
         "06_tensor_core_mma": "06 tensor cores", "07_backward_recompute": "07 backward",
         "08_hopper_forward": "08 Hopper forward"}


def peaks_for(device):
    for key, p in PEAKS.items():
        if key in device:
            return p
    return None


def slug(text):
    m = re.search(r"(H100|H200|A100|L40S?|B200)", text)
    return (m.group(1) if m else re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")).lower()


def parse_label(label):
    return dict(item.split("=", 1) for item in (label or "").split() if "=" in item)


def bench_records(path):
    """bench.json -> {(rung, dtype, phase, B, H, N, d, causal): (time_ms, tflops, modelled_bytes)}, the
    median over repetitions (or the median run)."""
    with open(path) as f:
        doc = json.load(f)
    runs = defaultdict(list)
    for b in doc.get("benchmarks", []):
        info = parse_label(b.get("label"))
        if "rung" not in info or b.get("error_occurred"):
            continue
        key = (info["rung"], info["dtype"], info.get("phase", "fwd"), int(info["B"]), int(info["H"]), int(info["N"]),
               int(info["d"]), int(info["causal"]))
        runs[key].append(b)
    unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
    out = {}
    for key, entries in runs.items():
        med = [e for e in entries if e.get("aggregate_name") == "median"]
        if med:
            e = med[0]
        else:
            its = sorted((e for e in entries if e.get("run_type", "iteration") == "iteration"), key=lambda e: e["real_time"])
            e = its[len(its) // 2]
        out[key] = (e["real_time"] * unit.get(e.get("time_unit", "ns"), 1e-6), e.get("TFLOP/s"), e.get("modelled_bytes"))
    return doc.get("context", {}).get("gpu", "unknown GPU"), out


def best_version(bench, rung_prefix, dtype, phase, shape):
    """The version of a rung with the highest TFLOP/s at shape (B, H, N, d, causal)."""
    cands = [(v[1], k[0]) for k, v in bench.items()
             if k[0].split("/")[0] == rung_prefix and k[1] == dtype and k[2] == phase and k[3:] == shape and v[1]]
    return max(cands)[1] if cands else None


def roofline(io_rows, bench, gpu, out):
    p = peaks_for(gpu)
    if p is None:
        print("results.py: no peaks known for %s; roofline not drawn" % gpu, file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(11, 6.6))
    xs = [0.5, 3e4]
    ridge_f = p["ffma"] / p["bw"]
    ridge_t = p["tensor"] / p["bw"]
    ax.plot([xs[0], ridge_t], [p["bw"] * xs[0] / 1e12, p["tensor"] / 1e12], color="black", lw=1.6)
    ax.plot([ridge_t, xs[1]], [p["tensor"] / 1e12] * 2, color="black", lw=1.6)
    ax.plot([ridge_f, xs[1]], [p["ffma"] / 1e12] * 2, color="black", lw=1.2, ls="--")
    ax.text(xs[1] / 1.1, p["tensor"] / 1e12 * 1.08, "dense bf16 tensor-core peak, %.0f TFLOP/s (spec)" % (p["tensor"] / 1e12),
            ha="right", va="bottom", fontsize=8.5)
    ax.text(xs[1] / 1.1, p["ffma"] / 1e12 * 1.08, "fp32 FFMA peak, ~%.0f TFLOP/s" % (p["ffma"] / 1e12), ha="right",
            va="bottom", fontsize=8.5)
    # the points: io.json's measured bytes with bench.json's time at the same shape
    placed = {}
    for r in io_rows:
        if r.get("device") != gpu:
            continue
        shape = (1, int(r["heads"]), int(r["seq"]), int(r["head_dim"]), int(r["causal"]))
        rec = bench.get((r["rung"], "fp32", "fwd") + shape)
        if rec is None:
            continue
        flops = 4.0 * shape[1] * shape[2] ** 2 * shape[3] * (0.5 if shape[4] else 1.0)
        nbytes = r["measured_read"] + r["measured_written"]
        placed.setdefault(r["rung"], []).append((shape[2], flops / nbytes, flops / (rec[0] * 1e-3) / 1e12,
                                                 nbytes / (rec[0] * 1e-3), True))
    # rungs with no ncu measurement: modelled bytes, hollow
    for prefix, dtype in (("06_tensor_core_mma", "bf16"),):
        for n in (1024, 4096):
            shape = (1, 16, n, 64, 0)
            v = best_version(bench, prefix, dtype, "fwd", (1, 16, 4096, 64, 0))
            rec = bench.get((v, dtype, "fwd") + shape) if v else None
            if rec and rec[2]:
                flops = 4.0 * 16 * n * n * 64
                placed.setdefault(v, []).append((n, flops / rec[2], flops / (rec[0] * 1e-3) / 1e12, rec[2] / (rec[0] * 1e-3), False))
    label_off = {"00_naive_eigen": (-12, 16), "01_safe_softmax": (-12, 0), "02_online_softmax": (-12, -16),
                 "03_block_matmul": (16, 0), "04_fa1_loop_order": (10, -16), "05_fa2_loop_order": (8, -6)}
    for rung, pts in sorted(placed.items()):
        pts.sort()
        color = RUNG_COLORS.get(rung[:2], "black")
        measured = pts[0][4]
        ax.plot([q[1] for q in pts], [q[2] for q in pts], color=color, lw=1, alpha=0.6)
        for n, x, y, bw, meas in pts:
            ax.plot(x, y, marker="o" if n == 4096 else "s", markersize=8 if n == 4096 else 6, color=color,
                    markerfacecolor=color if meas else "white", markeredgewidth=1.6, linestyle="none")
        n, x, y, bw, _ = pts[-1]
        name = SHORT.get(rung.split("/")[0], rung) + ("" if "/" not in rung else " " + rung.split("/")[1])
        text = "%s: %.3g TFLOP/s, %.0f GB/s of DRAM" % (name, y, bw / 1e9)
        if not measured:
            text = ("%s (bf16): %.0f TFLOP/s\nplaced by modelled bytes (io.json has no ncu row); L2 serves\n"
                    "most K/V re-reads, so the DRAM point lies further right" % (name, y))
        ax.annotate(text, (x, y), textcoords="offset points", xytext=label_off.get(rung, (8, -4)), fontsize=8,
                    color=color, ha="right" if label_off.get(rung, (8, 0))[0] < 0 else "left", va="center")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*xs)
    ax.set_ylim(0.3, 2500)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: "%g" % v))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: "%g" % v))
    # the bandwidth roof's label, along the line
    x0 = 0.9
    y0 = p["bw"] * x0 / 1e12
    a = ax.transData.transform([(x0, y0), (x0 * 10, y0 * 10)])
    import math
    angle = math.degrees(math.atan2(a[1][1] - a[0][1], a[1][0] - a[0][0]))
    ax.text(x0, y0 * 1.5, p["bw_text"], rotation=angle, rotation_mode="anchor", fontsize=8.5, ha="left", va="bottom",
            transform_rotates_text=True)
    ax.set_xlabel("arithmetic intensity: FLOPs / DRAM bytes (bytes measured by Nsight Compute, dram__bytes_read + write)")
    ax.set_ylabel("TFLOP/s (4·B·H·N²·d / time)")
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title("Roofline, %s: forward, B=1 H=16 d=64 non-causal; circles N=4096, squares N=1024\n"
                 "rungs 00–04 sit far below both roofs: not bandwidth-bound (00–02 latency/instruction-bound; 04 keeps 16 of 132 SMs busy)"
                 % gpu, fontsize=10.5)
    r05 = next((r for r in io_rows if r["rung"] == "05_fa2_loop_order" and r["seq"] == 4096 and r.get("device") == gpu), None)
    gap = ("" if r05 is None else " (rung 05 at N=4096: modelled %.2g GB, measured %.2g MB)" % (
        (r05["modelled_read"] + r05["modelled_written"]) / 1e9, (r05["measured_read"] + r05["measured_written"]) / 1e6))
    fig.text(0.01, 0.01, "Data: docs/results/io.json (bytes), bench.json (time, same shape, median). Hollow: bytes from "
             "the rung's IO model, not measured%s.\nRoofs: anchors (HBM copy bandwidth measured; peaks as specified)." % gap,
             fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    save(fig, os.path.join(out, "roofline_%s.png" % slug(gpu)))


def torch_rows(path):
    with open(path) as f:
        rows = json.load(f)
    return [r for r in rows if isinstance(r, dict) and r.get("kind") in ("rung", "sdpa") and r.get("tflops")
            and r.get("passed") is not False]


def bars(rows, out):
    """ladder_tflops_<gpu>.png from torch.json: N = 4096, d = 64, non-causal."""
    by_dev = defaultdict(list)
    for r in rows:
        by_dev[r["device"]].append(r)
    for gpu, rs in by_dev.items():
        def pick(name_prefix, dtype, phase, batch):
            def named(r):
                version = r["name"].split(" ")[0]
                return version.startswith(name_prefix) if name_prefix.endswith("/") else version == name_prefix

            c = [r for r in rs if named(r) and r["dtype"] == dtype and r["phase"] == phase
                 and r["seq_q"] == 4096 and r["head_dim"] == 64 and not r["causal"] and r["batch"] == batch
                 and r["heads"] == 16]
            return max(c, key=lambda r: r["tflops"]) if c else None

        fwd = []
        for rung in ("00_naive_eigen", "01_safe_softmax", "02_online_softmax", "03_block_matmul", "04_fa1_loop_order",
                     "05_fa2_loop_order"):
            fwd.append((rung, pick(rung, "fp32", "fwd", 1)))
        fwd.append(("06_tensor_core_mma", pick("06_tensor_core_mma/", "bf16", "fwd", 4)))
        fwd.append(("08_hopper_forward", pick("08_hopper_forward/", "bf16", "fwd", 4)))
        bwd = [("07_backward_recompute", pick("07_backward_recompute", "fp32", "bwd", 1)),
               ("07_backward_recompute/mma", pick("07_backward_recompute/mma", "bf16", "bwd", 4))]
        if not any(r for _, r in fwd):
            continue
        refs_f = {k: pick(k, d, "fwd", b) for k, d, b in (("sdpa_flash", "bf16", 4), ("sdpa_cudnn", "bf16", 4),
                                                           ("sdpa_math", "fp32", 1), ("sdpa_efficient", "fp32", 1))}
        refs_b = {k: pick(k, d, "bwd", b) for k, d, b in (("sdpa_flash", "bf16", 4), ("sdpa_cudnn", "bf16", 4),
                                                           ("sdpa_efficient", "fp32", 1))}
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 6.2), gridspec_kw=dict(width_ratios=[3.2, 1.5]))
        days = sorted({str(r.get("date"))[:10] for r in rs if r.get("date") and r.get("kind") in ("rung", "sdpa")})
        date = " and ".join(days)  # a file merged from several runs names each day

        def draw(ax, items, refs, title):
            names, vals, colors, labels = [], [], [], []
            for rung, r in items:
                if r is None:
                    continue
                version = r["name"].split(" ")[0]
                short = SHORT.get(rung.split("/")[0], rung).replace(" ", "\n", 1)
                if rung.endswith("/mma"):
                    short += "\n(tensor cores)"
                elif rung.startswith("07"):
                    short += "\n(fp32)"
                if "/" in version and rung[:2] in ("06", "08"):
                    short += "\n(" + version.split("/")[1] + ")"
                names.append(short)
                vals.append(r["tflops"])
                colors.append(RUNG_COLORS.get(rung[:2]))
                labels.append("%s\nB=%d" % (r["dtype"], r["batch"]))
            xs = range(len(vals))
            ax.bar(xs, vals, color=colors, edgecolor="black", lw=0.6, width=0.7)
            for x, v, lab in zip(xs, vals, labels):
                ax.text(x, v * 1.08, "%.3g" % v, ha="center", va="bottom", fontsize=9, fontweight="bold")
                ax.text(x, 0.62, lab, ha="center", va="bottom", fontsize=7, color="white" if v > 1.2 else "black")
            ax.set_xticks(list(xs))
            ax.set_xticklabels(names, fontsize=8.5)
            ax.set_yscale("log")
            ax.set_ylim(0.5, 6000)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: "%g" % v))
            ax.grid(True, axis="y", which="major", alpha=0.3)
            styles = {"sdpa_flash": ("#d62728", "-", "FlashAttention-2 (PyTorch flash), bf16"),
                      "sdpa_cudnn": ("#6a3d9a", "-", "cuDNN (PyTorch), bf16"),
                      "sdpa_efficient": ("#555555", ":", "PyTorch mem-efficient, fp32"),
                      "sdpa_math": ("#555555", "--", "PyTorch math (standard attention), fp32")}
            for k, r in refs.items():
                if r is None:
                    continue
                c, ls, text = styles[k]
                ax.axhline(r["tflops"], color=c, ls=ls, lw=1.3, zorder=0.5, label="%s: %.3g" % (text, r["tflops"]))
            ax.legend(loc="upper left", fontsize=7.5, framealpha=0.95)
            ax.set_title(title, fontsize=10.5)

        draw(a1, fwd, refs_f, "Forward: each rung's best version")
        a1.set_ylabel("TFLOP/s (4·B·H·N²·d / time; backward 2.5× that)")
        draw(a2, bwd, refs_b, "Backward (rung 07)")
        fig.suptitle("The ladder at N = 4096, d = 64, H = 16, non-causal, %s, %s" % (gpu, date), fontsize=12,
                     fontweight="bold")
        fig.text(0.01, 0.01, "Data: docs/results/torch.json (bench/compare_torch.py; rungs and PyTorch's SDPA backends "
                 "in the same run, on the same inputs). fp32 rungs ran at B=1, bf16 at B=4 (B·N = 16384); lines: "
                 "PyTorch at the same dtype and B.", fontsize=8)
        fig.tight_layout(rect=(0, 0.03, 1, 0.95))
        save(fig, os.path.join(out, "ladder_tflops_%s.png" % slug(gpu)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(REPO, "docs", "results"), help="folder with the JSON")
    ap.add_argument("--out", default=DEFAULT_OUT, help="folder for the PNG files (default docs/figures)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    gpu, bench = bench_records(os.path.join(args.results, "bench.json"))
    with open(os.path.join(args.results, "io.json")) as f:
        io_rows = json.load(f)
    for dev in sorted({r.get("device") for r in io_rows if r.get("device")}):
        roofline(io_rows, bench if dev == gpu else {}, dev, args.out)
    bars(torch_rows(os.path.join(args.results, "torch.json")), args.out)


if __name__ == "__main__":
    main()
