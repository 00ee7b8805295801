#!/usr/bin/env python3
"""What each GPU kernel of one attention call costs: a rung's calls beside SDPA's, kernel by kernel.

compare_torch.py times whole calls. A call is often several kernels (rung 09's backward is three:
D with dQ's accumulator zeroed, the main kernel, dQ converted to the input type; cuDNN's backward
through SDPA is three too), and a gap between two calls may sit in any of them. This script runs
each call under torch.profiler (CUPTI), with the same preparation before every call as
compare_torch.py's default timer (a 256 MiB buffer read, then a spin of about a millisecond), and
reports every kernel's mean GPU time over the profiled calls:

  * the forward: fl_forward of --forward (default: rung 08's newest version), and SDPA's forward
    on each --peers backend;
  * the backward: fl_backward of --backward (default: rung 09's newest) on the O and lse of
    --forward's call, and SDPA's backward (torch.autograd.grad of one forward's graph) per backend.

    python3 bench/kernel_times.py --shapes 16x16x1024x128 4x16x4096x128
    python3 bench/kernel_times.py --shapes 16x16x1024x64c --peers cudnn,flash --json times.json

Shapes are compare_torch.py's (B x H[/Hkv] x Nq[:Nk] x d, a trailing c for causal). The fill
kernels the script itself queues (the buffer read and the spin) are left out of the table. One row
of the JSON per (shape, call, kernel): shape, dtype, call ("ours fwd", "cudnn bwd", ...), kernel
(the name CUPTI reports), us (mean over --calls), per_call (launches a call), and device and date.
Exit status 2 without a GPU; 1 when a call fails.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch as ct  # noqa: E402  (the C ABI's bindings, shapes, the SDPA backends)
from report import kernel_key  # noqa: E402  (rungs in order, numbers compared as numbers: v15 after v9)

FILL = ("elementwise", "reduce_kernel", "spin", "_sleep")  # what the timer's preparation runs


def kernel_rows(fn, calls: int, prepare) -> list[tuple[str, float, float]]:
    """(name, mean µs a call, launches a call) of every kernel fn queues, most expensive first."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):  # warm-up: plans, tensor maps, caches
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            prepare()
            fn()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or any(f in e.name for f in FILL):
            continue
        times.setdefault(e.name, []).append(getattr(e, "device_time_total", None) or e.cuda_time_total)
    return sorted(((n, sum(t) / calls, len(t) / calls) for n, t in times.items()), key=lambda r: -r[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--lib", help="path to libflash_ladder.so (default: build-hopper/capi/, then build/capi/)")
    ap.add_argument("--shapes", nargs="+", type=ct.parse_shape, required=True, help="B x H[/Hkv] x Nq[:Nk] x d[c]")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--forward", default=None, help="the rung whose forward is timed (default: rung 08's newest "
                    "version)")
    ap.add_argument("--backward", default=None, help="the rung whose backward is timed (default: the newest "
                    "version of the library's last rung with a backward pass on the GPU)")
    ap.add_argument("--peers", default="cudnn", help="comma-separated SDPA backends (flash, cudnn, efficient, math)")
    ap.add_argument("--calls", type=int, default=10, help="profiled calls of each (default 10)")
    ap.add_argument("--no-backward", dest="backward_pass", action="store_false", help="the forward only")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    if args.calls < 1:
        ap.error("--calls must be at least 1")

    import torch
    if not torch.cuda.is_available():
        print("kernel_times.py: no GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    lib = ct.Ladder(ct.find_library(args.lib))
    ok, why = lib.cuda_available()
    if not ok:
        print(f"kernel_times.py: the library has no GPU kernels here: {why}", file=sys.stderr)
        return 2
    # The library lists its rungs in name order, where v9 sorts after v15: the newest is the highest
    # version number, compared as a number.
    fwd_rung = args.forward or max((r for r in lib.rungs("cuda") if r.startswith("08_hopper_forward/")),
                                   key=kernel_key, default=None)
    bwd_rung = args.backward or max(lib.rungs("cuda", backward=True), key=kernel_key, default=None)
    if fwd_rung is None:
        print("kernel_times.py: the library has no rung 08 on the GPU; name one with --forward", file=sys.stderr)
        return 2
    peers = [p for p in args.peers.split(",") if p]
    for p in peers:
        if p not in ct.SDPA_BACKENDS:
            ap.error(f"unknown SDPA backend {p!r}: one of {', '.join(ct.SDPA_BACKENDS)}")
    tdt = ct.FL_DTYPES[args.dtype][1]
    flush = torch.empty(ct.FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    def prepare():  # compare_torch's "ahead" preparation: read the buffer, then keep the GPU busy
        flush.sum()
        torch.cuda._sleep(ct.AHEAD_CYCLES)

    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, library=lib.build_info,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), dtype=args.dtype)
    rows, failed = [], False
    for s in args.shapes:
        spec = s.spec()
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(s.batch, s.heads, s.seq_q, s.head_dim, device="cuda", dtype=tdt, generator=gen)
        k = torch.randn(s.batch, s.kv_heads, s.seq_k, s.head_dim, device="cuda", dtype=tdt, generator=gen)
        v = torch.randn(k.shape, device="cuda", dtype=tdt, generator=gen)
        dout = torch.randn(q.shape, device="cuda", dtype=tdt, generator=gen)
        o = torch.empty_like(q)
        lse = torch.empty(s.batch, s.heads, s.seq_q, device="cuda", dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        st = torch.cuda.current_stream().cuda_stream
        calls = []
        try:
            wf = lib.workspace_bytes(fwd_rung, "cuda", s.c(), args.dtype)
            ws_f = torch.empty(wf, dtype=torch.uint8, device="cuda") if wf else None
            fwd = lambda: lib.forward(fwd_rung, s.c(), args.dtype, q, k, v, o, lse, ws_f, st)  # noqa: E731
            calls.append(("ours fwd", fwd_rung, fwd))
            if args.backward_pass and bwd_rung:
                wb = lib.backward_workspace_bytes(bwd_rung, "cuda", s.c(), args.dtype)
                ws_b = torch.empty(wb, dtype=torch.uint8, device="cuda") if wb else None
                fwd()
                calls.append(("ours bwd", bwd_rung, lambda: lib.backward(
                    bwd_rung, s.c(), args.dtype, q, k, v, o, lse, dout, dq, dk, dv, ws_b, st)))
        except ct.FlError as e:
            print(f"{spec}: {e}", file=sys.stderr)
            failed = True
        for p in peers:
            qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
            gqa = s.kv_heads != s.heads

            def sdpa(p=p, qq=qq, kk=kk, vv=vv, gqa=gqa):
                with ct.sdpa_kernel(p):
                    return torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=s.causal,
                                                                            enable_gqa=gqa)
            try:
                out = sdpa()
            except RuntimeError as e:  # the backend refuses this shape: say so, go on
                print(f"{spec}: SDPA {p} refuses: {ct.short(e, 200)}", file=sys.stderr)
                continue
            calls.append((f"{p} fwd", f"sdpa_{p}", sdpa))
            if args.backward_pass:
                calls.append((f"{p} bwd", f"sdpa_{p}", lambda out=out, qq=qq, kk=kk, vv=vv: torch.autograd.grad(
                    out, (qq, kk, vv), dout, retain_graph=True)))
        for call, who, fn in calls:
            try:
                ks = kernel_rows(fn, args.calls, prepare)
            except (RuntimeError, ct.FlError) as e:
                print(f"{spec} {call}: {ct.short(e, 200)}", file=sys.stderr)
                failed = True
                continue
            total = sum(us for _, us, _ in ks)
            print(f"{spec} {args.dtype} {call} ({who}): {total:.1f} us in {len(ks)} kernels")
            for name, us, per in ks:
                print(f"  {us:10.1f} us  x{per:g}  {name[:120]}")
                rows.append(dict(meta, shape=spec, call=call, who=who, kernel=name, us=us, per_call=per))
        del q, k, v, dout, o, lse, dq, dk, dv
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
