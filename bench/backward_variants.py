#!/usr/bin/env python3
"""The variants of rung 07's tensor-core backward, side by side, each against FlashAttention-2.

backward_mma.cu builds several ways of cutting the same work (kVariants there: w4, w8, w4_kv,
w8_kv, w4_occ, w8_kv_1s, t2d, t2d_nofold; docs/07_backward_recompute.md says what each changes). The library
runs the default (t2d_nofold at d = 128, w8_kv at d = 64) unless FL_BACKWARD_VARIANT names another (read
at every call). This script runs bench/compare_torch.py once per variant, in its own process with that variable set, on the rung
07_backward_recompute/mma and SDPA's flash backend only, and prints each variant's backward time as
a ratio to FA2's backward measured in the same process (ratios, never times, compare across
processes).

    python3 bench/backward_variants.py --lib build-hopper/capi/libflash_ladder.so
    python3 bench/backward_variants.py --variants w4,w8_kv --shapes 1x16x16384x64 1x16x16384x128c

Exit status: non-zero when a variant's run failed or its gradients did not pass.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

RUNG = "07_backward_recompute/mma"
VARIANTS = ["w4", "w8", "w4_kv", "w8_kv", "w4_occ", "w8_kv_1s", "t2d", "t2d_nofold", "wg"]  # the order they were tried in
HERE = os.path.dirname(os.path.abspath(__file__))


def run_variant(args, variant: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, os.path.join(HERE, "compare_torch.py"), "--rungs", RUNG, "--peers", "flash",
               "--dtype", args.dtype, "--json", out, "--reps", str(args.reps)]
        if args.lib:
            cmd += ["--lib", args.lib]
        if args.shapes:
            cmd += ["--shapes", *args.shapes]
        env = dict(os.environ, FL_BACKWARD_VARIANT=variant)
        print(f"--- {variant}: {' '.join(cmd)}", flush=True)
        rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL if not args.verbose else None).returncode
        if not os.path.exists(out):
            raise RuntimeError(f"variant {variant}: compare_torch.py wrote no rows (exit {rc})")
        with open(out) as f:
            rows = json.load(f)
    for r in rows:
        r["variant"] = variant
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="libflash_ladder.so (default: compare_torch.py's)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from " + ", ".join(VARIANTS))
    ap.add_argument("--dtype", default="bf16", help="fp16 or bf16 (default bf16)")
    ap.add_argument("--shapes", nargs="+", help="as compare_torch.py --shapes (default: its grid)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", help="write every row, with its variant, to this file")
    ap.add_argument("--verbose", action="store_true", help="show compare_torch.py's own output")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; there are {', '.join(VARIANTS)}")
    if args.dtype not in ("fp16", "bf16"):
        ap.error("--dtype must be fp16 or bf16 (the tensor-core rung's dtypes)")

    rows, failed = [], False
    for v in variants:
        try:
            rows += run_variant(args, v)
        except (RuntimeError, OSError) as e:
            print(f"FAILED: {e}", file=sys.stderr)
            failed = True

    # ratio[(shape, variant)] = the rung's backward time / FA2's, both from that variant's process.
    table: dict[str, dict[str, str]] = {}
    for v in variants:
        mine = [r for r in rows if r["variant"] == v and r.get("phase") == "bwd"]
        fa2 = {r["shape"]: r for r in mine if r["kind"] == "sdpa" and r["name"] in ("sdpa_flash", "flash") and r.get("ms")}
        for r in mine:
            if r["kind"] != "rung":
                continue
            if r.get("passed") is False or not r.get("ms"):
                failed = True
                table.setdefault(r["shape"], {})[v] = "FAIL" if r.get("passed") is False else "-"
                continue
            peer = fa2.get(r["shape"])
            table.setdefault(r["shape"], {})[v] = f"{r['ms'] / peer['ms']:.2f}" if peer else f"{r['ms']:.3f} ms"
    device = next((r.get("device") for r in rows if r.get("device")), "?")
    print(f"\nbackward time / FA2's backward time ({args.dtype}, {device}; below 1 is faster)")
    print(f"{'shape':>22} " + " ".join(f"{v:>7}" for v in variants))
    for shape in table:
        print(f"{shape:>22} " + " ".join(f"{table[shape].get(v, '-'):>7}" for v in variants))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed or not table else 0


if __name__ == "__main__":
    sys.exit(main())
