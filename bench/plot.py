#!/usr/bin/env python3
"""Figures for docs/ from the JSON that ladder_bench and compare_torch.py write.

    build/bench/ladder_bench --benchmark_out=results.json --benchmark_out_format=json
    python3 bench/plot.py results.json [more.json ...] [--out docs/figures]
    python3 bench/compare_torch.py --memory-sweep only --json torch.json
    python3 bench/plot.py --memory torch.json [--out docs/figures]
    python3 bench/compare_decode.py --json decode.json
    python3 bench/plot.py --decode decode.json docs/figures/decode_bandwidth.png [--decode-batch 16]

For each device found (the CPU twins, and each GPU), it writes, with one line per rung (a rung
with versions is drawn by its best one, named in the legend; rung 07's forward, which is rung 05's
or 06's, is left out; --versions draws every version instead):
  tflops_<device>.png        TFLOP/s of every rung against N (d=64, non-causal)
  time_<device>.png          milliseconds per forward against N (log-log)
  extra_memory_<device>.png  extra memory a rung needs (its workspace) against N, log y
  modelled_io_<device>.png   bytes the rung's algorithm moves to and from device memory, log-log
A shape a rung could not run (out of device memory, or it failed its check against the oracle)
is marked with an x on the axis, so where the standard-attention rungs stop is visible.

Only JSON fields are read: each benchmark's counters and its label of key=value pairs
("rung=05_fa2_loop_order device=cuda dtype=fp32 phase=fwd B=1 H=16 N=4096 d=64 causal=0"), never
the benchmark names or printed text. With repetitions, the median aggregate is used. These figures
are of the forward (phase=fwd, or no phase in files from before backward benchmarks existed).

--memory FILE reads compare_torch.py's JSON (a list of rows) and draws, from its rows of kind
"memory" (--memory-sweep), backward_memory.png: the extra device memory of one forward+backward
against N on log-log axes, one line per rung with a backward pass and one for standard attention
(SDPA's math backend), with dotted guides of slope N and N² through the first points, the device's
memory as a horizontal line, and where standard attention ran out of memory its N²-scaled
prediction as hollow markers on a dashed line. Without such rows it says so and writes nothing.

--decode FILE OUT.png reads compare_decode.py's JSON (or torch.json, where the GPU suite appends
its rows) and draws rung 10's bandwidth: GB/s (the KV cache's bytes over the time) against Nk on a
log axis, for one batch size (--decode-batch, default 16), one panel per (H/Hkv, Nq), one line per
decode version (solid; dashed: the same version on a paged cache), rung 06's v9 forward kernel and
each SDPA backend, with the stream-read and copy ceilings of the same run as horizontal lines.
"""
import argparse
import json
import math
import os
import re
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # files only: no display needed on a GPU server or in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator  # noqa: E402

TIME_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_label(label):
    """'rung=00_naive_eigen device=cpu N=512 ...' -> {'rung': '00_naive_eigen', ...}."""
    fields = {}
    for item in (label or "").split():
        key, sep, value = item.partition("=")
        if sep:
            fields[key] = value
    return fields


def pick_entry(entries):
    """The entry that stands for one benchmark: its median over repetitions, or its only run.

    Returns (entry, error_message): entry is None when every repetition reported an error.
    """
    medians = [e for e in entries if e.get("run_type") == "aggregate" and e.get("aggregate_name") == "median"]
    if medians:
        return medians[0], None
    runs = [e for e in entries if e.get("run_type", "iteration") == "iteration"]
    good = [e for e in runs if not e.get("error_occurred")]
    if good:
        # Repetitions without aggregates (say --benchmark_repetitions with no median reported):
        # take the run with the median time.
        good.sort(key=lambda e: e["real_time"])
        return good[len(good) // 2], None
    if runs:
        return None, runs[0].get("error_message", "error")
    return None, None


def load(paths):
    """One record per benchmark: what ran (label), where (machine), and its numbers or its error."""
    records = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        ctx = doc.get("context", {})
        date = ctx.get("date_utc") or ctx.get("date", "")[:10]
        by_run = defaultdict(list)
        for b in doc.get("benchmarks", []):
            by_run[b.get("run_name", b["name"])].append(b)
        for entries in by_run.values():
            info = parse_label(next((e.get("label") for e in entries if e.get("label")), ""))
            if "rung" not in info:
                continue  # not one of ours
            entry, error = pick_entry(entries)
            device = info.get("device", "?")
            if device == "cuda":
                machine = ctx.get("gpu", "unknown GPU")
            else:
                machine = "CPU twins, %s (%s cores)" % (ctx.get("host_name", "host"), ctx.get("num_cpus", "?"))
            rec = {
                "rung": info["rung"],
                "phase": info.get("phase", "fwd"),
                "device": device,
                "dtype": info.get("dtype", "?"),
                "machine": machine,
                "date": date,
                "B": int(info.get("B", 0)),
                "H": int(info.get("H", 0)),
                "N": int(info.get("N", 0)),
                "d": int(info.get("d", 0)),
                "causal": int(info.get("causal", 0)),
                "error": error,
            }
            if entry is not None:
                rec["time_ms"] = entry["real_time"] * TIME_UNIT_MS.get(entry.get("time_unit", "ns"), 1e-6)
                for key in ("TFLOP/s", "GB/s", "modelled_bytes", "extra_bytes", "rel_err"):
                    rec[key] = entry.get(key)
            records.append(rec)
    return records


def describe_bytes(x, _pos=None):
    """1048576 -> '1 MiB': the same binary units the ladder table prints."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return ("%.0f %s" if x == int(x) else "%.3g %s") % (x, unit)
        x /= 1024.0
    return str(x)


def slug(text):
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()


def series(records):
    """Records of one figure grouped into lines: {(rung, dtype): [records sorted by N]}."""
    lines = defaultdict(dict)
    for r in records:
        lines[(r["rung"], r["dtype"])][r["N"]] = r  # a later file wins for the same point
    return {k: [v[n] for n in sorted(v)] for k, v in sorted(lines.items())}


def line_name(key, mixed_dtypes):
    rung, dtype = key
    return "%s (%s)" % (rung, dtype) if mixed_dtypes else rung


def figure(records, value, ylabel, title, path, logy, zero_note=None, in_bytes=False):
    """One line per rung: `value` (a record key) against N on a log2 axis.

    Points with no result (an error) are drawn as x on the bottom axis. Rungs whose value is 0
    everywhere cannot sit on a log axis; zero_note names them in a note on the figure instead.
    """
    lines = series(records)
    if not lines:
        return False
    mixed = len({k[1] for k in lines}) > 1
    cmap = plt.get_cmap("tab20" if len(lines) > 10 else "tab10")
    fig, ax = plt.subplots(figsize=(11.5, 5.5))
    all_n, zero_rungs, failed_any = set(), [], False
    for i, (key, recs) in enumerate(lines.items()):
        color = cmap(i % cmap.N)
        ok = [r for r in recs if r["error"] is None and r.get(value) is not None]
        bad = [r for r in recs if r["error"] is not None]
        all_n.update(r["N"] for r in recs)
        pts = [(r["N"], r[value]) for r in ok if not (logy and r[value] <= 0)]
        if ok and not pts:
            zero_rungs.append(line_name(key, mixed))
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", color=color, label=line_name(key, mixed))
        if bad:
            failed_any = True
            # On the bottom edge whatever the y range: axes fraction for y, data for x.
            ax.plot([r["N"] for r in bad], [0.0] * len(bad), linestyle="none", marker="x", markersize=9,
                    markeredgewidth=2, color=color, transform=ax.get_xaxis_transform(), clip_on=False,
                    label=None if pts else line_name(key, mixed))
    if not ax.lines:
        plt.close(fig)
        return False
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(all_n))
    ax.set_xticklabels([str(n) for n in sorted(all_n)])
    ax.xaxis.set_minor_locator(NullLocator())  # only the N that were measured
    if in_bytes:
        # Powers of two read as 1 MiB, 4 MiB, 16 MiB: a factor of N² shows as a fixed step per N.
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_locator(LogLocator(base=2, numticks=12))
        ax.yaxis.set_major_formatter(FuncFormatter(describe_bytes))
        ax.yaxis.set_minor_locator(NullLocator())
    elif logy:
        ax.set_yscale("log")
        # 1-2-5 ticks as plain numbers (0.05, 20, 300): readable whether the rungs span a factor
        # of two (CPU twins) or of a thousand (a naive kernel to tensor cores).
        lo, hi = ax.get_ylim()
        subs = (1.0, 2.0, 5.0) if hi > 20 * lo else tuple(float(k) for k in range(1, 10))
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: "%g" % y))
        ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("sequence length N (Nq = Nk)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    notes = []
    if failed_any:
        notes.append("x: no result (out of device memory, or failed the oracle check: see the JSON)")
    if zero_rungs and zero_note:
        notes.append(zero_note + ": " + ", ".join(zero_rungs))
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=8, va="bottom")
    # Outside the axes, on the right: a legend inside would sit on some rung's line.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout(rect=(0, 0.04 * len(notes), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def forward_rung(rung):
    """False for a rung whose forward is another rung's (07's versions pair with 05's or 06's)."""
    return not rung.startswith("07_")


def one_per_rung(records):
    """Records of each rung's best version only, and none of the rungs whose forward is another's.

    A rung with versions (06_tensor_core_mma/v1_mma ... v9_one_sync) is drawn as one line: the
    version with the highest TFLOP/s at the largest N that all of its versions ran."""
    records = [r for r in records if forward_rung(r["rung"])]
    versions = defaultdict(set)
    for r in records:
        versions[r["rung"].split("/")[0]].add(r["rung"])
    keep = set()
    for family, names in versions.items():
        if len(names) == 1:
            keep |= names
            continue
        ran = defaultdict(dict)  # N -> version -> TFLOP/s
        for r in records:
            if r["rung"] in names and r["error"] is None and r.get("TFLOP/s"):
                ran[r["N"]][r["rung"]] = r["TFLOP/s"]
        common = [n for n in ran if len(ran[n]) == len(names)] or list(ran)
        if not common:
            keep |= names
            continue
        at = ran[max(common)]
        keep.add(max(at, key=at.get))
    return [r for r in records if r["rung"] in keep]


def memory_rows(path):
    """The rows of kind "memory" in compare_torch.py's JSON (a list of rows). A file the GPU suite
    left as {"error": ...}, or one with no such rows, gives []."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, list):
        return []
    return [r for r in doc if isinstance(r, dict) and r.get("kind") == "memory" and r.get("seq_q")]


def memory_figure(rows, path):
    """backward_memory.png: extra bytes of one forward+backward against N, log-log. Returns whether
    a figure was written (False when no row has a number to draw)."""
    lines = defaultdict(dict)  # name -> N -> row; a later row wins for the same point
    for r in rows:
        lines[r["name"]][int(r["seq_q"])] = r

    def value(r):
        v = r.get("extra_bytes") if r.get("status") == "ok" else r.get("predicted_extra_bytes")
        return v if isinstance(v, (int, float)) and v > 0 and math.isfinite(v) else None

    if not any(value(r) for pts in lines.values() for r in pts.values()):
        return False
    # The rungs first, standard attention last, each in its own colour.
    names = sorted(lines, key=lambda n: (n.startswith("sdpa_"), n))
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, 5.5))
    all_n = sorted({n for pts in lines.values() for n in pts})
    firsts = {}  # name -> (N, bytes) of its first measured point, for the slope guides
    oom_any = False
    zero_names = []
    for i, name in enumerate(names):
        color = cmap(i % cmap.N)
        pts = lines[name]
        label = "standard attention (SDPA math backend)" if name == "sdpa_math" else name
        ok = [(n, value(r)) for n, r in sorted(pts.items()) if r.get("status") == "ok" and value(r)]
        oom = [(n, value(r)) for n, r in sorted(pts.items()) if r.get("status") == "out of memory" and value(r)]
        if any(r.get("status") == "ok" and not value(r) for r in pts.values()):
            zero_names.append(label)
        if ok:
            ax.plot(*zip(*ok), marker="o", color=color, label=label)
            firsts[name] = ok[0]
        if oom:
            oom_any = True
            chain = ok[-1:] + oom  # the dashed line continues from the last measured point
            ax.plot(*zip(*chain), linestyle="--", color=color)
            ax.plot(*zip(*oom), linestyle="none", marker="o", markerfacecolor="white", color=color,
                    label=label + ": out of memory (predicted)" if ok else label + " (predicted)")
    # Guides, drawn an eighth below the first point so they do not hide the data: slope 2 (N², what
    # storing P costs) under standard attention, slope 1 (N, what FlashAttention's backward keeps)
    # under the first rung. A line parallel to its guide grows as that power of N.
    lo, hi = all_n[0], all_n[-1]
    guides = [("sdpa_math", 2, "slope N²"), (next((n for n in names if not n.startswith("sdpa_")), None), 1, "slope N")]
    for name, slope, text in guides:
        if name in firsts:
            n0, b0 = firsts[name]
            b0 /= 8
            ax.plot([lo, hi], [b0 * (lo / n0) ** slope, b0 * (hi / n0) ** slope], linestyle=":",
                    color="gray", linewidth=1.2)
            ax.annotate(text, (hi, b0 * (hi / n0) ** slope), textcoords="offset points", xytext=(4, 0),
                        fontsize=9, color="gray", va="center")
    total = next((r.get("total_memory_bytes") for r in rows if r.get("total_memory_bytes")), None)
    if total:
        ax.axhline(total, color="black", linewidth=0.8)
        ax.annotate("device memory (%s)" % describe_bytes(float(total)), (hi, total), textcoords="offset points",
                    xytext=(0, -11), fontsize=8, ha="right")
    ax.set_xscale("log", base=2)
    ax.set_xticks(all_n)
    ax.set_xticklabels([str(n) for n in all_n])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_locator(LogLocator(base=2, numticks=14))
    ax.yaxis.set_major_formatter(FuncFormatter(describe_bytes))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlim(lo / 1.3, hi * 1.9)  # room for the guides' labels
    first = rows[0]
    shape = "B=%s H=%s d=%s, %s" % (first.get("batch", "?"), first.get("heads", "?"), first.get("head_dim", "?"),
                                    first.get("dtype", "?"))
    where = ", ".join(x for x in (first.get("device"), str(first.get("date") or "")[:10]) if x)
    ax.set_title("Extra device memory of one forward + backward (beyond inputs, outputs, gradients)\n"
                 "%s, Nq = Nk = N; %s" % (shape, where), fontsize=11)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("peak extra device memory")
    ax.grid(True, which="major", alpha=0.3)
    notes = []
    if oom_any:
        notes.append("hollow: out of device memory; the point is the last measurement scaled by (N/N0)²")
    if zero_names:
        notes.append("no extra memory at some N (not drawn on a log axis): " + ", ".join(zero_names))
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=8, va="bottom")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout(rect=(0, 0.04 * len(notes), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def memory_main(path, out):
    """backward_memory.png from compare_torch.py's JSON; 0 when written or skipped, 2 on a bad file."""
    try:
        rows = memory_rows(path)
    except (OSError, ValueError) as e:
        print("plot.py: cannot read %s: %s" % (path, e), file=sys.stderr)
        return 2
    target = os.path.join(out, "backward_memory.png")
    if not rows:
        print("plot.py: %s has no memory-sweep rows (kind \"memory\": run bench/compare_torch.py "
              "--memory-sweep); %s not written" % (path, target), file=sys.stderr)
        return 0
    os.makedirs(out, exist_ok=True)
    if not memory_figure(rows, target):
        print("plot.py: the memory-sweep rows in %s have no number to draw (every one skipped or "
              "failed); %s not written" % (path, target), file=sys.stderr)
        return 0
    print(target)
    return 0


def decode_rows(path):
    """compare_decode.py's rows (kind "decode" and "ceiling") in a JSON list; [] for anything else."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, list):
        return []
    return [r for r in doc if isinstance(r, dict) and r.get("kind") in ("decode", "ceiling")]


def decode_figure(rows, batch, path):
    """GB/s against Nk, one panel per (H/Hkv, Nq, d, causal, dtype) at B = batch. Returns whether a
    figure was written (False when no row at that B has a time)."""
    timed = [r for r in rows if r["kind"] == "decode" and r.get("B") == batch and r.get("GBps")]
    if not timed:
        return False
    panels = defaultdict(lambda: defaultdict(dict))  # panel -> line -> Nk -> GB/s
    for r in timed:
        panel = (r["H"], r["Hkv"], r["Nq"], r["d"], bool(r.get("causal")), r["dtype"])
        line = (r["name"], r.get("page_size") or 0)
        panels[panel][line][r["Nk"]] = r["GBps"]  # a later row wins for the same point
    names = sorted({line[0] for lines in panels.values() for line in lines},
                   key=lambda n: (n.startswith("sdpa_"), not n.startswith("10_"), n))
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    ceilings = {r["what"]: r["GBps"] for r in rows if r["kind"] == "ceiling" and r.get("GBps")}
    top = 1.1 * max([r["GBps"] for r in timed] + list(ceilings.values()))  # room above the ceilings' labels
    cols = 2 if len(panels) > 1 else 1
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 4.2 * nrows), squeeze=False, sharey=True)
    for ax, (panel, lines) in zip(axes.flat, sorted(panels.items())):
        h, hkv, nq, d, causal, dtype = panel
        for (name, page), pts in sorted(lines.items(), key=lambda kv: (names.index(kv[0][0]), kv[0][1])):
            nk = sorted(pts)
            ax.plot(nk, [pts[n] for n in nk], marker="o", color=colors[name], linestyle="--" if page else "-",
                    label="%s, paged %d" % (name, page) if page else name)
        for what, style in (("stream_read", "-"), ("copy", ":")):
            if what in ceilings:
                ax.axhline(ceilings[what], color="black", linestyle=style, linewidth=0.9)
                ax.annotate("%s %.0f GB/s" % (what.replace("_", " "), ceilings[what]), (0.01, ceilings[what]),
                            xycoords=("axes fraction", "data"), textcoords="offset points", xytext=(0, 3), fontsize=8)
        all_nk = sorted({n for pts in lines.values() for n in pts})
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_nk)
        ax.set_xticklabels([str(n) for n in all_nk])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_title("H=%d Hkv=%d%s, Nq=%d, d=%d%s, %s" % (h, hkv, " (GQA)" if hkv < h else "", nq, d,
                                                            ", causal" if causal else "", dtype), fontsize=10)
        ax.set_xlabel("keys per sequence Nk")
        ax.set_ylabel("GB/s (K and V bytes / time)")
        ax.set_ylim(0, top)
        ax.grid(True, which="major", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    handles = {}
    for ax in axes.flat:
        for hd, lb in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lb, hd)
    fig.legend(handles.values(), handles.keys(), fontsize=8, loc="lower center", ncol=min(4, len(handles)))
    first = timed[0]
    fig.suptitle("Rung 10, decoding: bandwidth at B=%d against the KV cache's length\n%s" % (
        batch, ", ".join(x for x in (first.get("device"), str(first.get("date") or "")[:10]) if x)), fontsize=11)
    legend_rows = -(-len(handles) // 4)
    fig.tight_layout(rect=(0, 0.03 + 0.025 * legend_rows, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def decode_main(path, out, batch):
    """The decode figure; 0 when written, 1 when there was nothing to draw, 2 on a bad file."""
    try:
        rows = decode_rows(path)
    except (OSError, ValueError) as e:
        print("plot.py: cannot read %s: %s" % (path, e), file=sys.stderr)
        return 2
    if not decode_figure(rows, batch, out):
        print("plot.py: %s has no timed decode rows at B=%d (kind \"decode\": run bench/compare_decode.py); "
              "%s not written" % (path, batch, out), file=sys.stderr)
        return 1
    print(out)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="*", help="ladder_bench output (--benchmark_out=FILE --benchmark_out_format=json)")
    ap.add_argument("--memory", metavar="TORCH_JSON",
                    help="compare_torch.py's --json with --memory-sweep rows: draws backward_memory.png")
    ap.add_argument("--decode", nargs=2, metavar=("DECODE_JSON", "OUT_PNG"),
                    help="compare_decode.py's --json (or torch.json with its rows): draws rung 10's GB/s "
                         "against Nk into OUT_PNG")
    ap.add_argument("--decode-batch", type=int, default=16, metavar="B",
                    help="the batch size --decode draws (default 16)")
    ap.add_argument("--out", default="docs/figures", help="folder for the PNG files (default docs/figures)")
    ap.add_argument("--versions", action="store_true",
                    help="one line per version (and rung 07's forward rows) instead of one per rung")
    args = ap.parse_args(argv)
    if not args.json and not args.memory and not args.decode:
        ap.error("give ladder_bench JSON files, --memory TORCH_JSON, --decode DECODE_JSON OUT_PNG, or some of them")

    status = memory_main(args.memory, args.out) if args.memory else 0
    if args.decode:
        status = max(status, decode_main(args.decode[0], args.decode[1], args.decode_batch))
    if not args.json:
        return status
    try:
        records = load(args.json)
    except (OSError, ValueError) as e:  # a missing file, or one that is not JSON
        print("plot.py: cannot read the results: %s" % e, file=sys.stderr)
        return 2
    if not records:
        print("plot.py: no ladder_bench results in %s" % ", ".join(args.json), file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)

    groups = defaultdict(list)  # (device, machine) -> records of the forward
    for r in records:
        if r["phase"] == "fwd":
            groups[(r["device"], r["machine"])].append(r)
    machines_per_device = defaultdict(set)
    for device, machine in groups:
        machines_per_device[device].add(machine)

    written = []
    for (device, machine), recs in sorted(groups.items()):
        # One machine per device: tflops_cuda.png; several (files from two GPUs): one set each.
        tag = device if len(machines_per_device[device]) == 1 else "%s_%s" % (device, slug(machine))
        date = max((r["date"] for r in recs), default="")
        main_shape = [r for r in recs if r["d"] == 64 and r["causal"] == 0]
        if not main_shape:
            continue
        if not args.versions:
            main_shape = one_per_rung(main_shape)
        which = "every version" if args.versions else "each rung's best version"
        b_h = sorted({(r["B"], r["H"]) for r in main_shape})
        shape = ", ".join("B=%d H=%d" % bh for bh in b_h)
        where = "%s%s" % (machine, ", " + date if date else "")
        # The rungs span three orders of magnitude in speed (a naive kernel to tensor cores), so
        # every y axis is logarithmic: equal heights are equal ratios, what the ladder is about.
        charts = [
            ("tflops", "TFLOP/s", "TFLOP/s (4·B·H·N²·d / time)", None, False,
             "Forward TFLOP/s, %s, d=64, non-causal, %s\n%s" % (which, shape, where)),
            ("time", "time_ms", "time per forward (ms)", None, False,
             "Forward time, %s, d=64, non-causal, %s\n%s" % (which, shape, where)),
            ("extra_memory", "extra_bytes", "extra memory (workspace beyond Q, K, V, O, lse)", "no extra memory",
             True, "Extra memory, %s, d=64, non-causal, %s\n%s" % (which, shape, where)),
            ("modelled_io", "modelled_bytes", "modelled device-memory traffic", None, True,
             "Modelled bytes moved between device memory and chip, %s, d=64, non-causal,\n%s, %s" % (which, shape, where)),
        ]
        for name, value, ylabel, zero_note, in_bytes, title in charts:
            path = os.path.join(args.out, "%s_%s.png" % (name, tag))
            if figure(main_shape, value, ylabel, title, path, True, zero_note, in_bytes):
                written.append(path)

    for p in written:
        print(p)
    if not written:
        print("plot.py: nothing to plot (no d=64 non-causal results)", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
