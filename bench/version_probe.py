#!/usr/bin/env python3
"""Backward versions timed round-robin in ONE process against FlashAttention-2.

FA2's time moves by a few percent between processes, as much as the differences between versions,
so this probe keeps one process: for every shape of the bf16 grid (H = 16, B·N = 16384, N = 1024,
4096, 16384, d = 64 and 128, causal and not) it makes the tensors once, then times SDPA's flash
backend and every named version (registered rungs, called through the C ABI) in three interleaved
rounds of four runs each, and prints each version's median over FA2's. A version is named by its
short name within rung 07 (v4_2d_tiles) or in full, rung included, for any other backward rung
(09_hopper_backward/v1_wgmma, which needs an sm_90 GPU and a build for sm_90a). A second library
(--base-lib, e.g. built from an earlier commit) joins as "base" with its rung --base-rung. It
checks every version's gradients against FA2's (relative error, printed). Not part of the GPU
suite: run it by hand when comparing versions (docs/07_backward_recompute.md's appendix has its
numbers), or under a profiler with --only.

    python3 bench/version_probe.py --lib build-hopper/capi/libflash_ladder.so \\
        --v64 v3_kv_regs,v4_2d_tiles,09_hopper_backward/v1_wgmma --v128 v4_2d_tiles,09_hopper_backward/v1_wgmma
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys

PREFIX = "07_backward_recompute/"  # rung 07's versions are given without it
FORWARD = b"07_backward_recompute/mma"  # its forward (rung 06 v9) makes O and lse


def full_name(version: str) -> str:
    """The registered name of a version: a short name is rung 07's; a name with '/' is given whole."""
    return version if "/" in version else PREFIX + version


class FlShape(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("heads", ctypes.c_int64), ("kv_heads", ctypes.c_int64),
                ("seq_q", ctypes.c_int64), ("seq_k", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("causal", ctypes.c_int), ("scale", ctypes.c_double)]


def load(path: str):
    lib = ctypes.CDLL(path)
    P, Z = ctypes.c_void_p, ctypes.c_size_t
    lib.fl_forward.argtypes = [ctypes.c_char_p, ctypes.POINTER(FlShape), ctypes.c_int, P, P, P, P, P, P, Z, P]
    lib.fl_backward.argtypes = [ctypes.c_char_p, ctypes.POINTER(FlShape), ctypes.c_int] + [P] * 10 + [Z, P]
    lib.fl_backward_workspace_bytes.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(FlShape),
                                                ctypes.c_int, ctypes.POINTER(Z)]
    lib.fl_last_error.restype = ctypes.c_char_p
    return lib


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="libflash_ladder.so to probe")
    ap.add_argument("--base-lib", help="a second libflash_ladder.so, timed as 'base' with its rung --base-rung")
    ap.add_argument("--base-rung", default=PREFIX + "mma", help="the rung of --base-lib to time (default: %(default)s)")
    ap.add_argument("--v64", default="v3_kv_regs,v4_2d_tiles",
                    help="versions at d = 64, comma-separated: rung 07's by short name, others in full "
                         "(09_hopper_backward/v1_wgmma) (default: %(default)s)")
    ap.add_argument("--v128", default="v4_2d_tiles",
                    help="versions at d = 128, comma-separated, named as --v64's (default: %(default)s)")
    ap.add_argument("--only", metavar="D,N,CAUSAL",
                    help="one shape of the grid, e.g. 128,16384,0 (for a profiler: see docs/appendix/07_backward_recompute.md, 'On Hopper')")
    args = ap.parse_args(argv)
    grid = [(d, n, c) for d in (64, 128) for n in (1024, 4096, 16384) for c in (False, True)]
    if args.only:
        try:
            d, n, c = (int(x) for x in args.only.split(","))
        except ValueError:
            ap.error(f"--only takes D,N,CAUSAL, e.g. 128,16384,0 (got {args.only!r})")
        if (d, n, bool(c)) not in grid:
            ap.error(f"--only {args.only}: not a shape of the grid (d 64 or 128, N 1024, 4096 or 16384, causal 0 or 1)")
        grid = [(d, n, bool(c))]

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"version_probe: needs PyTorch with CUDA ({e})", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("version_probe: no CUDA device", file=sys.stderr)
        return 1
    libs = {"new": load(args.lib)}
    if args.base_lib:
        libs["base"] = load(args.base_lib)
    variants = {64: [v for v in args.v64.split(",") if v], 128: [v for v in args.v128.split(",") if v]}

    def chk(lib, status):
        if status != 0:
            raise RuntimeError(lib.fl_last_error().decode())

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def timeit(fn, reps):
        ts = []
        for i in range(reps + 1):
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); torch.cuda.synchronize()
            if i >= 1:
                ts.append(a.elapsed_time(b))
        return ts

    torch.manual_seed(0)
    dt = torch.bfloat16
    print(torch.cuda.get_device_name(), "bf16; backward time / FA2's, medians of 12 runs each", flush=True)
    for d, n, causal in grid:
        B, H = 16384 // n, 16
        q, k, v, do = (torch.randn(B, H, n, d, device="cuda", dtype=dt) for _ in range(4))
        s = FlShape(B, H, H, n, n, d, int(causal), 0.0)
        o = torch.empty_like(q)
        lse = torch.empty(B, H, n, device="cuda", dtype=torch.float32)
        new = libs["new"]
        chk(new, new.fl_forward(FORWARD, ctypes.byref(s), 2, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                o.data_ptr(), lse.data_ptr(), None, 0, None))
        # One workspace for all: the largest any of them needs (rung 09's adds a counter per Q block).
        need = 0
        for rung in [FORWARD] + [full_name(v).encode() for v in variants[d]]:
            nb = ctypes.c_size_t(0)
            chk(new, new.fl_backward_workspace_bytes(rung, b"cuda", ctypes.byref(s), 2, ctypes.byref(nb)))
            need = max(need, nb.value)
        ws = torch.empty(need, dtype=torch.uint8, device="cuda")
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        stream = torch.cuda.current_stream().cuda_stream

        def ours(lib, rung):
            def run():
                chk(lib, lib.fl_backward(rung.encode(), ctypes.byref(s), 2, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                         o.data_ptr(), lse.data_ptr(), do.data_ptr(), dq.data_ptr(),
                                         dk.data_ptr(), dv.data_ptr(), ws.data_ptr(), ws.numel(), stream))
            return run

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
            out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)

            def fa2():
                out.backward(do, retain_graph=True)

            qq.grad = kk.grad = vv.grad = None
            fa2()
            ref = (qq.grad.clone(), kk.grad.clone(), vv.grad.clone())
            cands = {"fa2": fa2}
            if "base" in libs:
                cands["base"] = ours(libs["base"], args.base_rung)
            for name in variants[d]:
                cands[name] = ours(new, full_name(name))
            times = {c: [] for c in cands}
            for _ in range(3):
                for c, fn in cands.items():
                    times[c] += timeit(fn, 4)
        med = {c: statistics.median(t) for c, t in times.items()}
        errs = []
        for name in variants[d]:
            ours(new, full_name(name))()
            torch.cuda.synchronize()
            e = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip((dq, dk, dv), ref))
            errs.append(f"{name} {e:.1e}")
        print(f"d={d:3d} N={n:5d} {'causal' if causal else 'full  '} FA2 {med['fa2']:7.3f} ms | "
              + " ".join(f"{c} {med[c] / med['fa2']:.3f}" for c in cands if c != "fa2")
              + " | error against FA2's gradients: " + ", ".join(errs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
