#!/usr/bin/env python3
"""Rung 08 on the whole grid: each version's speed relative to cuDNN, cell by cell.

    python3 bench/figures/hopper.py [--results docs/results] [--out docs/figures]

reads docs/results/probes.json, takes the newest run marked "grid": true (or "grid": a list that names
rung 08) that measured rung 08 (every version in one process beside SDPA's flash and cudnn backends,
bench/compare_torch.py), and writes, per GPU found in it:

  hopper_grid_<gpu>.png  one panel per dtype; for each cell of the grid (d, N, causal or not) a bar
                         per version from v4 on, its speed relative to cuDNN on the same inputs in
                         the same run (cuDNN's time over the version's: above 1 is faster), with a
                         line at 1 and FlashAttention-2's relative speed as a marker.

A run without rung 08 rows, or without cuDNN's on a cell, leaves the cell empty; no run marked
"grid" is an error that says so.
"""
import argparse
import json
import os
import sys

import matplotlib.pyplot as plt

from figkit import DEFAULT_OUT, REPO, out_path, save

RUNG = "08_hopper_forward"
FIRST_SHOWN = 4  # versions before v4 are far below cuDNN and crowd the picture; the chapter's table has them
COLORS = ["#fdd0a2", "#fdae6b", "#fd8d3c", "#e6550d", "#a63603", "#6a51a3", "#3f007d", "#08519c", "#006d2c", "#74c476"]  # one a version, v4 on


def grid_run(probes):
    for run in reversed(probes):
        grid = run.get("grid")  # true, or the list of rungs the run is the grid run of
        marked = grid is True or isinstance(grid, list) and RUNG in grid
        if marked and any(r.get("name", "").startswith(RUNG + "/") for r in run.get("rows", [])):
            return run
    return None


def version_of(name):
    """'08_hopper_forward/v6_wide_qk (cuda)' -> ('v6_wide_qk', 6); None for other kernels."""
    base = name.split(" (")[0]
    if not base.startswith(RUNG + "/"):
        return None
    v = base[len(RUNG) + 1:]
    try:
        return v, int(v.split("_")[0][1:])
    except ValueError:
        return None


def cell_key(shape):
    """'4x16x4096x128c' -> (d, N, causal) for sorting and labels."""
    causal = shape.endswith("c")
    parts = shape.rstrip("c").split("x")
    return int(parts[3]), int(parts[2]), causal


def draw(run, out_dir):
    rows = [r for r in run["rows"] if r.get("ms")]
    devices = sorted({r.get("device", "") for r in rows if r.get("device")})
    for device in devices:
        mine = [r for r in rows if r.get("device") == device]
        dtypes = sorted({r["dtype"] for r in mine}, key=lambda t: (t != "bf16", t))
        versions = sorted({version_of(r["name"]) for r in mine if version_of(r["name"])}, key=lambda v: v[1])
        versions = [v for v in versions if v[1] >= FIRST_SHOWN]
        shapes = sorted({r["shape"] for r in mine}, key=cell_key)
        fig, axes = plt.subplots(len(dtypes), 1, figsize=(14, 3.6 * len(dtypes) + 0.4), squeeze=False)
        top = 1.15  # room above the fastest bar of the run
        for ax, dtype in zip(axes[:, 0], dtypes):
            ms = {(r["shape"], r["name"].split(" (")[0]): r["ms"] for r in mine if r["dtype"] == dtype}
            width = 0.8 / max(1, len(versions))
            for i, (v, _) in enumerate(versions):
                xs, ys = [], []
                for k, sh in enumerate(shapes):
                    cu, t = ms.get((sh, "sdpa_cudnn")), ms.get((sh, RUNG + "/" + v))
                    if cu and t:
                        xs.append(k - 0.4 + width * (i + 0.5))
                        ys.append(cu / t)
                        top = max(top, cu / t + 0.03)
                ax.bar(xs, ys, width, color=COLORS[i % len(COLORS)], label=v, zorder=2)
            fx, fy = [], []
            for k, sh in enumerate(shapes):
                cu, fa = ms.get((sh, "sdpa_cudnn")), ms.get((sh, "sdpa_flash"))
                if cu and fa:
                    fx.append(k)
                    fy.append(cu / fa)
            ax.plot(fx, fy, "kx", markersize=7, label="FlashAttention-2 (SDPA flash)", zorder=3)
            ax.axhline(1.0, color="black", lw=1.0, zorder=1)
            ax.text(-0.55, 1.01, "cuDNN", ha="left", va="bottom", fontsize=8)
            labels = []
            for sh in shapes:
                d, n, causal = cell_key(sh)
                labels.append("d=%d\nN=%dk%s" % (d, n // 1024, "\ncausal" if causal else ""))
            ax.set_xticks(range(len(shapes)))
            ax.set_xticklabels(labels, fontsize=8)
            ax.set_xlim(-0.6, len(shapes) - 0.4)
            ax.set_ylabel("speed relative to cuDNN")
            ax.set_title("%s, %s: B·N = 16384, H = 16" % (dtype, device), fontsize=10)
            ax.grid(axis="y", color="#dddddd", zorder=0)
        for ax in axes[:, 0]:
            ax.set_ylim(0.4, top)  # one scale for both dtypes
        date = min((r.get("date", "") for r in mine), default="")[:10]
        fig.suptitle("Rung 08 beside cuDNN on every grid cell (%s, %s)" % (run.get("name", ""), date), fontsize=11)
        handles, names = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, names, fontsize=8, ncol=(len(names) + 1) // 2, loc="upper center",
                   bbox_to_anchor=(0.5, 0.96), frameon=False)  # two rows, so that every name fits
        fig.tight_layout(rect=(0, 0, 1, 0.9))
        gpu = "h200" if "H200" in device else "h100" if "H100" in device else "gpu"
        save(fig, out_path(out_dir, "hopper_grid_%s.png" % gpu))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(REPO, "docs", "results"))
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    path = os.path.join(args.results, "probes.json")
    try:
        with open(path, encoding="utf-8") as f:
            probes = json.load(f)
    except FileNotFoundError:
        print("hopper.py: %s not found" % path, file=sys.stderr)
        return 1
    run = grid_run(probes)
    if run is None:
        print("hopper.py: no run marked \"grid\": true with rung %s rows in %s" % (RUNG, path), file=sys.stderr)
        return 1
    draw(run, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
