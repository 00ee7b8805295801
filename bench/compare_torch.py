#!/usr/bin/env python3
"""The ladder's GPU rungs beside PyTorch's own attention kernels, in one run on one GPU.

Each rung is called through the C ABI (capi/flash_ladder.h, loaded with ctypes) on tensors that
PyTorch allocated, on PyTorch's current stream, so both sides see the same inputs, the same
allocator and the same clock. For every shape and dtype it

  * computes an fp64 reference once (scores and log-sum-exp by hand, O by SDPA's math backend,
    both on inputs upcast to float64),
  * runs every rung that supports the problem, checks O and lse against the reference and times it,
  * times PyTorch's SDPA backends (flash, cuDNN, memory-efficient, math) on the same inputs,
    recording why a backend refused where it does,
  * prints each rung's time as a ratio to each SDPA backend, and writes every row to --json.

Timing: CUDA events around one call, a 256 MiB buffer zeroed before every call (outside the timed
region) so L2 holds nothing useful, warm-up first, median of the repetitions.

Each (shape, dtype) runs in a fresh worker process by default: a kernel that faults leaves its CUDA
context unusable, and isolation keeps that from taking every later measurement with it.

    python3 bench/compare_torch.py --quick
    python3 bench/compare_torch.py --dtype fp32,bf16 --json torch.json
    python3 bench/compare_torch.py --shapes 1x16x4096x64c 2x32/8x1000:3000x128 --rungs 05_fa2_loop_order

Shapes are B x H[/Hkv] x Nq[:Nk] x d, with a trailing c for causal. --device cpu runs the CPU twins
(fl_forward_host) against PyTorch on the CPU, for a machine with no GPU.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # said plainly: this script is for a machine that has PyTorch
    sys.exit("compare_torch.py needs PyTorch (import torch failed); run it where PyTorch is installed")

FL_ABI_VERSION = 1  # must match FL_ABI_VERSION in capi/flash_ladder.h
FL_DTYPES = {"fp32": (0, torch.float32), "fp16": (1, torch.float16), "bf16": (2, torch.bfloat16)}
# Relative L2 error each dtype is held to against the fp64 reference (common/compare.cpp).
TOLERANCE = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 2e-2}
SDPA_BACKENDS = ["flash", "cudnn", "efficient", "math"]
FLUSH_BYTES = 256 << 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- The C ABI ---------------------------------------------------------------------------------

class FlShape(ctypes.Structure):  # mirrors fl_shape in capi/flash_ladder.h
    _fields_ = [("batch", ctypes.c_int64), ("heads", ctypes.c_int64), ("kv_heads", ctypes.c_int64),
                ("seq_q", ctypes.c_int64), ("seq_k", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("causal", ctypes.c_int), ("scale", ctypes.c_double)]


class FlIo(ctypes.Structure):  # mirrors fl_io
    _fields_ = [("read_bytes", ctypes.c_uint64), ("written_bytes", ctypes.c_uint64),
                ("modelled_read_bytes", ctypes.c_double), ("modelled_written_bytes", ctypes.c_double)]


class FlError(RuntimeError):
    pass


class Ladder:
    """libflash_ladder.so through ctypes: every signature declared, every status checked."""

    def __init__(self, path: str):
        self.path = path
        lib = self.lib = ctypes.CDLL(path)
        P, S, I, Z = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
        shape, io = ctypes.POINTER(FlShape), ctypes.POINTER(FlIo)
        sigs = {
            "fl_abi_version": ([], I), "fl_version": ([], S), "fl_build_info": ([], S),
            "fl_cuda_available": ([], I), "fl_last_error": ([], S), "fl_status_name": ([I], S),
            "fl_rung_count": ([], I), "fl_rung_name": ([I], S), "fl_rung_backend": ([I], S),
            "fl_rung_idea": ([I], S), "fl_rung_has_backward": ([I], I),
            "fl_rung_supports": ([S, S, shape, I], I),
            "fl_forward_workspace_bytes": ([S, S, shape, I, ctypes.POINTER(Z)], I),
            "fl_forward": ([S, shape, I, P, P, P, P, P, P, Z, P], I),
            "fl_forward_host": ([S, shape, I, P, P, P, P, P, P, Z, io], I),
        }
        for name, (args, res) in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        if lib.fl_abi_version() != FL_ABI_VERSION:
            raise FlError(f"{path} has C ABI version {lib.fl_abi_version()}, this script speaks "
                          f"{FL_ABI_VERSION}: rebuild the library or update the script")

    def _check(self, status: int):
        if status != 0:
            raise FlError(f"{self.lib.fl_status_name(status).decode()}: "
                          f"{self.lib.fl_last_error().decode()}")

    @property
    def build_info(self) -> str:
        return self.lib.fl_build_info().decode()

    def cuda_available(self) -> tuple[bool, str]:
        ok = bool(self.lib.fl_cuda_available())
        return ok, "" if ok else self.lib.fl_last_error().decode()

    def rungs(self, backend: str) -> list[str]:
        n = self.lib.fl_rung_count()
        return [self.lib.fl_rung_name(i).decode() for i in range(n)
                if self.lib.fl_rung_backend(i).decode() == backend]

    def supports(self, rung: str, backend: str, shape: FlShape, dtype: str) -> tuple[bool, str]:
        ok = bool(self.lib.fl_rung_supports(rung.encode(), backend.encode(), ctypes.byref(shape),
                                            FL_DTYPES[dtype][0]))
        return ok, "" if ok else self.lib.fl_last_error().decode()

    def workspace_bytes(self, rung: str, backend: str, shape: FlShape, dtype: str) -> int:
        n = ctypes.c_size_t(0)
        self._check(self.lib.fl_forward_workspace_bytes(rung.encode(), backend.encode(),
                                                        ctypes.byref(shape), FL_DTYPES[dtype][0],
                                                        ctypes.byref(n)))
        return n.value

    def forward(self, rung, shape, dtype, q, k, v, o, lse, ws, stream):
        """Device tensors; queued on `stream` (a cudaStream_t as an int)."""
        self._check(self.lib.fl_forward(
            rung.encode(), ctypes.byref(shape), FL_DTYPES[dtype][0], q.data_ptr(), k.data_ptr(),
            v.data_ptr(), o.data_ptr(), lse.data_ptr(), ws.data_ptr() if ws is not None else None,
            ws.numel() if ws is not None else 0, stream))

    def forward_host(self, rung, shape, dtype, q, k, v, o, lse, ws, stream=None):
        """Host tensors, the CPU twin; `stream` is ignored (same call shape as forward)."""
        self._check(self.lib.fl_forward_host(
            rung.encode(), ctypes.byref(shape), FL_DTYPES[dtype][0], q.data_ptr(), k.data_ptr(),
            v.data_ptr(), o.data_ptr(), lse.data_ptr(), ws.data_ptr() if ws is not None else None,
            ws.numel() if ws is not None else 0, None))


def find_library(given: str | None) -> str:
    candidates = [given] if given else [
        os.path.join(REPO, "build-hopper", "capi", "libflash_ladder.so"),
        os.path.join(REPO, "build", "capi", "libflash_ladder.so")]
    for c in candidates:
        if c and os.path.exists(c):
            return c
    sys.exit("libflash_ladder.so not found (looked at " + ", ".join(candidates) + "); build it "
             "(cmake --preset hopper && cmake --build build-hopper --target flash_ladder) or pass --lib")


# ---- Shapes ------------------------------------------------------------------------------------

@dataclass
class Shape:
    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    causal: bool

    def c(self) -> FlShape:
        return FlShape(self.batch, self.heads, self.kv_heads, self.seq_q, self.seq_k,
                       self.head_dim, int(self.causal), 0.0)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def spec(self) -> str:
        h = f"{self.heads}" + (f"/{self.kv_heads}" if self.kv_heads != self.heads else "")
        n = f"{self.seq_q}" + (f":{self.seq_k}" if self.seq_k != self.seq_q else "")
        return f"{self.batch}x{h}x{n}x{self.head_dim}" + ("c" if self.causal else "")

    def flops(self) -> float:  # shared/anchors.md: 4·B·H·Nq·Nk·d, half of it when causal
        f = 4.0 * self.batch * self.heads * self.seq_q * self.seq_k * self.head_dim
        return f / 2 if self.causal else f


SHAPE_RE = re.compile(r"^(\d+)x(\d+)(?:/(\d+))?x(\d+)(?::(\d+))?x(\d+)(c?)$")


def parse_shape(spec: str) -> Shape:
    m = SHAPE_RE.match(spec.strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"bad shape '{spec}': write B x H[/Hkv] x Nq[:Nk] x d, 'c' at the end for causal "
            "(1x16x4096x64, 2x32/8x1000:3000x128c)")
    b, h, hkv, nq, nk, d, c = m.groups()
    s = Shape(int(b), int(h), int(hkv or h), int(nq), int(nk or nq), int(d), c == "c")
    if min(s.batch, s.heads, s.kv_heads, s.seq_q, s.seq_k, s.head_dim) < 1 or s.heads % s.kv_heads:
        raise argparse.ArgumentTypeError(f"bad shape '{spec}': sizes must be >= 1 and H a multiple of Hkv")
    return s


def default_shapes(dtype: str, quick: bool, device: str) -> list[Shape]:
    if device == "cpu":  # the CPU twins count every byte they move: small problems only
        return [parse_shape("1x2/1x48:80x32"), parse_shape("1x2x64x32c")]
    if quick:
        # Ragged, GQA, Nq != Nk, and a causal square: the cases a fast kernel gets wrong first.
        return [parse_shape("1x4/2x200:300x64"), parse_shape("1x4x256x64c")]
    if dtype == "fp32":  # rungs 00-05: B=1, H=16; the bar for rung 05 is at N = 4096 and 16384
        return [parse_shape(s) for s in ("1x16x1024x64", "1x16x4096x64", "1x16x4096x64c", "1x16x4096x128",
                                         "1x16x16384x64", "1x16x16384x128")]
    # fp16 / bf16: the anchors' grid (shared/anchors.md), H=16 and B·N = 16384, causal and not
    return [parse_shape(f"{16384 // n}x16x{n}x{d}{c}") for d in (64, 128) for n in (1024, 4096, 16384)
            for c in ("", "c")]


# ---- Reference, errors, timing -----------------------------------------------------------------

def sdpa_backend_enum(name: str):
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def sdpa_kernel(name: str):
    from torch.nn.attention import sdpa_kernel as ctx
    return ctx([sdpa_backend_enum(name)])


def allowed_mask(shape: Shape, r0: int, r1: int, device) -> torch.Tensor:
    """[r1-r0, Nk] bool, True where query i may see key j: j <= i + (Nk - Nq), bottom-right."""
    i = torch.arange(r0, r1, device=device)[:, None]
    j = torch.arange(shape.seq_k, device=device)[None, :]
    return j <= i + (shape.seq_k - shape.seq_q)


def reference(shape: Shape, q, k, v, budget_elems: int = 1 << 25):
    """fp64 O [B,H,Nq,d] and lse [B,H,Nq], in chunks of heads × rows so that no score block holds
    more than budget_elems doubles (256 MiB): the full S of a long sequence would not fit."""
    B, H, Hkv, Nq, Nk, d = (shape.batch, shape.heads, shape.kv_heads, shape.seq_q, shape.seq_k,
                            shape.head_dim)
    group = H // Hkv
    qf = q.reshape(B * H, Nq, d)
    kf, vf = k.reshape(B * Hkv, Nk, d), v.reshape(B * Hkv, Nk, d)
    bh = torch.arange(B * H, device=q.device)
    kv_of = (bh // H) * Hkv + (bh % H) // group  # the key/value head query head bh reads
    o_ref = torch.empty(B * H, Nq, d, dtype=torch.float64, device=q.device)
    lse_ref = torch.empty(B * H, Nq, dtype=torch.float64, device=q.device)
    rows = max(1, min(Nq, budget_elems // Nk))
    heads = max(1, min(B * H, budget_elems // (rows * Nk)))
    for h0 in range(0, B * H, heads):
        h1 = min(B * H, h0 + heads)
        kk, vv = kf[kv_of[h0:h1]].double(), vf[kv_of[h0:h1]].double()
        for r0 in range(0, Nq, rows):
            r1 = min(Nq, r0 + rows)
            qq = qf[h0:h1, r0:r1].double()
            s = torch.matmul(qq, kk.transpose(-1, -2)) * shape.scale
            mask = allowed_mask(shape, r0, r1, q.device) if shape.causal else None
            if mask is not None:
                s.masked_fill_(~mask, float("-inf"))
            lse = torch.logsumexp(s, dim=-1)  # −inf for a row that sees no key
            del s
            with sdpa_kernel("math"):
                o = F.scaled_dot_product_attention(qq[None], kk[None], vv[None], attn_mask=mask,
                                                   scale=shape.scale)[0]
            o[torch.isinf(lse)] = 0.0  # the contract for a row that sees no key
            o_ref[h0:h1, r0:r1] = o
            lse_ref[h0:h1, r0:r1] = lse
    return o_ref.reshape(B, H, Nq, d), lse_ref.reshape(B, H, Nq)


def error_stats(out, ref) -> dict:
    """Relative L2 and max abs over elements finite in both; `bad` counts NaN/inf where the
    reference is finite, and the wrong value where it is −inf (a poisoned element left unwritten
    shows up here)."""
    out = out.double()
    ref_finite = torch.isfinite(ref)
    both = ref_finite & torch.isfinite(out)
    bad = int((ref_finite & ~torch.isfinite(out)).sum()) + int((~ref_finite & (out != ref)).sum())
    diff = torch.where(both, out - ref, torch.zeros_like(ref))
    refz = torch.where(both, ref, torch.zeros_like(ref))
    norm = float(torch.linalg.vector_norm(refz))
    err = float(torch.linalg.vector_norm(diff))
    return {"rel_err": err / norm if norm > 0 else err,
            "max_abs": float(diff.abs().max()) if diff.numel() else 0.0, "bad": bad}


class Timer:
    def __init__(self, device: str, warmup: int, reps: int, budget_s: float):
        self.device, self.warmup, self.reps, self.budget_s = device, warmup, reps, budget_s
        self.flush_buf = (torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
                          if device == "cuda" else None)

    def __call__(self, fn) -> tuple[float, int]:
        """Median milliseconds of fn() and how many calls were timed. Stops early once budget_s
        is spent (a slow rung on a long sequence), but never below 3 timed calls."""
        for _ in range(self.warmup):
            fn()
        if self.device == "cuda":
            torch.cuda.synchronize()
        times, t0 = [], time.perf_counter()
        for i in range(self.reps):
            if self.device == "cuda":
                self.flush_buf.zero_()  # before the start event: evicts L2, not timed
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
            if i >= 2 and time.perf_counter() - t0 > self.budget_s:
                break
        return statistics.median(times), len(times)


def short(e: BaseException | str, limit: int = 400) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= limit else s[:limit] + " ..."


def free_bytes(device: str) -> int:
    if device != "cuda":
        return 1 << 62
    free, _ = torch.cuda.mem_get_info()
    # Memory PyTorch has cached but not handed out is free to us too.
    return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()


# ---- One (shape, dtype) ------------------------------------------------------------------------

def run_problem(args, ladder: Ladder, shape: Shape, dtype: str, meta: dict, emit) -> None:
    dev = args.device
    tdtype = FL_DTYPES[dtype][1]
    base = dict(meta, **asdict(shape), shape=shape.spec(), dtype=dtype, flops=shape.flops())

    def row(kind, name, **kw):
        r = dict(base, kind=kind, name=name, backend=backend if kind == "rung" else "torch",
                 ms=None, tflops=None, rel_err=None, max_abs=None, lse_rel_err=None, bad=None,
                 passed=None, reps=None, error=None, skip=None)
        r.update(kw)
        emit(r)

    backend = "cuda" if dev == "cuda" else "cpu"
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    q = torch.randn(shape.batch, shape.heads, shape.seq_q, shape.head_dim, device=dev,
                    dtype=tdtype, generator=gen)
    k = torch.randn(shape.batch, shape.kv_heads, shape.seq_k, shape.head_dim, device=dev,
                    dtype=tdtype, generator=gen)
    v = torch.randn(k.shape, device=dev, dtype=tdtype, generator=gen)
    try:
        o_ref, lse_ref = reference(shape, q, k, v)
    except Exception as e:  # without a reference nothing can be checked; say so and move on
        row("reference", "fp64", error=short(e))
        return
    timer = Timer(dev, args.warmup, args.reps, args.budget_s)
    stream = torch.cuda.current_stream().cuda_stream if dev == "cuda" else None
    call = ladder.forward if dev == "cuda" else ladder.forward_host

    # -- the ladder's rungs
    for rung in ladder.rungs(backend):
        if args.rungs and rung not in args.rungs:
            continue
        name = f"{rung} ({backend})"
        ok, why = ladder.supports(rung, backend, shape.c(), dtype)
        if not ok:
            row("rung", name, skip=short(why))
            continue
        try:
            ws_bytes = ladder.workspace_bytes(rung, backend, shape.c(), dtype)
            need = ws_bytes + q.numel() * q.element_size() + shape.batch * shape.heads * shape.seq_q * 4
            if need + (512 << 20) > free_bytes(dev):
                row("rung", name, skip=f"needs {need / 2**30:.2f} GiB more device memory "
                                       f"(workspace {ws_bytes / 2**30:.2f} GiB); "
                                       f"{free_bytes(dev) / 2**30:.2f} GiB free")
                continue
            o = torch.full_like(q, float("nan"))  # poisoned: an unwritten element shows as bad
            lse = torch.full((shape.batch, shape.heads, shape.seq_q), float("nan"),
                             dtype=torch.float32, device=dev)
            ws = torch.empty(ws_bytes, dtype=torch.uint8, device=dev) if ws_bytes else None
            fn = lambda: call(rung, shape.c(), dtype, q, k, v, o, lse, ws, stream)  # noqa: E731
            fn()
            if dev == "cuda":
                torch.cuda.synchronize()  # a fault in the kernel surfaces here, not in the timing
            eo, el = error_stats(o, o_ref), error_stats(lse, lse_ref)
            passed = eo["bad"] == 0 and el["bad"] == 0 and eo["rel_err"] <= TOLERANCE[dtype] \
                and el["rel_err"] <= TOLERANCE[dtype]
            ms, reps = timer(fn)
            row("rung", name, ms=ms, tflops=shape.flops() / (ms * 1e-3) / 1e12, reps=reps,
                rel_err=eo["rel_err"], max_abs=eo["max_abs"], lse_rel_err=el["rel_err"],
                bad=eo["bad"] + el["bad"], passed=passed, workspace_bytes=ws_bytes)
        except Exception as e:
            row("rung", name, error=short(e), passed=False)
        finally:
            o = lse = ws = None
            if dev == "cuda":
                torch.cuda.empty_cache()

    # -- PyTorch's SDPA backends on the same inputs
    for peer in args.peers:
        name = f"sdpa_{peer}"
        if shape.causal and shape.seq_q != shape.seq_k:
            row("sdpa", name, skip="SDPA's is_causal is top-left aligned when Nq != Nk; the "
                                   "ladder's contract is bottom-right, so only Nq == Nk compares")
            continue
        attempts = [("enable_gqa", k, v, {"enable_gqa": True})] if shape.kv_heads != shape.heads \
            else [("", k, v, {})]
        if shape.kv_heads != shape.heads:  # fallback for backends / versions without enable_gqa
            g = shape.heads // shape.kv_heads
            attempts.append(("repeat_interleave", k.repeat_interleave(g, dim=1),
                             v.repeat_interleave(g, dim=1), {}))
        errors = []
        for how, kk, vv, kw in attempts:
            fn = lambda: F.scaled_dot_product_attention(  # noqa: E731
                q, kk, vv, is_causal=shape.causal, scale=shape.scale, **kw)
            try:
                with sdpa_kernel(peer), warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        out = fn()
                    except Exception as e:
                        # PyTorch says why a backend refused in warnings; keep them with the error.
                        why = "; ".join(short(w.message, 200) for w in caught)
                        raise RuntimeError(short(e, 200) + (f" [{why}]" if why else "")) from None
                    if dev == "cuda":
                        torch.cuda.synchronize()
                    eo = error_stats(out, o_ref)
                    del out
                    ms, reps = timer(fn)
                row("sdpa", name, ms=ms, tflops=shape.flops() / (ms * 1e-3) / 1e12, reps=reps,
                    rel_err=eo["rel_err"], max_abs=eo["max_abs"], bad=eo["bad"],
                    passed=eo["bad"] == 0 and eo["rel_err"] <= TOLERANCE[dtype], gqa=how or None)
                break
            except Exception as e:
                errors.append((f"{how}: " if how else "") + short(e))
                if dev == "cuda":
                    torch.cuda.empty_cache()
        else:
            row("sdpa", name, error=" | ".join(errors))


# ---- Driver ------------------------------------------------------------------------------------

def metadata(ladder: Ladder, device: str) -> dict:
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "library": ladder.build_info,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def run_worker(args) -> int:
    """One process, every (shape, dtype) given; rows appended to args.rows_out as JSON lines as
    they are measured, so a crash keeps what was done before it."""
    ladder = Ladder(args.lib)
    if args.device == "cuda":
        ok, why = ladder.cuda_available()
        if not ok or not torch.cuda.is_available():
            print(f"compare_torch: no GPU ({why or 'torch.cuda.is_available() is False'}); "
                  "--device cpu compares the CPU twins", file=sys.stderr)
            return 2
    meta = metadata(ladder, args.device)
    with open(args.rows_out, "a") as out:
        def emit(r):
            out.write(json.dumps(r) + "\n")
            out.flush()
            if r["ms"] is not None:
                status = (f"{r['ms']:9.3f} ms {r['tflops']:7.2f} TFLOP/s rel_err {r['rel_err']:.1e}"
                          + ("" if r["passed"] else "  FAIL"))
            elif r["skip"]:
                status = f"skipped: {r['skip']}"
            else:
                status = f"ERROR: {r['error']}"
            print(f"  {r['shape']:>22} {r['dtype']} {r['name']:<32} {status}", flush=True)
        for dtype in args.dtype:
            for shape in args.shapes_for[dtype]:
                if args.deadline and time.time() > args.deadline:
                    emit(dict(meta, **asdict(shape), shape=shape.spec(), dtype=dtype, kind="time",
                              name="time", ms=None, passed=None, error=None,
                              skip=f"not started: --time-limit {args.time_limit:.0f} s spent"))
                    continue
                run_problem(args, ladder, shape, dtype, meta, emit)
    return 0


def worker_command(args, shape: Shape, dtype: str, rows_out: str) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--lib", args.lib,
           "--device", args.device, "--dtype", dtype, "--shapes", shape.spec(),
           "--reps", str(args.reps), "--warmup", str(args.warmup), "--budget-s", str(args.budget_s),
           "--seed", str(args.seed), "--peers", ",".join(args.peers), "--rows-out", rows_out]
    if args.rungs:
        cmd += ["--rungs", ",".join(args.rungs)]
    return cmd


def print_table(rows: list[dict]) -> None:
    peers = SDPA_BACKENDS
    print("\nEach rung's time as a ratio to each SDPA backend in this run (ours / theirs: 2.0x is "
          "twice as slow; - where that backend did not run)")
    head = f"{'shape':>22} {'dtype':5} {'kernel':<30} {'ms':>9} {'TFLOP/s':>8} {'rel_err':>8} " + \
        " ".join(f"{'vs ' + p:>12}" for p in peers)
    print(head)
    print("-" * len(head))
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["shape"], r["dtype"]), []).append(r)
    notes = []
    for (spec, dtype), rs in groups.items():
        peer_ms = {r["name"][len("sdpa_"):]: r["ms"] for r in rs
                   if r["kind"] == "sdpa" and r["ms"] is not None}
        for r in rs:
            if r["ms"] is None:
                why = f"skipped: {r['skip']}" if r["skip"] else f"ERROR: {r['error']}"
                notes.append(short(f"{spec} {dtype} {r['name']}: {why}", 240))
                continue
            ratios = " ".join(format("%.2fx" % (r["ms"] / peer_ms[p]) if p in peer_ms else "-", ">12")
                              for p in peers)
            flag = "" if r["passed"] else "  FAIL"
            print(f"{spec:>22} {dtype:5} {r['name']:<30} {r['ms']:9.3f} {r['tflops']:8.2f} "
                  f"{r['rel_err']:8.1e} {ratios}{flag}")
    if notes:
        print("\nNot measured:")
        for n in notes:
            print("  " + n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path to libflash_ladder.so (default: build-hopper/capi/, then build/capi/)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cuda: GPU rungs vs SDPA on the GPU; cpu: CPU twins vs SDPA on the CPU")
    ap.add_argument("--dtype", default="fp32", help="comma-separated: fp32,fp16,bf16 (default fp32)")
    ap.add_argument("--shapes", nargs="+", type=parse_shape, help="B x H[/Hkv] x Nq[:Nk] x d[c] ...")
    ap.add_argument("--quick", action="store_true", help="two small ragged shapes, for a smoke test")
    ap.add_argument("--rungs", help="comma-separated rung names (default: every rung in the library)")
    ap.add_argument("--peers", default=",".join(SDPA_BACKENDS), help="SDPA backends to time")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per measurement (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=2.0,
                    help="stop timing a kernel after this many seconds (at least 3 calls)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every row to this file (a JSON list)")
    ap.add_argument("--in-process", action="store_true",
                    help="measure everything in this process (faster start; a faulting kernel "
                         "then spoils the rest of the run)")
    ap.add_argument("--worker-timeout", type=float, default=300,
                    help="seconds a worker may take for one shape before it is stopped")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="seconds for the whole run (0: none); shapes not started by then are "
                         "reported as skipped, and --json holds what was measured")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rows-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    args.dtype = [d.strip() for d in args.dtype.split(",") if d.strip()]
    for d in args.dtype:
        if d not in FL_DTYPES:
            ap.error(f"unknown dtype '{d}': allowed are {', '.join(FL_DTYPES)}")
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for p in args.peers:
        if p not in SDPA_BACKENDS:
            ap.error(f"unknown SDPA backend '{p}': allowed are {', '.join(SDPA_BACKENDS)}")
    args.rungs = [r.strip() for r in args.rungs.split(",")] if args.rungs else []
    args.lib = find_library(args.lib)
    args.shapes_for = {d: args.shapes or default_shapes(d, args.quick, args.device) for d in args.dtype}

    # Only the top process keeps the clock: a worker runs the one shape it is given.
    args.deadline = time.time() + args.time_limit if args.time_limit and not args.worker else 0
    if args.worker:
        return run_worker(args)

    ladder = Ladder(args.lib)
    if args.device == "cuda":
        ok, why = ladder.cuda_available()
        if not ok or not torch.cuda.is_available():
            print(f"compare_torch: no GPU ({why or 'torch.cuda.is_available() is False'}); "
                  "--device cpu compares the CPU twins with PyTorch on the CPU", file=sys.stderr)
            return 2
    print(f"compare_torch: {ladder.build_info} from {args.lib}; torch {torch.__version__}"
          + (f", {torch.cuda.get_device_name()}" if args.device == "cuda" and torch.cuda.is_available() else ""),
          flush=True)
    started = time.perf_counter()
    failures = 0

    def note(shape: Shape, dtype: str, kind: str, **kw) -> None:
        r = dict(asdict(shape), shape=shape.spec(), dtype=dtype, kind=kind, name=kind, ms=None,
                 skip=None, error=None, passed=None)
        r.update(kw)
        with open(rows_out, "a") as f:
            f.write(json.dumps(r) + "\n")

    def read_rows() -> list[dict]:
        if not os.path.exists(rows_out):
            return []
        with open(rows_out) as f:
            return [json.loads(line) for line in f if line.strip()]

    def write_json(rows: list[dict]) -> None:
        # Rewritten after every shape, so a run stopped from outside still leaves valid JSON.
        if args.json:
            with open(args.json + ".part", "w") as f:
                json.dump(rows, f, indent=1)
            os.replace(args.json + ".part", args.json)

    with tempfile.TemporaryDirectory() as tmp:
        rows_out = os.path.join(tmp, "rows.jsonl")
        jobs = [(s, d) for d in args.dtype for s in args.shapes_for[d]]
        if args.in_process:
            args.rows_out = rows_out
            failures += run_worker(args) != 0
        else:
            for shape, dtype in jobs:
                left = args.time_limit - (time.perf_counter() - started) if args.time_limit else None
                if left is not None and left < 5:
                    note(shape, dtype, "time", skip=f"not started: --time-limit {args.time_limit:.0f} s spent")
                    continue
                timeout = min(args.worker_timeout, left) if left is not None else args.worker_timeout
                t0 = time.perf_counter()
                print(f"[{shape.spec()} {dtype}]", flush=True)
                before = len(read_rows())
                try:
                    rc = subprocess.run(worker_command(args, shape, dtype, rows_out),
                                        timeout=timeout).returncode
                    why = f"worker exited with status {rc} (its output is above)" if rc else ""
                except subprocess.TimeoutExpired:
                    if timeout < args.worker_timeout:  # the run's own time was up, not a hang
                        note(shape, dtype, "time", skip=f"stopped: --time-limit {args.time_limit:.0f} s spent")
                        write_json(read_rows())
                        continue
                    why = f"worker still running after {timeout:.0f} s; stopped"
                if why:
                    failures += 1
                    note(shape, dtype, "worker", passed=False,
                         error=f"{why}; {len(read_rows()) - before} rows measured before it")
                print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
                write_json(read_rows())
        rows = read_rows()

    write_json(rows)
    if args.json:
        print(f"wrote {len(rows)} rows to {args.json}")
    print_table(rows)
    bad = [r for r in rows if r["kind"] in ("rung", "reference", "worker")
           and (r.get("error") or r.get("passed") is False)]
    if bad:
        print(f"\n{len(bad)} rung measurement(s) failed or were wrong:")
        for r in bad:
            print(f"  {r['shape']} {r['dtype']} {r['name']}: "
                  + (r.get("error") or f"rel_err {r['rel_err']:.2e}, {r['bad']} bad elements"))
    return 1 if bad or failures else 0


if __name__ == "__main__":
    sys.exit(main())
