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
  * then the backward (unless --no-backward), with a random dO drawn from the same seed:
      - an fp64 reference dq, dk, dv by torch.autograd through the same math on float64 upcast
        inputs (reference_backward; GQA: dk, dv summed over the query heads of each group, as the
        rungs return them; causal with Nq != Nk bottom-right aligned, as the forward's reference);
      - every rung whose fl_rung_has_backward is 1: fl_forward once for its own O and lse, then
        fl_backward on NaN-poisoned dq, dk, dv, checked against the reference; then timed alone
        (phase "bwd": fl_backward on that O and lse) and with its forward (phase "fwd+bwd":
        fl_forward then fl_backward per call); the backward run --repeat-check more times and how
        many gave the same bits recorded (identical_runs); a rung with a deterministic mode
        (fl_rung_has_deterministic_backward) also in that mode: checked, repeated, timed (phase
        "bwd-det": fl_backward_ex with FL_BACKWARD_DETERMINISTIC);
      - every SDPA backend through autograd, q, k, v requiring grad: phase "bwd" times
        torch.autograd.grad(out, (q, k, v), dO, retain_graph=True) on one forward's graph (the
        backward alone, the graph kept for the next call), phase "fwd+bwd" times a forward and
        torch.autograd.grad together; gradients checked against the same reference;
  * prints each rung's forward time as a ratio to each SDPA backend, and a backward table with
    each kernel's bwd and fwd+bwd time and TFLOP/s and its backward's ratio to FlashAttention-2's
    (SDPA flash) and cuDNN's, and writes every row to --json. Rows carry kind ("rung", "sdpa",
    "memory", ...) and phase ("fwd", "bwd", "fwd+bwd", "bwd-det").

TFLOP/s by shared/anchors.md: the forward 4·B·H·Nq·Nk·d (half when causal), the backward 2.5×
that, forward+backward 3.5×.

Timing: CUDA events around one call, warm-up first, median of the repetitions. Before every call,
outside the timed region, a 256 MiB buffer is read so that L2 holds nothing useful, then a spin
kernel keeps the GPU busy for about a millisecond so that the host has queued the whole call
before the GPU reaches the start event (--flush ahead). Runs before 2026-11-24 wrote the buffer
instead (--flush dirty), and so timed two things besides the GPU's work: the write-back of the
modified lines that left in L2 (about 10 us on an H100) and, where the host took longer to queue
a call than the GPU took to write the buffer (SDPA's backward through autograd), the GPU idle. With --sustained S,
instead: S seconds of back-to-back calls first, then five stretches of about S/5 seconds each timed
as a whole (no flush, no synchronisation between calls), the median stretch's time per call: the
clock and power state of a long run, where a GPU at its power limit runs slower than in short
bursts (rows carry "sustained_s"). With --rounds R, each cell's timings are put off to its end and
taken in R rounds, the order reversed every other round, so that no kernel is always timed first
or last (class Rounds; rows carry "rounds" and "ms_rounds").

--memory-sweep adds (first, as it is short) the extra device memory of one forward+backward against
N, B=1 H=16 d=64 bf16, N = 1024..65536: each rung with a backward pass (its workspaces, measured
with PyTorch's peak statistics) beside standard attention (SDPA's math backend through autograd);
where standard attention runs out of memory the row says so with the N²-scaled prediction.
bench/plot.py --memory draws it.

Each (shape, dtype) runs in a fresh worker process by default: a kernel that faults leaves its CUDA
context unusable, and isolation keeps that from taking every later measurement with it. With
--time-limit, a worker still running when the time is up is stopped (the rows it wrote are kept)
and shapes not started are reported as skipped.

    python3 bench/compare_torch.py --quick
    python3 bench/compare_torch.py --dtype fp32,bf16 --json torch.json
    python3 bench/compare_torch.py --dtype bf16 --memory-sweep --json torch.json
    python3 bench/compare_torch.py --memory-sweep only --json memory.json
    python3 bench/compare_torch.py --shapes 1x16x4096x64c 2x32/8x1000:3000x128 --rungs 05_fa2_loop_order

Shapes are B x H[/Hkv] x Nq[:Nk] x d, with a trailing c for causal. --device cpu runs the CPU twins
(fl_forward_host, fl_backward_host) against PyTorch on the CPU, for a machine with no GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
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
from functools import partial

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # said plainly: this script is for a machine that has PyTorch
    if {"-h", "--help"} & set(sys.argv[1:]):  # what it does can still be read here
        print(__doc__)
        sys.exit("(the flags' list needs PyTorch to print: run --help where PyTorch is installed)")
    sys.exit("compare_torch.py needs PyTorch (import torch failed); run it where PyTorch is installed")

FL_ABI_VERSION = 5  # must match FL_ABI_VERSION in capi/flash_ladder.h
FL_DTYPES = {"fp32": (0, torch.float32), "fp16": (1, torch.float16), "bf16": (2, torch.bfloat16)}
FL_BACKWARD_DETERMINISTIC = 1  # fl_backward_ex flags, capi/flash_ladder.h
# Relative L2 error each dtype is held to against the fp64 reference (common/compare.cpp).
TOLERANCE = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 2e-2}
SDPA_BACKENDS = ["flash", "cudnn", "efficient", "math"]
FLUSH_BYTES = 256 << 20
FLUSH_MODES = ("ahead", "clean", "dirty")  # what Timer does before a timed call (Timer.flush)
AHEAD_CYCLES = 2_000_000  # the "ahead" mode's GPU spin: about a millisecond at an H100's clocks
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- The C ABI ---------------------------------------------------------------------------------

class FlShape(ctypes.Structure):  # mirrors fl_shape in capi/flash_ladder.h
    _fields_ = [("batch", ctypes.c_int64), ("heads", ctypes.c_int64), ("kv_heads", ctypes.c_int64),
                ("seq_q", ctypes.c_int64), ("seq_k", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("causal", ctypes.c_int), ("scale", ctypes.c_double)]


class FlDecodeShape(ctypes.Structure):  # mirrors fl_decode_shape (rung 10, decoding)
    _fields_ = [("batch", ctypes.c_int64), ("heads", ctypes.c_int64), ("kv_heads", ctypes.c_int64),
                ("seq_q", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("capacity", ctypes.c_int64),
                ("page_size", ctypes.c_int64), ("num_pages", ctypes.c_int64),
                ("pages_per_seq", ctypes.c_int64), ("causal", ctypes.c_int), ("scale", ctypes.c_double)]


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
        dshape = ctypes.POINTER(FlDecodeShape)
        sigs = {
            "fl_abi_version": ([], I), "fl_version": ([], S), "fl_build_info": ([], S),
            "fl_cuda_available": ([], I), "fl_last_error": ([], S), "fl_status_name": ([I], S),
            "fl_rung_count": ([], I), "fl_rung_name": ([I], S), "fl_rung_backend": ([I], S),
            "fl_rung_idea": ([I], S), "fl_rung_has_backward": ([I], I),
            "fl_rung_has_deterministic_backward": ([I], I),
            "fl_rung_supports": ([S, S, shape, I], I),
            "fl_forward_workspace_bytes": ([S, S, shape, I, ctypes.POINTER(Z)], I),
            "fl_forward": ([S, shape, I, P, P, P, P, P, P, Z, P], I),
            "fl_forward_host": ([S, shape, I, P, P, P, P, P, P, Z, io], I),
            "fl_backward_workspace_bytes": ([S, S, shape, I, ctypes.POINTER(Z)], I),
            "fl_backward": ([S, shape, I, P, P, P, P, P, P, P, P, P, P, Z, P], I),
            "fl_backward_host": ([S, shape, I, P, P, P, P, P, P, P, P, P, P, Z, io], I),
            "fl_backward_ex": ([S, shape, I, P, P, P, P, P, P, P, P, P, P, Z, ctypes.c_uint, P], I),
            # rung 10, decoding
            "fl_decode_choose_splits": ([dshape, ctypes.c_int64, I], I),
            "fl_decode_workspace_bytes": ([dshape, I, ctypes.POINTER(Z)], I),
            "fl_decode_host": ([dshape, I, P, P, P, P, P, P, P, I, P, Z, io], I),
            "fl_decode_version_count": ([], I), "fl_decode_version_name": ([I], S),
            "fl_decode_version_idea": ([I], S),
            "fl_decode": ([S, dshape, I, P, P, P, P, P, P, P, I, P, Z, P], I),
            "fl_stream_read": ([P, Z, P, P], I),
        }
        # The version first: a library of another version may lack some of the functions below.
        if lib.fl_abi_version() != FL_ABI_VERSION:
            raise FlError(f"{path} has C ABI version {lib.fl_abi_version()}, this script speaks "
                          f"{FL_ABI_VERSION}: rebuild the library or update the script")
        for name, (args, res) in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res

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

    def rungs(self, backend: str, backward: bool = False) -> list[str]:
        """The rungs on `backend`; with backward=True only those whose fl_rung_has_backward is 1."""
        n = self.lib.fl_rung_count()
        return [self.lib.fl_rung_name(i).decode() for i in range(n)
                if self.lib.fl_rung_backend(i).decode() == backend
                and (not backward or self.lib.fl_rung_has_backward(i))]

    def has_deterministic_backward(self, rung: str, backend: str) -> bool:
        """Whether fl_backward_ex runs FL_BACKWARD_DETERMINISTIC for this rung."""
        n = self.lib.fl_rung_count()
        return any(self.lib.fl_rung_name(i).decode() == rung and self.lib.fl_rung_backend(i).decode() == backend
                   and self.lib.fl_rung_has_deterministic_backward(i) for i in range(n))

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

    def backward_workspace_bytes(self, rung: str, backend: str, shape: FlShape, dtype: str) -> int:
        """Raises FlError naming why when the rung does not run this backward."""
        n = ctypes.c_size_t(0)
        self._check(self.lib.fl_backward_workspace_bytes(rung.encode(), backend.encode(),
                                                         ctypes.byref(shape), FL_DTYPES[dtype][0],
                                                         ctypes.byref(n)))
        return n.value

    def backward(self, rung, shape, dtype, q, k, v, o, lse, dout, dq, dk, dv, ws, stream):
        """Device tensors; dq, dk, dv from q, k, v, the forward's o and lse, and dout."""
        self._check(self.lib.fl_backward(
            rung.encode(), ctypes.byref(shape), FL_DTYPES[dtype][0], q.data_ptr(), k.data_ptr(),
            v.data_ptr(), o.data_ptr(), lse.data_ptr(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr(),
            dv.data_ptr(), ws.data_ptr() if ws is not None else None,
            ws.numel() if ws is not None else 0, stream))

    def backward_deterministic(self, rung, shape, dtype, q, k, v, o, lse, dout, dq, dk, dv, ws, stream):
        """fl_backward_ex with FL_BACKWARD_DETERMINISTIC: the same bits every run."""
        self._check(self.lib.fl_backward_ex(
            rung.encode(), ctypes.byref(shape), FL_DTYPES[dtype][0], q.data_ptr(), k.data_ptr(),
            v.data_ptr(), o.data_ptr(), lse.data_ptr(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr(),
            dv.data_ptr(), ws.data_ptr() if ws is not None else None,
            ws.numel() if ws is not None else 0, FL_BACKWARD_DETERMINISTIC, stream))

    def backward_host(self, rung, shape, dtype, q, k, v, o, lse, dout, dq, dk, dv, ws, stream=None):
        """Host tensors, the CPU twin's backward; `stream` is ignored."""
        self._check(self.lib.fl_backward_host(
            rung.encode(), ctypes.byref(shape), FL_DTYPES[dtype][0], q.data_ptr(), k.data_ptr(),
            v.data_ptr(), o.data_ptr(), lse.data_ptr(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr(),
            dv.data_ptr(), ws.data_ptr() if ws is not None else None,
            ws.numel() if ws is not None else 0, None))

    # -- rung 10, decoding (bench/compare_decode.py)

    def decode_versions(self) -> list[str]:
        """The names of rung 10's kernels, in the chapter's order (none in a CPU-only build)."""
        return [self.lib.fl_decode_version_name(i).decode() for i in range(self.lib.fl_decode_version_count())]

    def decode_choose_splits(self, shape: FlDecodeShape, max_len: int, sm_count: int) -> int:
        """The pieces fl_decode's splits = 0 would take for a longest sequence of max_len keys."""
        n = self.lib.fl_decode_choose_splits(ctypes.byref(shape), max_len, sm_count)
        if n < 1:
            raise FlError(f"fl_decode_choose_splits: {self.lib.fl_last_error().decode()}")
        return n

    def decode_workspace_bytes(self, shape: FlDecodeShape, splits: int) -> int:
        n = ctypes.c_size_t(0)
        self._check(self.lib.fl_decode_workspace_bytes(ctypes.byref(shape), splits, ctypes.byref(n)))
        return n.value

    def decode(self, version, shape, dtype, q, k, v, page_table, kv_len, o, lse, splits, ws, stream):
        """Device tensors (page_table None for a contiguous cache); queued on `stream`."""
        self._check(self.lib.fl_decode(
            version.encode(), ctypes.byref(shape), FL_DTYPES[dtype][0], q.data_ptr(), k.data_ptr(),
            v.data_ptr(), page_table.data_ptr() if page_table is not None else None, kv_len.data_ptr(),
            o.data_ptr(), lse.data_ptr(), splits, ws.data_ptr() if ws is not None else None,
            ws.numel() if ws is not None else 0, stream))

    def decode_host(self, shape, dtype, q, k, v, page_table, kv_len, o, lse, splits, ws=None, io=None):
        """Host tensors, the CPU twin; io, an FlIo or None, receives the bytes it moved."""
        self._check(self.lib.fl_decode_host(
            ctypes.byref(shape), FL_DTYPES[dtype][0], q.data_ptr(), k.data_ptr(), v.data_ptr(),
            page_table.data_ptr() if page_table is not None else None, kv_len.data_ptr(), o.data_ptr(),
            lse.data_ptr(), splits, ws.data_ptr() if ws is not None else None,
            ws.numel() if ws is not None else 0, ctypes.byref(io) if io is not None else None))

    def stream_read(self, data, sink, stream, nbytes: int | None = None):
        """fl_stream_read over the first nbytes (default: all) of device tensor `data`."""
        nbytes = data.numel() * data.element_size() if nbytes is None else nbytes
        self._check(self.lib.fl_stream_read(data.data_ptr(), nbytes, sink.data_ptr(), stream))


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


def reference_backward(shape: Shape, q, k, v, dout, budget_elems: int = 1 << 24):
    """fp64 dq [B,H,Nq,d], dk and dv [B,Hkv,Nk,d] by torch.autograd through the same math as
    reference() (scores, the mask of allowed_mask, softmax, P·V) on inputs upcast to float64, in
    chunks of heads × rows whose score block holds at most budget_elems doubles (128 MiB; autograd
    keeps a few such blocks). dk and dv are summed over the query heads of each group, as a rung
    returns them (index_add_ over each chunk's key/value heads, which repeat within a chunk under
    GQA), and over the row chunks. A row that sees no key (causal, Nq > Nk) has P = 0, so its dq is 0
    and it adds nothing to dk, dv: its scores are set to 0 before the softmax and P multiplied by 0
    after, so no −inf − (−inf) reaches autograd."""
    B, H, Hkv, Nq, Nk, d = (shape.batch, shape.heads, shape.kv_heads, shape.seq_q, shape.seq_k,
                            shape.head_dim)
    group = H // Hkv
    qf, dof = q.reshape(B * H, Nq, d), dout.reshape(B * H, Nq, d)
    kf, vf = k.reshape(B * Hkv, Nk, d), v.reshape(B * Hkv, Nk, d)
    bh = torch.arange(B * H, device=q.device)
    kv_of = (bh // H) * Hkv + (bh % H) // group  # the key/value head query head bh reads
    dq = torch.zeros(B * H, Nq, d, dtype=torch.float64, device=q.device)
    dk = torch.zeros(B * Hkv, Nk, d, dtype=torch.float64, device=q.device)
    dv = torch.zeros_like(dk)
    rows = max(1, min(Nq, budget_elems // Nk))
    heads = max(1, min(B * H, budget_elems // (rows * Nk)))
    with torch.enable_grad():
        for h0 in range(0, B * H, heads):
            h1 = min(B * H, h0 + heads)
            idx = kv_of[h0:h1]
            for r0 in range(0, Nq, rows):
                r1 = min(Nq, r0 + rows)
                qq = qf[h0:h1, r0:r1].double().requires_grad_()
                kk = kf[idx].double().requires_grad_()
                vv = vf[idx].double().requires_grad_()
                s = torch.matmul(qq, kk.transpose(-1, -2)) * shape.scale
                if shape.causal:
                    mask = allowed_mask(shape, r0, r1, q.device)  # [rows, Nk], bottom-right aligned
                    seen = mask.any(dim=-1, keepdim=True)         # [rows, 1]: sees some key
                    s = torch.where(seen, s.masked_fill(~mask, float("-inf")), torch.zeros_like(s))
                    p = torch.softmax(s, dim=-1) * seen
                else:
                    p = torch.softmax(s, dim=-1)
                o = torch.matmul(p, vv)
                gq, gk, gv = torch.autograd.grad(o, (qq, kk, vv), dof[h0:h1, r0:r1].double())
                dq[h0:h1, r0:r1] = gq
                dk.index_add_(0, idx, gk)
                dv.index_add_(0, idx, gv)
                del s, p, o, gq, gk, gv
    return dq.reshape(B, H, Nq, d), dk.reshape(B, Hkv, Nk, d), dv.reshape(B, Hkv, Nk, d)


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
    def __init__(self, device: str, warmup: int, reps: int, budget_s: float, sustained_s: float = 0.0,
                 flush: str = "ahead"):
        self.device, self.warmup, self.reps, self.budget_s = device, warmup, reps, budget_s
        self.sustained_s = sustained_s if device == "cuda" else 0.0
        if flush not in FLUSH_MODES:
            raise ValueError(f"flush must be one of {', '.join(FLUSH_MODES)}, not {flush!r}")
        self.flush_mode = flush
        self.flush_buf = (torch.zeros(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
                          if device == "cuda" else None)

    def flush(self) -> None:
        """Before a timed call, outside the timed region. "dirty" writes the buffer, which evicts
        L2 but leaves it full of modified lines that the timed call's own reads must first write
        back to HBM; "clean" reads it, which leaves L2 full of unmodified lines the call can simply
        drop; "ahead" (the default) reads it and then keeps the GPU busy for about a millisecond
        (a spin kernel), so that the host has queued the whole timed call before the GPU reaches
        the start event: the events then time the GPU's work, not the host's (SDPA's backward
        through autograd takes the host long enough to leave the GPU idle inside the timed region)."""
        if self.flush_mode == "dirty":
            self.flush_buf.zero_()
        else:
            # Viewed as int32 and summed as int32: summing the uint8 buffer into an int32 would
            # first convert all of it (a 1 GiB temporary, written then read).
            self.flush_buf.view(torch.int32).sum(dtype=torch.int32)
            if self.flush_mode == "ahead":
                torch.cuda._sleep(AHEAD_CYCLES)

    def sustained(self, fn) -> tuple[float, int]:
        """Milliseconds per call of fn() under sustained load (--sustained): calls back to back for
        sustained_s seconds, then five stretches of about sustained_s / 5 seconds each timed with
        one pair of events; the median stretch's time per call, and how many calls were timed."""
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        one = max(time.perf_counter() - t, 1e-5)
        warm_end = time.perf_counter() + self.sustained_s
        while time.perf_counter() < warm_end:
            for _ in range(max(1, int(0.05 / one))):
                fn()
            torch.cuda.synchronize()
        n = max(3, int(self.sustained_s / 5 / one))
        per_call, timed = [], 0
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            per_call.append(start.elapsed_time(end) / n)
            timed += n
        return statistics.median(per_call), timed

    def __call__(self, fn) -> tuple[float, int]:
        """Median milliseconds of fn() and how many calls were timed. Stops early once budget_s
        is spent (a slow rung on a long sequence), but never below 3 timed calls."""
        if self.sustained_s > 0:
            return self.sustained(fn)
        times = self.samples(fn, self.reps, self.budget_s)
        return statistics.median(times), len(times)

    def samples(self, fn, reps: int, budget_s: float) -> list[float]:
        """The milliseconds of each of up to reps timed calls of fn(), after the warm-up calls;
        stops once budget_s is spent, but never below 3 calls."""
        for _ in range(self.warmup):
            fn()
        if self.device == "cuda":
            torch.cuda.synchronize()
        times, t0 = [], time.perf_counter()
        for i in range(reps):
            if self.device == "cuda":
                self.flush()  # before the start event: evicts L2, not timed
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
            if i >= 2 and time.perf_counter() - t0 > budget_s:
                break
        return times


class Rounds:
    """When the timings of a cell (one shape in one dtype: every rung's and SDPA backend's forward,
    then their backward phases) are taken. Kernels timed one after another do not all meet the GPU
    in the same state: in runs where two versions share one kernel, the second-timed one's backward
    read about 1 % slower on average, and up to 15 % at one shape (chapter 09, What is left). With
    --rounds 1 (the default) each timing is taken when it is asked for, in that order. With
    --rounds R every timing of the cell is put off until settle(), which takes them all in R
    rounds, the order reversed every other round (A B C, C B A, A B C, ...). Each round, for each
    kernel: the --warmup untimed calls, then ceil(reps / R) timed calls (at least 3), stopped early
    once budget_s / R seconds are spent. A kernel's time is the median of all its timed calls; its
    row also carries each round's median (ms_rounds). An even R gives every kernel the same mean
    place in the order, which cancels a drift through the cell that is linear in that place."""

    def __init__(self, timer: Timer, rounds: int):
        self.timer, self.rounds, self.pending = timer, rounds, []

    def time(self, fn, done, failed, context=contextlib.nullcontext) -> None:
        """Times fn() and calls done(ms=..., reps=...) (with --rounds R > 1 also ms_rounds=...),
        now or at settle(); an exception at settle() goes to failed(e) instead, and now to the
        caller. context() is entered around each stretch of timed calls (SDPA's backend choice)."""
        if self.rounds <= 1:
            with context():
                ms, reps = self.timer(fn)
            done(ms=ms, reps=reps)
        else:
            self.pending.append((fn, done, failed, context))

    def settle(self) -> None:
        pending, self.pending = self.pending, []
        if not pending:
            return
        reps = max(3, math.ceil(self.timer.reps / self.rounds))
        budget = self.timer.budget_s / self.rounds
        times = [[] for _ in pending]
        medians = [[] for _ in pending]
        errors = [None] * len(pending)
        for r in range(self.rounds):
            order = range(len(pending)) if r % 2 == 0 else reversed(range(len(pending)))
            for i in order:
                if errors[i] is not None:
                    continue
                fn, _, _, context = pending[i]
                try:
                    with context():
                        t = self.timer.samples(fn, reps, budget)
                except Exception as e:  # reported in the kernel's row; the others go on
                    errors[i] = e
                    continue
                times[i] += t
                medians[i].append(statistics.median(t))
        for (_, done, failed, _), t, m, e in zip(pending, times, medians, errors):
            if e is not None:
                failed(e)
            else:
                done(ms=statistics.median(t), reps=len(t), ms_rounds=m)


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
    # FLOPs of each phase by shared/anchors.md: the backward 2.5x the forward, both together 3.5x.
    phase_flops = {"fwd": shape.flops(), "bwd": 2.5 * shape.flops(), "bwd-det": 2.5 * shape.flops(),
                   "fwd+bwd": 3.5 * shape.flops()}

    def row(kind, name, phase="fwd", **kw):
        r = dict(base, kind=kind, name=name, phase=phase, flops=phase_flops[phase],
                 backend=backend if kind == "rung" else "torch",
                 ms=None, tflops=None, rel_err=None, max_abs=None, lse_rel_err=None, bad=None,
                 passed=None, reps=None, error=None, skip=None)
        if kw.get("ms") is not None:
            kw["tflops"] = phase_flops[phase] / (kw["ms"] * 1e-3) / 1e12
        if args.sustained > 0 and dev == "cuda":
            r["sustained_s"] = args.sustained
        if args.rounds > 1 and kw.get("ms") is not None:
            r["rounds"] = args.rounds
        r.update(kw)
        emit(r)

    backend = "cuda" if dev == "cuda" else "cpu"
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    q = torch.randn(shape.batch, shape.heads, shape.seq_q, shape.head_dim, device=dev,
                    dtype=tdtype, generator=gen)
    k = torch.randn(shape.batch, shape.kv_heads, shape.seq_k, shape.head_dim, device=dev,
                    dtype=tdtype, generator=gen)
    v = torch.randn(k.shape, device=dev, dtype=tdtype, generator=gen)
    dout = torch.randn(q.shape, device=dev, dtype=tdtype, generator=gen)  # the backward's dO
    try:
        o_ref, lse_ref = reference(shape, q, k, v)
    except Exception as e:  # without a reference nothing can be checked; say so and move on
        row("reference", "fp64", error=short(e))
        return
    timer = Rounds(Timer(dev, args.warmup, args.reps, args.budget_s, args.sustained, args.flush),
                   args.rounds)

    def failed(kind, name, phase="fwd"):  # the row of a timing that raised at Rounds.settle
        return lambda e: row(kind, name, phase=phase, error=short(e),
                             passed=False if kind == "rung" else None)
    stream = torch.cuda.current_stream().cuda_stream if dev == "cuda" else None
    call = ladder.forward if dev == "cuda" else ladder.forward_host
    call_backward = ladder.backward if dev == "cuda" else ladder.backward_host

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
            # Bound now (not a closure over the loop's names): with --rounds the call is timed after
            # the loop has moved on.
            fn = partial(call, rung, shape.c(), dtype, q, k, v, o, lse, ws, stream)
            fn()
            if dev == "cuda":
                torch.cuda.synchronize()  # a fault in the kernel surfaces here, not in the timing
            eo, el = error_stats(o, o_ref), error_stats(lse, lse_ref)
            passed = eo["bad"] == 0 and el["bad"] == 0 and eo["rel_err"] <= TOLERANCE[dtype] \
                and el["rel_err"] <= TOLERANCE[dtype]
            timer.time(fn, partial(row, "rung", name,
                                   rel_err=eo["rel_err"], max_abs=eo["max_abs"], lse_rel_err=el["rel_err"],
                                   bad=eo["bad"] + el["bad"], passed=passed, workspace_bytes=ws_bytes),
                       failed("rung", name))
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
            row("sdpa", name, skip=SDPA_CAUSAL_SKIP)
            continue
        errors = []
        for how, kk, vv, kw in sdpa_attempts(shape, k, v):
            fn = partial(F.scaled_dot_product_attention, q, kk, vv, is_causal=shape.causal,
                         scale=shape.scale, **kw)
            try:
                with sdpa_kernel(peer), warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        out = fn()
                    except Exception as e:
                        raise refusal(e, caught) from None
                    if dev == "cuda":
                        torch.cuda.synchronize()
                    eo = error_stats(out, o_ref)
                    del out
                    timer.time(fn, partial(row, "sdpa", name, rel_err=eo["rel_err"], max_abs=eo["max_abs"],
                                           bad=eo["bad"], gqa=how or None,
                                           passed=eo["bad"] == 0 and eo["rel_err"] <= TOLERANCE[dtype]),
                               failed("sdpa", name), partial(sdpa_kernel, peer))
                break
            except Exception as e:
                errors.append((f"{how}: " if how else "") + short(e))
                if dev == "cuda":
                    torch.cuda.empty_cache()
        else:
            row("sdpa", name, error=" | ".join(errors))

    if args.backward:
        del o_ref, lse_ref
        run_backward_problem(args, ladder, shape, dtype, q, k, v, dout, row, failed, timer, stream,
                             call, call_backward, backend)
    timer.settle()  # with --rounds R: every timing of this cell, in rounds of alternating order


SDPA_CAUSAL_SKIP = ("SDPA's is_causal is top-left aligned when Nq != Nk; the ladder's contract is "
                    "bottom-right, so only Nq == Nk compares")


def sdpa_attempts(shape: Shape, k, v) -> list[tuple]:
    """(how, k, v, extra SDPA arguments) to try in turn. Grouped-query attention: PyTorch 2.11's
    SDPA takes enable_gqa=True (flash and math run it, and autograd then returns dk, dv with Hkv
    heads, already summed over each group); a backend that refuses it gets k and v repeated to H
    heads by repeat_interleave, made here, outside any timed region, so that what is timed is the
    backend's own work (for the backward, the gradients of the repeated k, v are summed back over
    each group afterwards, also outside the timing: see sum_groups)."""
    if shape.kv_heads == shape.heads:
        return [("", k, v, {})]
    g = shape.heads // shape.kv_heads
    return [("enable_gqa", k, v, {"enable_gqa": True}),
            ("repeat_interleave", k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1), {})]


def sum_groups(shape: Shape, grad):
    """[B, H, Nk, d] gradients of repeat_interleave'd k or v -> [B, Hkv, Nk, d]: each key/value
    head's is the sum over the H/Hkv query heads that read it (repeat_interleave puts them side by
    side)."""
    if grad.shape[1] == shape.kv_heads:
        return grad
    g = shape.heads // shape.kv_heads
    return grad.reshape(shape.batch, shape.kv_heads, g, shape.seq_k, shape.head_dim).sum(dim=2)


def refusal(e: BaseException, caught) -> RuntimeError:
    """A backend's refusal with the warnings in which PyTorch says why it refused."""
    why = "; ".join(short(w.message, 200) for w in caught)
    return RuntimeError(short(e, 200) + (f" [{why}]" if why else ""))


def gradient_stats(grads, refs, dtype: str) -> dict:
    """dq, dk, dv against the fp64 reference: each one's relative L2 error, the largest of them as
    rel_err, and passed when none has a bad element and each is within TOLERANCE[dtype]."""
    stats = {n: error_stats(g, r) for n, g, r in zip(("dq", "dk", "dv"), grads, refs)}
    return dict(rel_err=max(e["rel_err"] for e in stats.values()),
                max_abs=max(e["max_abs"] for e in stats.values()),
                bad=sum(e["bad"] for e in stats.values()),
                dq_rel_err=stats["dq"]["rel_err"], dk_rel_err=stats["dk"]["rel_err"],
                dv_rel_err=stats["dv"]["rel_err"],
                passed=all(e["bad"] == 0 and e["rel_err"] <= TOLERANCE[dtype] for e in stats.values()))


def identical_runs(call, outputs, runs: int) -> str | None:
    """Runs `call` `runs` more times after the one that wrote `outputs` and says how many of them
    gave the same bits as that one, as "k/runs" (None when runs is 0)."""
    if runs <= 0:
        return None
    first = [t.clone() for t in outputs]
    same = 0
    for _ in range(runs):
        call()
        torch.cuda.synchronize()
        same += all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(first, outputs))
    return f"{same}/{runs}"


def in_turn(*calls):
    """One call that makes each of calls in turn (a rung's forward then its backward)."""
    def run():
        for c in calls:
            c()
    return run


def sdpa_forward_backward(forward, leaves, dout):
    """One call of SDPA's forward with its backward through autograd (phase fwd+bwd)."""
    return lambda: torch.autograd.grad(forward(), leaves, dout)


def run_backward_problem(args, ladder: Ladder, shape: Shape, dtype: str, q, k, v, dout, row, failed,
                         timer: Rounds, stream, call, call_backward, backend: str) -> None:
    """The backward of every rung that has one and of every SDPA backend, on the same inputs and the
    same dO. Two rows each: phase "bwd" (the backward alone: for a rung fl_backward on the O and lse
    of its own fl_forward run once before; for SDPA torch.autograd.grad(out, (q, k, v), dO,
    retain_graph=True) on one forward's graph, so each timed call is the backward alone) and phase
    "fwd+bwd" (a forward then a backward per call: fl_forward then fl_backward, or SDPA's forward
    with q, k, v requiring grad, then torch.autograd.grad). Timing as for the forward: the L2 flush
    outside the timed region, warm-up, median. Gradients are checked against the fp64 reference of
    reference_backward after one untimed call, the rung's on poisoned (NaN) outputs."""
    dev = args.device
    rungs = [r for r in ladder.rungs(backend, backward=True) if not args.rungs or r in args.rungs]
    if not rungs and not args.peers:
        return
    try:
        grads_ref = reference_backward(shape, q, k, v, dout)
    except Exception as e:  # without a reference no gradient can be checked; say so and move on
        row("reference", "fp64 backward", phase="bwd", error=short(e))
        return

    def bwd_rows(kind, name, error=None, skip=None):
        # A rung that errs has failed; a backend that refuses has only said no (as for the forward).
        for phase in ("bwd", "fwd+bwd"):
            row(kind, name, phase=phase, error=error, skip=skip,
                passed=False if error and kind == "rung" else None)

    # -- the rungs with a backward pass
    for rung in rungs:
        name = f"{rung} ({backend})"
        try:
            ws_b = ladder.backward_workspace_bytes(rung, backend, shape.c(), dtype)
        except FlError as e:  # the rung does not run this backward: its dtype, d, mask, GQA
            bwd_rows("rung", name, skip=short(e))
            continue
        o = lse = dq = dk = dv = ws_f = ws_bw = None
        try:
            ws_fb = ladder.workspace_bytes(rung, backend, shape.c(), dtype)
            need = ws_fb + ws_b + 3 * q.numel() * q.element_size() + 2 * k.numel() * k.element_size() \
                + shape.batch * shape.heads * shape.seq_q * 4
            if need + (512 << 20) > free_bytes(dev):
                bwd_rows("rung", name, skip=f"needs {need / 2**30:.2f} GiB more device memory "
                                            f"(workspaces {(ws_fb + ws_b) / 2**30:.2f} GiB); "
                                            f"{free_bytes(dev) / 2**30:.2f} GiB free")
                continue
            o = torch.empty_like(q)
            lse = torch.empty((shape.batch, shape.heads, shape.seq_q), dtype=torch.float32, device=dev)
            dq = torch.full_like(q, float("nan"))  # poisoned: an unwritten element shows as bad
            dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
            ws_f = torch.empty(ws_fb, dtype=torch.uint8, device=dev) if ws_fb else None
            ws_bw = torch.empty(ws_b, dtype=torch.uint8, device=dev) if ws_b else None
            # Bound now, as the forward's: with --rounds they are timed after the loop has moved on.
            fwd = partial(call, rung, shape.c(), dtype, q, k, v, o, lse, ws_f, stream)
            bwd = partial(call_backward, rung, shape.c(), dtype, q, k, v, o, lse, dout, dq, dk, dv, ws_bw, stream)
            fwd()  # O and lse for the backward: the rung's own
            bwd()
            if dev == "cuda":
                torch.cuda.synchronize()  # a fault in a kernel surfaces here, not in the timing
            stats = gradient_stats((dq, dk, dv), grads_ref, dtype)
            same = identical_runs(bwd, (dq, dk, dv), args.repeat_check) if dev == "cuda" else None
            timer.time(bwd, partial(row, "rung", name, phase="bwd", workspace_bytes=ws_b,
                                    identical_runs=same, **stats), failed("rung", name, "bwd"))
            timer.time(in_turn(fwd, bwd), partial(row, "rung", name, phase="fwd+bwd",
                                                  workspace_bytes=ws_fb + ws_b, **stats),
                       failed("rung", name, "fwd+bwd"))
            if dev == "cuda" and ladder.has_deterministic_backward(rung, backend):
                # The deterministic mode on the same O and lse: checked, repeated, timed.
                bwd_det = partial(ladder.backward_deterministic,
                                  rung, shape.c(), dtype, q, k, v, o, lse, dout, dq, dk, dv, ws_bw, stream)
                for g in (dq, dk, dv):
                    g.fill_(float("nan"))
                bwd_det()
                torch.cuda.synchronize()
                stats = gradient_stats((dq, dk, dv), grads_ref, dtype)
                same = identical_runs(bwd_det, (dq, dk, dv), args.repeat_check)
                timer.time(bwd_det, partial(row, "rung", name, phase="bwd-det", workspace_bytes=ws_b,
                                            identical_runs=same, **stats), failed("rung", name, "bwd-det"))
        except Exception as e:
            bwd_rows("rung", name, error=short(e))
        finally:
            o = lse = dq = dk = dv = ws_f = ws_bw = None
            if dev == "cuda":
                torch.cuda.empty_cache()

    # -- PyTorch's SDPA backends through autograd
    for peer in args.peers:
        name = f"sdpa_{peer}"
        if shape.causal and shape.seq_q != shape.seq_k:
            bwd_rows("sdpa", name, skip=SDPA_CAUSAL_SKIP)
            continue
        errors = []
        for how, kk, vv, kw in sdpa_attempts(shape, k, v):
            # Leaves that require grad, sharing storage with the inputs (no copies).
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, kk, vv))
            fwd = partial(F.scaled_dot_product_attention, qg, kg, vg, is_causal=shape.causal,
                          scale=shape.scale, **kw)
            out = None
            try:
                with sdpa_kernel(peer), warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        out = fwd()
                        grads = torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
                    except Exception as e:
                        raise refusal(e, caught) from None
                    if dev == "cuda":
                        torch.cuda.synchronize()
                    grads = (grads[0], sum_groups(shape, grads[1]), sum_groups(shape, grads[2]))
                    stats = gradient_stats(grads, grads_ref, dtype)
                    del grads
                    # The graph of out is kept by the first timing until it is done (with --rounds,
                    # until the cell's timings are).
                    timer.time(partial(torch.autograd.grad, out, (qg, kg, vg), dout, retain_graph=True),
                               partial(row, "sdpa", name, phase="bwd", gqa=how or None, **stats),
                               failed("sdpa", name, "bwd"), partial(sdpa_kernel, peer))
                    out = None
                    timer.time(sdpa_forward_backward(fwd, (qg, kg, vg), dout),
                               partial(row, "sdpa", name, phase="fwd+bwd", gqa=how or None, **stats),
                               failed("sdpa", name, "fwd+bwd"), partial(sdpa_kernel, peer))
                break
            except Exception as e:
                errors.append((f"{how}: " if how else "") + short(e))
            finally:
                out = grads = None
                qg = kg = vg = None
                if dev == "cuda":
                    torch.cuda.empty_cache()
        else:
            bwd_rows("sdpa", name, error=" | ".join(errors))


# ---- Driver ------------------------------------------------------------------------------------

def metadata(ladder: Ladder, device: str, flush: str | None = None) -> dict:
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "l2_flush": flush if device == "cuda" else None,  # Timer.flush's mode for every timed row
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "library": ladder.build_info,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


# ---- Extra memory against N (--memory-sweep) --------------------------------------------------

MEMORY_SEQS = [1024 << i for i in range(7)]  # 1024, 2048, ..., 65536
MEMORY_DTYPE = "bf16"


def memory_shapes(seqs: list[int]) -> list[Shape]:
    """The sweep's problems: B=1, H=16, d=64, non-causal, Nq = Nk = N."""
    return [Shape(1, 16, 16, n, n, 64, False) for n in seqs]


def is_out_of_memory(e: BaseException) -> bool:
    """PyTorch's own OutOfMemoryError, or a library (cuBLAS) that could not get its workspace."""
    m = str(e)
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in m.lower() \
        or "ALLOC_FAILED" in m or "FL_ERR_OUT_OF_MEMORY" in m


def tensor_bytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


class CudaMemory:
    """The device-memory statistics the sweep reads (torch.cuda's), in one place: a test can hand
    run_memory_sweep another object with the same methods to run its logic without a GPU."""
    device = "cuda"

    def total(self) -> int:
        return torch.cuda.get_device_properties(0).total_memory

    def stream(self):
        return torch.cuda.current_stream().cuda_stream

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def fresh(self) -> None:
        """Nothing of an earlier measurement left: every cached block back to the driver."""
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def allocated(self) -> int:
        return torch.cuda.memory_allocated()

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated()

    def driver_free_and_reserved(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()


def run_memory_sweep(args, ladder: Ladder, meta: dict, emit, mem=None) -> None:
    """Peak extra device memory of one forward+backward against N (memory_shapes), bf16, for every
    rung with a backward pass that runs the problem and for standard attention (SDPA's math
    backend through autograd). One row each (kind "memory", phase "fwd+bwd"):

      rung:     the caller allocates Q, K, V, dO, O, lse, dQ, dK, dV; then, measured from there with
                torch.cuda.reset_peak_memory_stats / max_memory_allocated, the forward's workspace
                (fl_forward_workspace_bytes) for fl_forward, freed, and the backward's
                (fl_backward_workspace_bytes) for fl_backward: the library allocates nothing else
                (capi/flash_ladder.h), so the peak is the larger workspace. untracked_bytes is the
                device memory that went missing outside PyTorch's allocator during the two calls
                (cudaMemGetInfo against PyTorch's reserved bytes): 0 when nothing is allocated
                behind the caller's back.
      standard: torch.cuda.max_memory_allocated() after reset_peak_memory_stats(), minus what was
                allocated before (Q, K, V, dO), minus the bytes of the output and the gradients:
                what the math backend keeps and makes in between (S, P and their gradients, N²
                each).

    Before the sweep each kernel runs once on the smallest problem, so that lazy module loading
    and cuBLAS's workspace are not counted. A problem that does not fit is recorded with status
    "out of memory" and predicted_extra_bytes: the largest N measured scaled by (N/N0)² (or, with
    nothing measured, a lower bound: P alone, B·H·N² values in the input dtype)."""
    mem = mem or CudaMemory()
    dev = mem.device
    backend = "cuda" if dev == "cuda" else "cpu"
    forward = ladder.forward if dev == "cuda" else ladder.forward_host
    backward = ladder.backward if dev == "cuda" else ladder.backward_host
    dtype, tdtype = MEMORY_DTYPE, FL_DTYPES[MEMORY_DTYPE][1]
    shapes = memory_shapes(args.memory_seqs)
    total = mem.total()
    stream = mem.stream()
    rungs = [r for r in ladder.rungs(backend, backward=True) if not args.rungs or r in args.rungs]

    def mrow(shape: Shape, name: str, backend: str, **kw):
        r = dict(meta, **asdict(shape), shape=shape.spec(), dtype=dtype, kind="memory", phase="fwd+bwd",
                 name=name, backend=backend, ms=None, passed=None, error=None, skip=None,
                 status=None, extra_bytes=None, predicted_extra_bytes=None, predicted_from=None,
                 io_bytes=None, total_memory_bytes=total)
        r.update(kw)
        emit(r)

    def inputs(shape: Shape, grad: bool):
        gen = torch.Generator(device=dev).manual_seed(args.seed)
        q = torch.randn(shape.batch, shape.heads, shape.seq_q, shape.head_dim, device=dev, dtype=tdtype,
                        generator=gen)
        k = torch.randn(q.shape, device=dev, dtype=tdtype, generator=gen)
        v = torch.randn(q.shape, device=dev, dtype=tdtype, generator=gen)
        dout = torch.randn(q.shape, device=dev, dtype=tdtype, generator=gen)
        if grad:
            q, k, v = (t.requires_grad_() for t in (q, k, v))
        return q, k, v, dout

    def rung_extra(rung: str, shape: Shape) -> dict:
        c = shape.c()
        ws_f = ladder.workspace_bytes(rung, backend, c, dtype)
        ws_b = ladder.backward_workspace_bytes(rung, backend, c, dtype)
        mem.fresh()
        q, k, v, dout = inputs(shape, grad=False)
        o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
        lse = torch.empty(shape.batch, shape.heads, shape.seq_q, dtype=torch.float32, device=dev)
        mem.synchronize()
        base = mem.allocated()
        mem.reset_peak()
        free0, reserved0 = mem.driver_free_and_reserved()
        wf = torch.empty(ws_f, dtype=torch.uint8, device=dev) if ws_f else None
        forward(rung, c, dtype, q, k, v, o, lse, wf, stream)
        wf = None  # scratch: freed once the forward is queued (the allocator reuses it in stream order)
        wb = torch.empty(ws_b, dtype=torch.uint8, device=dev) if ws_b else None
        backward(rung, c, dtype, q, k, v, o, lse, dout, dq, dk, dv, wb, stream)
        mem.synchronize()
        peak = mem.peak() - base
        free1, reserved1 = mem.driver_free_and_reserved()
        return dict(extra_bytes=peak, forward_workspace_bytes=ws_f, backward_workspace_bytes=ws_b,
                    io_bytes=tensor_bytes(q, k, v, dout, o, lse, dq, dk, dv),
                    untracked_bytes=(free0 - free1) - (reserved1 - reserved0))

    def math_extra(shape: Shape) -> dict:
        mem.fresh()
        q, k, v, dout = inputs(shape, grad=True)
        mem.synchronize()
        base = mem.allocated()  # Q, K, V, dO
        mem.reset_peak()
        with sdpa_kernel("math"):
            out = F.scaled_dot_product_attention(q, k, v, scale=shape.scale)
            grads = torch.autograd.grad(out, (q, k, v), dout)
        mem.synchronize()
        peak = mem.peak()
        io = tensor_bytes(out, *grads)
        return dict(extra_bytes=peak - base - io, io_bytes=tensor_bytes(q, k, v, dout) + io)

    kernels = [(f"{r} ({backend})", backend, lambda s, r=r: rung_extra(r, s)) for r in rungs] + \
        [("sdpa_math", "torch", math_extra)]
    for name, kernel_backend, measure in kernels:
        if kernel_backend != "torch":
            try:
                ladder.backward_workspace_bytes(name.split(" (")[0], backend, shapes[0].c(), dtype)
            except FlError as e:  # the rung does not run this backward (dtype, d)
                for shape in shapes:
                    mrow(shape, name, kernel_backend, status="skipped", skip=short(e))
                continue
        try:  # warm-up on the smallest problem: modules loaded, cuBLAS's workspace made
            measure(shapes[0])
        except Exception as e:
            print(f"  warm-up of {name} failed: {short(e)}", flush=True)
        measured = []  # (N, extra bytes) that ran
        for shape in shapes:
            if args.deadline and time.time() > args.deadline:
                mrow(shape, name, kernel_backend, status="skipped",
                     skip=f"not started: --time-limit {args.time_limit:.0f} s spent")
                continue
            try:
                m = measure(shape)
                measured.append((shape.seq_q, m["extra_bytes"]))
                mrow(shape, name, kernel_backend, status="ok", **m)
            except Exception as e:
                if not is_out_of_memory(e):
                    mrow(shape, name, kernel_backend, status="error", error=short(e))
                    continue
                if measured:
                    n0, b0 = measured[-1]
                    predicted, how = b0 * (shape.seq_q / n0) ** 2, f"N={n0} measured x (N/{n0})^2"
                else:
                    predicted = shape.batch * shape.heads * shape.seq_q * shape.seq_k * FL_DTYPES[dtype][1].itemsize
                    how = "lower bound: P alone, B*H*N^2 values in the input dtype"
                mrow(shape, name, kernel_backend, status="out of memory", error=short(e, 300),
                     predicted_extra_bytes=predicted, predicted_from=how)
            finally:
                mem.fresh()


# ---- Driver ------------------------------------------------------------------------------------

def describe_bytes(b) -> str:
    if b is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.2f} {unit}"
        b /= 1024.0
    return str(b)


def run_worker(args) -> int:
    """One process, every (shape, dtype) given (and the memory sweep, when asked); rows appended to
    args.rows_out as JSON lines as they are measured, so a crash keeps what was done before it."""
    ladder = Ladder(args.lib)
    if args.device == "cuda":
        ok, why = ladder.cuda_available()
        if not ok or not torch.cuda.is_available():
            print(f"compare_torch: no GPU ({why or 'torch.cuda.is_available() is False'}); "
                  "--device cpu compares the CPU twins", file=sys.stderr)
            return 2
    meta = metadata(ladder, args.device, None if args.sustained > 0 else args.flush)  # --sustained: no flush
    with open(args.rows_out, "a") as out:
        def emit(r):
            out.write(json.dumps(r) + "\n")
            out.flush()
            if r["kind"] == "memory":
                status = r.get("status") or "?"
                if status == "ok":
                    status = f"extra {describe_bytes(r['extra_bytes'])}"
                elif status == "out of memory":
                    status += f" (predicted {describe_bytes(r['predicted_extra_bytes'])})"
                else:
                    status += f": {r.get('skip') or r.get('error')}"
                print(f"  {r['shape']:>22} {r['dtype']} {'memory ' + r['name']:<40} {status}", flush=True)
                return
            phase = r.get("phase", "fwd")
            if r["ms"] is not None:
                status = (f"{r['ms']:9.3f} ms {r['tflops']:7.2f} TFLOP/s rel_err {r['rel_err']:.1e}"
                          + ("" if r["passed"] else "  FAIL"))
            elif r["skip"]:
                status = f"skipped: {r['skip']}"
            else:
                status = f"ERROR: {r['error']}"
            print(f"  {r['shape']:>22} {r['dtype']} {phase:>7} {r['name']:<32} {status}", flush=True)
        if args.memory_sweep:
            run_memory_sweep(args, ladder, meta, emit)
        for dtype in args.dtype:
            for shape in args.shapes_for[dtype]:
                if args.deadline and time.time() > args.deadline:
                    emit(dict(meta, **asdict(shape), shape=shape.spec(), dtype=dtype, kind="time",
                              name="time", ms=None, passed=None, error=None,
                              skip=f"not started: --time-limit {args.time_limit:.0f} s spent"))
                    continue
                run_problem(args, ladder, shape, dtype, meta, emit)
    return 0


def worker_command(args, shape: Shape | None, dtype: str, rows_out: str) -> list[str]:
    """The command of a worker for one (shape, dtype), or for the memory sweep alone (shape None)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--lib", args.lib,
           "--device", args.device, "--dtype", dtype,
           "--reps", str(args.reps), "--warmup", str(args.warmup), "--budget-s", str(args.budget_s),
           "--sustained", str(args.sustained), "--flush", args.flush, "--rounds", str(args.rounds),
           "--seed", str(args.seed), "--peers", ",".join(args.peers), "--repeat-check", str(args.repeat_check),
           "--rows-out", rows_out]
    if shape is None:
        cmd += ["--memory-sweep", "only", "--memory-seqs", ",".join(str(n) for n in args.memory_seqs)]
    else:
        cmd += ["--shapes", shape.spec()]
    if args.rungs:
        cmd += ["--rungs", ",".join(args.rungs)]
    if not args.backward:
        cmd += ["--no-backward"]
    return cmd


def print_table(rows: list[dict]) -> None:
    peers = SDPA_BACKENDS
    fwd = [r for r in rows if r.get("phase", "fwd") == "fwd" and r["kind"] != "memory"]
    print("\nForward: each kernel's time as a ratio to each SDPA backend in this run (ours / theirs: "
          "2.0x is twice as slow; - where that backend did not run)")
    head = f"{'shape':>22} {'dtype':5} {'kernel':<30} {'ms':>9} {'TFLOP/s':>8} {'rel_err':>8} " + \
        " ".join(f"{'vs ' + p:>12}" for p in peers)
    print(head)
    print("-" * len(head))
    groups: dict[tuple, list[dict]] = {}
    for r in fwd:
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

    bwd = [r for r in rows if r.get("phase") in ("bwd", "fwd+bwd") and r["kind"] in ("rung", "sdpa")]
    if bwd:
        print("\nBackward: 'bwd' the backward alone, 'fwd+bwd' a forward and a backward; TFLOP/s by "
              "2.5x and 3.5x the forward's FLOPs; rel_err the largest of dQ's, dK's and dV's; the "
              "backward's time as a ratio to FlashAttention-2's (SDPA flash) and cuDNN's")
        head = (f"{'shape':>22} {'dtype':5} {'kernel':<30} {'bwd ms':>9} {'bwd TF/s':>9} "
                f"{'fwd+bwd ms':>10} {'f+b TF/s':>9} {'rel_err':>8} {'bwd vs flash':>13} {'bwd vs cudnn':>13}")
        print(head)
        print("-" * len(head))
        bgroups: dict[tuple, dict] = {}
        for r in bwd:
            bgroups.setdefault((r["shape"], r["dtype"]), {}).setdefault(r["name"], {})[r["phase"]] = r
        for (spec, dtype), kernels in bgroups.items():
            peer_bwd = {n[len("sdpa_"):]: ph["bwd"]["ms"] for n, ph in kernels.items()
                        if n.startswith("sdpa_") and "bwd" in ph and ph["bwd"]["ms"] is not None}
            for name, ph in kernels.items():
                b, fb = ph.get("bwd"), ph.get("fwd+bwd")
                if (b is None or b["ms"] is None) and (fb is None or fb["ms"] is None):
                    r = b or fb
                    why = f"skipped: {r['skip']}" if r["skip"] else f"ERROR: {r['error']}"
                    notes.append(short(f"{spec} {dtype} {name} backward: {why}", 240))
                    continue
                cellf = lambda x, f: f % x if x is not None else "-"  # noqa: E731
                ratio = lambda p: ("%.2fx" % (b["ms"] / peer_bwd[p]))  \
                    if b and b["ms"] is not None and p in peer_bwd else "-"  # noqa: E731
                passed = all(x["passed"] is not False for x in (b, fb) if x is not None)
                err = next((x["rel_err"] for x in (b, fb) if x and x.get("rel_err") is not None), None)
                print(f"{spec:>22} {dtype:5} {name:<30} {cellf(b and b['ms'], '%.3f'):>9} "
                      f"{cellf(b and b['tflops'], '%.3g'):>9} {cellf(fb and fb['ms'], '%.3f'):>10} "
                      f"{cellf(fb and fb['tflops'], '%.3g'):>9} {cellf(err, '%.1e'):>8} "
                      f"{ratio('flash'):>13} {ratio('cudnn'):>13}" + ("" if passed else "  FAIL"))

    mem = [r for r in rows if r["kind"] == "memory"]
    if mem:
        print("\nExtra device memory of one forward+backward against N (B=1, H=16, d=64, bf16; "
              "beyond inputs, outputs and gradients)")
        names = list(dict.fromkeys(r["name"] for r in mem))
        print(f"{'N':>7} " + " ".join(f"{n:>34}" for n in names))
        for n in sorted({r["seq_q"] for r in mem}):
            cells = []
            for name in names:
                r = next((r for r in mem if r["name"] == name and r["seq_q"] == n), None)
                if r is None:
                    cells.append("-")
                elif r["status"] == "ok":
                    cells.append(describe_bytes(r["extra_bytes"]))
                elif r["status"] == "out of memory":
                    cells.append("out of memory (~" + describe_bytes(r["predicted_extra_bytes"]) + ")")
                else:
                    cells.append(r["status"] or "?")
            print(f"{n:>7} " + " ".join(f"{c:>34}" for c in cells))
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
    ap.add_argument("--rungs", help="comma-separated rungs: full names (06_tensor_core_mma/v9_one_sync), a rung's "
                    "name or number for all its versions (06_tensor_core_mma, 06); default: every rung in the library")
    ap.add_argument("--peers", default=",".join(SDPA_BACKENDS), help="SDPA backends to time")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per measurement (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=2.0,
                    help="stop timing a kernel after this many seconds (at least 3 calls)")
    ap.add_argument("--flush", choices=FLUSH_MODES, default="ahead",
                    help="what runs before each timed call: ahead (read a 256 MiB buffer, then keep the GPU "
                         "busy for about a millisecond so the host has queued the call; the default), clean "
                         "(the read alone) or dirty (write the buffer, as runs before 2026-11-24 did); see "
                         "Timer.flush")
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S",
                    help="time under sustained load: S seconds of back-to-back calls, then five timed "
                         "stretches of S/5 seconds (no L2 flush); 0 (default): short bursts as above")
    ap.add_argument("--rounds", type=int, default=1, metavar="R",
                    help="time each cell's kernels in R rounds, the order reversed every other round, "
                         "each round --warmup calls then ceil(reps/R) timed ones (at least 3), a kernel's "
                         "time the median of all its timed calls (rows carry rounds and ms_rounds); 1 "
                         "(default): each timing taken once, in order (the forwards, rungs then SDPA "
                         "backends, then the backward phases the same way); an even R gives each kernel "
                         "the same mean place in the order (see Rounds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat-check", type=int, default=10, metavar="R",
                    help="after a rung's backward, run it R more times and record in identical_runs how many "
                         "gave the same dq, dk, dv bits (0: skip); rungs with a deterministic mode also get a "
                         "phase 'bwd-det' row (fl_backward_ex, FL_BACKWARD_DETERMINISTIC)")
    ap.add_argument("--json", help="write every row to this file (a JSON list)")
    ap.add_argument("--no-backward", dest="backward", action="store_false",
                    help="forward only: leave out the backward (bwd) and forward+backward (fwd+bwd) "
                         "rows of the rungs that have a backward pass and of the SDPA backends")
    ap.add_argument("--memory-sweep", nargs="?", const="also", choices=["also", "only"],
                    help="also (or, with 'only', instead of the comparison) measure the peak extra "
                         "device memory of one forward+backward against N: every rung with a backward "
                         "pass and SDPA's math backend (standard attention), B=1 H=16 d=64 bf16, "
                         "rows of kind 'memory' in --json (bench/plot.py --memory draws them); GPU only")
    ap.add_argument("--memory-seqs", default=",".join(str(n) for n in MEMORY_SEQS),
                    help="the N of --memory-sweep, comma-separated (default 1024,2048,...,65536)")
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
    if args.rounds < 1:
        ap.error(f"--rounds: at least 1, not {args.rounds}")
    if args.rounds > 1 and args.sustained > 0:
        ap.error("--rounds times short bursts in alternating order; --sustained times long stretches "
                 "one kernel at a time: choose one")
    try:
        args.memory_seqs = [int(n) for n in args.memory_seqs.split(",") if n.strip()]
    except ValueError:
        ap.error(f"--memory-seqs: expected comma-separated integers, got '{args.memory_seqs}'")
    if not args.memory_seqs or min(args.memory_seqs) < 1:
        ap.error("--memory-seqs: give at least one N, each at least 1")
    args.memory_seqs = sorted(set(args.memory_seqs))
    if args.memory_sweep and args.device != "cuda":
        ap.error("--memory-sweep measures device memory with torch.cuda's statistics: it needs --device cuda")
    if args.memory_sweep == "only" and args.shapes and not args.worker:
        ap.error("--memory-sweep only runs the sweep alone: --shapes would be ignored")
    args.lib = find_library(args.lib)
    args.shapes_for = {d: [] if args.memory_sweep == "only" else
                       args.shapes or default_shapes(d, args.quick, args.device) for d in args.dtype}

    # Only the top process keeps the clock: a worker runs the one shape it is given.
    args.deadline = time.time() + args.time_limit if args.time_limit and not args.worker else 0
    if args.worker:
        return run_worker(args)

    ladder = Ladder(args.lib)
    if args.rungs:  # as ladder takes them: full names, or a rung's name or number for all its versions
        known = sorted(set(ladder.rungs("cpu") + ladder.rungs("cuda")))
        wanted = []
        for r in args.rungs:
            # ladder's rule (bench_common.hpp, rung_matches): r, then the end or '_' or '/'
            hits = [k for k in known if k.startswith(r) and (len(k) == len(r) or k[len(r)] in "_/")]
            if not hits:
                print(f"compare_torch: --rungs: no rung matches '{r}'; give a full name "
                      f"(e.g. 06_tensor_core_mma/v9_one_sync), a rung's name (06_tensor_core_mma) "
                      f"or its number (06). This library has: {', '.join(known)}", file=sys.stderr)
                return 2
            wanted += [h for h in hits if h not in wanted]
        args.rungs = wanted
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

    def note(shape: Shape | None, dtype: str, kind: str, **kw) -> None:
        # shape None: the memory sweep's worker
        r = dict(asdict(shape) if shape else {}, shape=shape.spec() if shape else "memory sweep",
                 dtype=dtype, kind=kind, name=kind, ms=None, skip=None, error=None, passed=None)
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
        # The memory sweep first: it is short, and a run cut short by --time-limit still has it.
        jobs = ([(None, MEMORY_DTYPE)] if args.memory_sweep else []) + \
            [(s, d) for d in args.dtype for s in args.shapes_for[d]]
        if args.in_process:
            args.rows_out = rows_out
            failures += run_worker(args) != 0
        else:
            for shape, dtype in jobs:
                what = f"{shape.spec()} {dtype}" if shape else "memory sweep"
                left = args.time_limit - (time.perf_counter() - started) if args.time_limit else None
                if left is not None and left < 5:
                    note(shape, dtype, "time", skip=f"not started: --time-limit {args.time_limit:.0f} s spent")
                    continue
                timeout = min(args.worker_timeout, left) if left is not None else args.worker_timeout
                t0 = time.perf_counter()
                print(f"[{what}]", flush=True)
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
    # A rung that errs or computes the wrong thing fails the run; a backend that refuses does not,
    # nor does running out of memory in the memory sweep (standard attention is meant to).
    bad = [r for r in rows if (r["kind"] in ("rung", "reference", "worker")
                               and (r.get("error") or r.get("passed") is False))
           or (r["kind"] == "memory" and r.get("backend") != "torch" and r.get("status") == "error")]
    if bad:
        print(f"\n{len(bad)} rung measurement(s) failed or were wrong:")
        for r in bad:
            print(f"  {r['shape']} {r['dtype']} {r.get('phase', '')} {r['name']}: "
                  + (r.get("error") or f"rel_err {r['rel_err']:.2e}, {r['bad']} bad elements"))
    return 1 if bad or failures else 0


if __name__ == "__main__":
    sys.exit(main())
