#!/usr/bin/env python3
"""Every figure in docs/figures/, in one command (docs/figures/README.md lists them):

    python3 bench/figures/make_all.py [--results docs/results] [--out docs/figures]

The figures of the ideas (tiling.py, mma.py, backward.py) need nothing but matplotlib; the
figures of the data (results.py, and bench/plot.py's) read the JSON in --results.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(REPO, "docs", "results"))
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "figures"))
    args = ap.parse_args(argv)
    py = sys.executable
    steps = [[py, os.path.join(HERE, s), "--out", args.out] for s in ("tiling.py", "mma.py", "backward.py")]
    steps.append([py, os.path.join(HERE, "results.py"), "--results", args.results, "--out", args.out])
    steps.append([py, os.path.join(HERE, "hopper.py"), "--results", args.results, "--out", args.out])
    plot = os.path.join(REPO, "bench", "plot.py")
    steps.append([py, plot, os.path.join(args.results, "bench.json"), "--memory", os.path.join(args.results, "torch.json"),
                  "--out", args.out])
    for cmd in steps:
        rc = subprocess.call(cmd)
        if rc != 0:
            print("make_all.py: %s failed (%d)" % (" ".join(cmd), rc), file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
