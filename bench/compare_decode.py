#!/usr/bin/env python3
"""Rung 10 (decoding) against the GPU's own ceilings and PyTorch's SDPA, in one run on one GPU.

Decoding is memory-bound: a few new query rows read the whole KV cache once. So every kernel here
is measured in GB/s of the same numerator, kv_bytes = 2·B·Hkv·Nk·d·(bytes per element) (K and V
read once per KV head, whatever a kernel really reads), and set against what this GPU can read:

  1. Ceilings: fl_stream_read over a 2 GiB buffer (read GB/s: the bar a decoding kernel aims at)
     and a 1 GiB device-to-device copy (counting read + write bytes). Rows of kind "ceiling".
  2. For each cell of the grid (B, H/Hkv, Nq, Nk, d; every sequence Nk keys long, a contiguous
     cache [B, Hkv, Nk, d]), rows of kind "decode", phase "fwd":
       * every version of rung 10 (fl_decode_version_name) on NaN-poisoned O and lse, with the
         splits fl_decode_choose_splits gives for this GPU's SM count (recorded in "splits"),
         checked against an fp64 reference, then timed;
       * the same with a paged cache (--page-size keys a page, the pages of the pool in a random
         order): checked and compared bit for bit with the contiguous run at its split count
         ("paged_same_bits"), then checked and timed at the split count the rule gives a paged
         cache (recorded in "splits"; it may be larger: two blocks an SM);
         a version without a paged path refuses, and the refusal is recorded;
       * rung 06's fastest forward kernel (06_tensor_core_mma/v9_one_sync) through fl_forward: what
         a prefill kernel does with one query row;
       * PyTorch's SDPA backends (--peers) on the same q, k, v: GQA through enable_gqa=True, or k
         and v repeated to H heads where a backend refuses that (and they fit); causal through
         torch.nn.attention.bias.causal_lower_right (bottom-right, as the ladder's contract).
         A refusal is a row with ms null and the reason.
     Each row: ms (median; before every call a 256 MiB buffer read and a ~1 ms spin), GBps =
     kv_bytes / time, frac_stream_read = GBps / the stream-read ceiling of this run,
     frac_same_size_read = GBps / fl_stream_read's GB/s over as many bytes as K and V (up to 2 GiB,
     timed for the cell: what one call of that size can reach, its fixed cost included),
     ratio_to_best_sdpa = the faster of SDPA flash and cuDNN's time / this time (above 1: faster
     than both).

The check: the fp64 reference is computed for sequences 0 and B−1 and, in each, the query heads of
KV heads 0 and Hkv−1 (every Nq row of them): rel_err is the relative L2 error of O there, lse_err
the largest absolute error of the log-sum-exp there, and bad counts NaN anywhere in O and lse (an
element no kernel wrote). A version passes at rel_err <= 2e-2 (bf16) or 5e-3 (fp16), no bad
element, and lse within the same relative error; a paged run must also give the contiguous run's
bits when its pages divide the split pass's key block (64 keys), where both cut the same pieces.

    python3 bench/compare_decode.py --quick
    python3 bench/compare_decode.py --json decode.json --time-limit 300
    python3 bench/compare_decode.py --shapes 16x32/8x1x32768x128 4x32/8x4x5000x128c:p16
    python3 bench/plot.py --decode decode.json decode.png

Shapes are B x H[/Hkv] x Nq x Nk x d, a trailing c for causal (the Nq new rows are the last of the
sequence), and :pPAGE for that shape's page size (p0: no paged run). The exit status is 1 when a
kernel of the ladder failed its check or erred, 2 when there is no GPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Imported by load_torch() once the arguments are read, so that --help runs without PyTorch.
torch = F = ct = None

GRID = {"B": (1, 16, 64), "Nk": (4096, 32768, 131072), "H/Hkv": ((32, 8), (32, 32)), "Nq": (1, 4), "d": 128}
QUICK = ["2x32/8x4x1000x128", "3x32x1x4099x128"]  # ragged lengths, GQA and Nq = 4, MHA and Nq = 1
PEERS = ["flash", "cudnn", "efficient", "math"]
FORWARD_RUNG = "06_tensor_core_mma/v9_one_sync"  # rung 06's fastest forward, the prefill kernel
BLOCK_KEYS = 64  # kBlockKeys in steps/10_decoding/decoding.hpp: pieces start on multiples of it
READ_BYTES, COPY_BYTES = 2 << 30, 1 << 30  # the ceilings' buffers
MARGIN = 1 << 30  # device memory left free beside a cell's tensors (SDPA's and the flush's)
BUDGET_S = 2.0  # a kernel's timing stops after this many seconds (never below 3 calls)


def load_torch() -> None:
    global torch, F, ct
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:  # said plainly, as compare_torch.py says it
        sys.exit("compare_decode.py needs PyTorch (import torch failed); run it where PyTorch is installed")
    import compare_torch as ct  # the ctypes binding, the timer, error statistics, metadata


# ---- Cells -------------------------------------------------------------------------------------

@dataclass
class Cell:
    B: int
    H: int
    Hkv: int
    Nq: int
    Nk: int
    d: int
    causal: bool = False
    page_size: int | None = None  # None: --page-size

    def spec(self) -> str:
        h = f"{self.H}/{self.Hkv}" if self.Hkv != self.H else f"{self.H}"
        return f"{self.B}x{h}x{self.Nq}x{self.Nk}x{self.d}" + ("c" if self.causal else "")

    def decode_shape(self, page_size: int = 0):
        """fl_decode_shape of this cell: a contiguous cache of exactly Nk slots, or pages of
        page_size keys, ⌈Nk / page_size⌉ for each sequence, in a pool of B times that many."""
        pages = -(-self.Nk // page_size) if page_size else 0
        capacity = pages * page_size if page_size else self.Nk
        return ct.FlDecodeShape(self.B, self.H, self.Hkv, self.Nq, self.d, capacity, page_size,
                                self.B * pages, pages, int(self.causal), 0.0)

    def kv_bytes(self, elem: int) -> int:
        return 2 * self.B * self.Hkv * self.Nk * self.d * elem


CELL_RE = re.compile(r"^(\d+)x(\d+)(?:/(\d+))?x(\d+)x(\d+)x(\d+)(c?)(?::p(\d+))?$")


def parse_cell(spec: str) -> Cell:
    m = CELL_RE.match(spec.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"bad shape '{spec}': write B x H[/Hkv] x Nq x Nk x d, then c for "
                                         "causal and :pPAGE for a page size (16x32/8x1x32768x128c:p64)")
    b, h, hkv, nq, nk, d, c, page = m.groups()
    cell = Cell(int(b), int(h), int(hkv or h), int(nq), int(nk), int(d), c == "c",
                int(page) if page is not None else None)
    if min(cell.B, cell.H, cell.Hkv, cell.Nq, cell.Nk, cell.d) < 1 or cell.H % cell.Hkv:
        raise argparse.ArgumentTypeError(f"bad shape '{spec}': sizes must be >= 1 and H a multiple of Hkv")
    if cell.page_size and cell.page_size % 16:
        raise argparse.ArgumentTypeError(f"bad shape '{spec}': a page holds a multiple of 16 keys")
    return cell


def default_cells() -> list[Cell]:
    return [Cell(b, h, hkv, nq, nk, GRID["d"]) for b in GRID["B"] for nk in GRID["Nk"]
            for h, hkv in GRID["H/Hkv"] for nq in GRID["Nq"]]


# ---- Reference and checks ----------------------------------------------------------------------

class Checked:
    """The fp64 reference on a slice: sequences 0 and B−1, and in each the query heads of KV heads 0
    and Hkv−1 (every Nq row). The whole problem's reference would read the cache in float64, 4×
    its bytes; these rows still catch a wrong sequence, head or group offset at either end."""

    def __init__(self, cell: Cell, q, k, v):
        g = cell.H // cell.Hkv
        self.batches = sorted({0, cell.B - 1})
        kv_heads = sorted({0, cell.Hkv - 1})
        self.heads = [kh * g + j for kh in kv_heads for j in range(g)]
        self.what = (f"sequences {self.batches} x query heads {self.heads} (of KV heads {kv_heads}), "
                     f"all {cell.Nq} rows")
        scale = 1.0 / math.sqrt(cell.d)
        # Row i sees key j when j <= i + Nk − Nq (bottom-right); a row that sees none: O = 0, lse = −inf.
        i = torch.arange(cell.Nq, device=q.device).repeat(g)[:, None]  # [g·Nq, 1], the group's rows
        sees = torch.arange(cell.Nk, device=q.device)[None, :] <= i + (cell.Nk - cell.Nq)
        o_ref, lse_ref = [], []
        for b in self.batches:
            ob, lb = [], []
            for kh in kv_heads:
                qq = q[b, kh * g:(kh + 1) * g].double().reshape(g * cell.Nq, cell.d)  # [g·Nq, d]
                kk, vv = k[b, kh].double(), v[b, kh].double()                          # [Nk, d]
                s = qq @ kk.T * scale                                                  # [g·Nq, Nk]
                if cell.causal:
                    s.masked_fill_(~sees, float("-inf"))
                lse = torch.logsumexp(s, dim=-1)                                       # [g·Nq]
                o = torch.exp(s - lse[:, None]) @ vv
                o[torch.isinf(lse)] = 0.0
                ob.append(o.reshape(g, cell.Nq, cell.d))
                lb.append(lse.reshape(g, cell.Nq))
            o_ref.append(torch.cat(ob))
            lse_ref.append(torch.cat(lb))
        self.o, self.lse = torch.stack(o_ref), torch.stack(lse_ref)  # [2, heads, Nq, d], [2, heads, Nq]

    def slice(self, t):
        """The checked rows of an [B, H, Nq, ...] output."""
        return t[self.batches][:, self.heads]

    def __call__(self, o, lse, dtype: str) -> dict:
        """rel_err and max_abs of O, lse_err (max abs), bad (NaN anywhere), passed."""
        eo = ct.error_stats(self.slice(o), self.o)
        r = dict(rel_err=eo["rel_err"], max_abs=eo["max_abs"], bad=int(torch.isnan(o).sum()), lse_err=None)
        ok = eo["bad"] == 0 and eo["rel_err"] <= ct.TOLERANCE[dtype]
        if lse is not None:
            el = ct.error_stats(self.slice(lse), self.lse)
            r.update(lse_err=el["max_abs"], lse_rel_err=el["rel_err"])
            r["bad"] += int(torch.isnan(lse).sum())
            ok = ok and el["bad"] == 0 and el["rel_err"] <= ct.TOLERANCE[dtype]
        r["passed"] = ok and r["bad"] == 0
        return r


def same_bits(a, b) -> bool:
    """Equal bit patterns (not values: -0 and 0 differ here, NaN equals itself)."""
    as_int = {2: torch.int16, 4: torch.int32}
    return torch.equal(a.view(as_int[a.element_size()]), b.view(as_int[b.element_size()]))


def to_pages(x, table, page: int):
    """A contiguous cache x [B, Hkv, Nk, d] as a pool [num_pages, Hkv, page, d]: key j of sequence b
    at row j % page of page table[b, j // page]. Slots past Nk (the last page's tail) hold NaN, so a
    kernel that reads past a sequence's length shows it. One sequence at a time: the pool is the
    only extra copy of the cache."""
    B, Hkv, Nk, d = x.shape
    pool = torch.full((table.numel(), Hkv, page, d), float("nan"), dtype=x.dtype, device=x.device)
    full, tail = divmod(Nk, page)
    for b in range(B):
        if full:
            pool[table[b, :full]] = x[b, :, :full * page].reshape(Hkv, full, page, d).transpose(0, 1)
        if tail:
            pool[table[b, full], :, :tail] = x[b, :, full * page:]
    return pool


# ---- One cell ------------------------------------------------------------------------------------

def run_cell(args, ladder, cell: Cell, dtype: str, versions: list[str], timer, base: dict, emit) -> None:
    """Every kernel on one cell; each row through emit(row)."""
    tdtype, elem = ct.FL_DTYPES[dtype][1], ct.FL_DTYPES[dtype][1].itemsize
    B, H, Hkv, Nq, Nk, d = cell.B, cell.H, cell.Hkv, cell.Nq, cell.Nk, cell.d
    page = args.page_size if cell.page_size is None else cell.page_size
    stream = torch.cuda.current_stream().cuda_stream
    kv_bytes = cell.kv_bytes(elem)

    def row(name, source, **kw):
        r = dict(base, name=name, source=source, page_size=0, capacity=Nk, splits=None, ms=None, reps=None,
                 rel_err=None, lse_err=None, bad=None, passed=None, GBps=None, frac_stream_read=None,
                 frac_same_size_read=None,
                 ratio_to_best_sdpa=None, paged_same_bits=None, gqa=None, error=None, skip=None)
        r.update(kw)
        if r["ms"] is not None:
            r["GBps"] = kv_bytes / (r["ms"] * 1e-3) / 1e9
        emit(r)

    need = 2 * kv_bytes + 3 * B * H * Nq * d * elem
    if need + MARGIN > ct.free_bytes("cuda"):
        row("cell", "cell", skip=f"needs {need / 1e9:.0f} GB of device memory for q, k, v and outputs; "
                                 f"{ct.free_bytes('cuda') / 1e9:.0f} GB free")
        return
    base["same_size_read_GBps"] = same_size_read(ladder, timer, kv_bytes)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    q = torch.randn(B, H, Nq, d, dtype=tdtype, device="cuda", generator=gen)  # [B, H, Nq, d]
    k = torch.randn(B, Hkv, Nk, d, dtype=tdtype, device="cuda", generator=gen)  # [B, Hkv, Nk, d]
    v = torch.randn(k.shape, dtype=tdtype, device="cuda", generator=gen)
    kv_len = torch.full((B,), Nk, dtype=torch.int32, device="cuda")  # [B]: every sequence full
    check = Checked(cell, q, k, v)
    base["checked"] = check.what

    def poisoned():  # o [B, H, Nq, d] and lse [B, H, Nq], NaN until a kernel writes them
        return torch.full_like(q, float("nan")), torch.full((B, H, Nq), float("nan"), device="cuda")

    def measure(name, source, fn, o, lse, checked=None, **kw):
        """One kernel's row: fn run once (a fault in the kernel surfaces at the synchronize, not in
        the timing), its o and lse checked, checked(stats) told (before the timing overwrites them),
        then fn timed; an exception becomes the row's error."""
        try:
            fn()
            torch.cuda.synchronize()
            stats = check(o, lse, dtype)
            if checked:
                checked(stats)
            ms, reps = timer(fn)
        except Exception as e:
            row(name, source, error=ct.short(e), passed=False, **kw)
            return
        row(name, source, ms=ms, reps=reps, **kw, **stats)

    # -- rung 10's versions on the contiguous cache. fl_decode's splits = 0 would choose for a
    # longest sequence of `capacity` keys; every sequence is that long here, but the choice is made
    # (and recorded) explicitly, as a caller that knows its lengths does.
    contiguous = cell.decode_shape()
    splits = ladder.decode_choose_splits(contiguous, Nk, args.sm_count)
    ws_bytes = ladder.decode_workspace_bytes(contiguous, splits)
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda") if ws_bytes else None
    first = {}  # version -> (o, lse) of its contiguous run, for the paged run's bits
    for version in versions:
        o, lse = poisoned()
        fn = lambda: ladder.decode(version, contiguous, dtype, q, k, v, None, kv_len, o, lse,  # noqa: E731
                                   splits, ws, stream)
        measure(version, "decode", fn, o, lse, checked=lambda _: first.update({version: (o.clone(), lse.clone())}),
                splits=splits, workspace_bytes=ws_bytes)
    o = lse = ws = None

    # -- --splits: the same versions with other split counts than the choice, to see what it costs
    # or leaves (rows of kind "decode_splits", which the reports and the summary leave out)
    for n in args.splits:
        if n == splits:
            continue
        n_bytes = ladder.decode_workspace_bytes(contiguous, n)
        ws = torch.empty(n_bytes, dtype=torch.uint8, device="cuda") if n_bytes else None
        for version in versions:
            o, lse = poisoned()
            fn = lambda: ladder.decode(version, contiguous, dtype, q, k, v, None, kv_len, o, lse,  # noqa: E731
                                       n, ws, stream)
            measure(version, "splits", fn, o, lse, kind="decode_splits", splits=n, workspace_bytes=n_bytes)
        o = lse = ws = None

    # -- the same on a paged cache, the pool's pages in a random order
    if page and versions:
        paged = cell.decode_shape(page)
        pool_bytes = kv_bytes * paged.capacity // Nk
        if pool_bytes + MARGIN > ct.free_bytes("cuda"):
            for version in versions:
                row(version, "decode", page_size=page, capacity=paged.capacity,
                    skip=f"the paged pool needs {pool_bytes / 1e9:.0f} GB more device memory; "
                         f"{ct.free_bytes('cuda') / 1e9:.0f} GB free")
        else:
            table = torch.randperm(paged.num_pages, device="cuda", generator=gen).view(B, paged.pages_per_seq)
            k_pool, v_pool = to_pages(k, table, page), to_pages(v, table, page)  # [num_pages, Hkv, page, d]
            table = table.to(torch.int32)                                         # [B, pages_per_seq]
            ws_bytes = ladder.decode_workspace_bytes(paged, splits)
            ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda") if ws_bytes else None
            # The bits are compared at the contiguous run's splits; the time is taken at the split
            # count fl_decode_choose_splits gives a paged cache (it may differ: two blocks an SM).
            p_splits = ladder.decode_choose_splits(paged, Nk, args.sm_count)
            p_bytes = ladder.decode_workspace_bytes(paged, p_splits)
            p_ws = torch.empty(p_bytes, dtype=torch.uint8, device="cuda") if p_bytes else None
            for version in versions:
                o, lse = poisoned()
                fn = lambda: ladder.decode(version, paged, dtype, q, k_pool, v_pool, table,  # noqa: E731
                                           kv_len, o, lse, splits, ws, stream)
                kw = dict(page_size=page, capacity=paged.capacity, splits=p_splits)
                try:
                    fn()
                except ct.FlError as e:  # a version without a paged path says so before any work
                    refused = str(e).startswith("FL_ERR_INVALID")
                    if refused and "paged" not in version:
                        row(version, "decode", skip="refused: " + ct.short(e, 200), **kw)
                    else:
                        row(version, "decode", error=ct.short(e), passed=False, **kw)
                    continue
                try:
                    torch.cuda.synchronize()
                    stats = check(o, lse, dtype)
                    bits = version in first and same_bits(o, first[version][0]) and same_bits(lse, first[version][1])
                    # Pages that divide the key block cut the same pieces as the contiguous cache:
                    # the same bits are then expected. Larger pages start pieces on page boundaries.
                    if BLOCK_KEYS % page == 0 and version in first and not bits:
                        stats["passed"] = False
                    if p_splits != splits:  # checked again at the split count that is timed
                        fn = lambda: ladder.decode(version, paged, dtype, q, k_pool, v_pool, table,  # noqa: E731
                                                   kv_len, o, lse, p_splits, p_ws, stream)
                        o.fill_(float("nan")), lse.fill_(float("nan"))
                        fn()
                        torch.cuda.synchronize()
                        passed, stats = stats["passed"], check(o, lse, dtype)  # the timed run's errors
                        stats["passed"] = passed and stats["passed"]
                    ms, reps = timer(fn)
                    row(version, "decode", ms=ms, reps=reps, paged_same_bits=bits if version in first else None,
                        workspace_bytes=p_bytes, **kw, **stats)
                except Exception as e:
                    row(version, "decode", error=ct.short(e), passed=False, **kw)
            # --splits on the paged cache too, for the versions that have a paged path
            for n in args.splits:
                if n == p_splits:
                    continue
                n_bytes = ladder.decode_workspace_bytes(paged, n)
                ws = torch.empty(n_bytes, dtype=torch.uint8, device="cuda") if n_bytes else None
                for version in [x for x in versions if "paged" in x]:
                    o, lse = poisoned()
                    fn = lambda: ladder.decode(version, paged, dtype, q, k_pool, v_pool, table,  # noqa: E731
                                               kv_len, o, lse, n, ws, stream)
                    measure(version, "splits", fn, o, lse, kind="decode_splits", page_size=page,
                            capacity=paged.capacity, splits=n, workspace_bytes=n_bytes)
            o = lse = ws = p_ws = k_pool = v_pool = table = None
            torch.cuda.empty_cache()

    # -- rung 06's forward kernel on the same problem: the prefill kernel asked to decode
    if FORWARD_RUNG not in ladder.rungs("cuda"):
        row(FORWARD_RUNG, "forward", skip="not in this library")
    else:
        shape = ct.FlShape(B, H, Hkv, Nq, Nk, d, int(cell.causal), 0.0)
        ok, why = ladder.supports(FORWARD_RUNG, "cuda", shape, dtype)
        if not ok:
            row(FORWARD_RUNG, "forward", skip=ct.short(why, 200))
        else:
            try:
                fws_bytes = ladder.workspace_bytes(FORWARD_RUNG, "cuda", shape, dtype)
                fws = torch.empty(fws_bytes, dtype=torch.uint8, device="cuda") if fws_bytes else None
            except Exception as e:
                row(FORWARD_RUNG, "forward", error=ct.short(e), passed=False)
            else:
                o, lse = poisoned()
                fn = lambda: ladder.forward(FORWARD_RUNG, shape, dtype, q, k, v, o, lse, fws, stream)  # noqa: E731
                measure(FORWARD_RUNG, "forward", fn, o, lse, workspace_bytes=fws_bytes)
            o = lse = fws = None

    # -- PyTorch's SDPA backends on the same q, k, v
    sdpa_kw = {"scale": 1.0 / math.sqrt(d)}
    if cell.causal:  # SDPA's is_causal is top-left aligned; the ladder's contract is bottom-right
        from torch.nn.attention.bias import causal_lower_right
        sdpa_kw["attn_mask"] = causal_lower_right(Nq, Nk)
    g = H // Hkv
    for peer in args.peers:
        name, errors = f"sdpa_{peer}", []
        attempts = [("", {})] if g == 1 else [("enable_gqa", {"enable_gqa": True}), ("repeat_interleave", {})]
        for how, extra in attempts:
            kk = vv = out = None
            try:
                if how == "repeat_interleave":  # k and v copied to H heads, outside the timing
                    if kv_bytes * g + MARGIN > ct.free_bytes("cuda"):
                        raise RuntimeError(f"k and v repeated to {H} heads need {kv_bytes * g / 1e9:.0f} GB more")
                    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
                else:
                    kk, vv = k, v
                fn = lambda: F.scaled_dot_product_attention(q, kk, vv, **sdpa_kw, **extra)  # noqa: E731
                with ct.sdpa_kernel(peer), warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        out = fn()
                    except Exception as e:  # the backend refused: PyTorch's warnings say why
                        raise ct.refusal(e, caught) from None
                    torch.cuda.synchronize()
                    stats = check(out, None, dtype)
                    out = None
                    ms, reps = timer(fn)
                row(name, "sdpa", ms=ms, reps=reps, gqa=how or None, **stats)
                break
            except Exception as e:
                errors.append((f"{how}: " if how else "") + ct.short(e, 300))
            finally:
                kk = vv = out = None
                torch.cuda.empty_cache()
        else:
            row(name, "sdpa", error=" | ".join(errors))


# ---- Ceilings ----------------------------------------------------------------------------------

def measure_ceilings(ladder, timer, base: dict, emit) -> float | None:
    """Rows for fl_stream_read and a device-to-device copy; returns the read GB/s (None if it
    failed). Buffers shrink to fit on a GPU with less free memory."""
    stream = torch.cuda.current_stream().cuda_stream
    room = max(16, (ct.free_bytes("cuda") - MARGIN) // 2) // 16 * 16  # two buffers for the copy
    read_gbps = None
    for what, nbytes in (("stream_read", min(READ_BYTES, 2 * room)), ("copy", min(COPY_BYTES, room))):
        r = dict(base, kind="ceiling", name=what, what=what, bytes=None, ms=None, reps=None, GBps=None,
                 error=None)
        try:
            src = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
            if what == "stream_read":
                sink = torch.zeros(1, dtype=torch.float32, device="cuda")
                fn = lambda: ladder.stream_read(src, sink, stream)  # noqa: E731
                moved = nbytes
            else:
                dst = torch.empty_like(src)
                fn = lambda: dst.copy_(src)  # noqa: E731
                moved = 2 * nbytes  # read once and written once
            ms, reps = timer(fn)
            r.update(bytes=moved, ms=ms, reps=reps, GBps=moved / (ms * 1e-3) / 1e9)
            if what == "stream_read":
                read_gbps = r["GBps"]
        except Exception as e:
            r["error"] = ct.short(e)
        finally:
            src = sink = dst = None
            torch.cuda.empty_cache()
        emit(r)
        print(f"  ceiling {what:<12} " + (f"{r['GBps']:8.0f} GB/s ({r['bytes'] / 2**30:.2f} GiB moved, "
                                         f"{r['ms']:.3f} ms)" if r["ms"] is not None else f"ERROR: {r['error']}"),
              flush=True)
    return read_gbps


def same_size_read(ladder, timer, kv_bytes: int) -> float | None:
    """GB/s of fl_stream_read over as many bytes as the cell's K and V (at most the ceiling's 2 GiB):
    what one call that reads that much reaches, its launch, its start and its end included. A
    short call cannot reach the 2 GiB read's rate: on an H100 a read of 128 MiB reaches about 93 %
    of it. None when the buffer does not fit."""
    stream = torch.cuda.current_stream().cuda_stream
    nbytes = min(kv_bytes, READ_BYTES) // 16 * 16
    buf = sink = None
    try:
        buf = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
        sink = torch.zeros(1, dtype=torch.float32, device="cuda")
        ms, _ = timer(lambda: ladder.stream_read(buf, sink, stream))
        return nbytes / (ms * 1e-3) / 1e9
    except Exception as e:  # out of memory, or the read refused: the cell goes on without it
        print(f"    (no streaming read of the cell's size: {ct.short(e)})", flush=True)
        return None
    finally:
        buf = sink = None
        torch.cuda.empty_cache()


# ---- Printing ----------------------------------------------------------------------------------

def finish_cell(rows: list[dict], read_gbps: float | None) -> None:
    """frac_stream_read, frac_same_size_read and ratio_to_best_sdpa, once every row of a cell is in."""
    sdpa = [r["ms"] for r in rows if r["name"] in ("sdpa_flash", "sdpa_cudnn") and r["ms"] and r["passed"]]
    for r in rows:
        if r["ms"] is None:
            continue
        if read_gbps:
            r["frac_stream_read"] = r["GBps"] / read_gbps
        if r.get("same_size_read_GBps"):
            r["frac_same_size_read"] = r["GBps"] / r["same_size_read_GBps"]
        if sdpa:
            r["ratio_to_best_sdpa"] = min(sdpa) / r["ms"]


def print_cell(rows: list[dict]) -> None:
    same = next((r.get("same_size_read_GBps") for r in rows if r.get("same_size_read_GBps")), None)
    if same:
        print(f"    a streaming read of as many bytes as K and V (up to 2 GiB): {same:.0f} GB/s")
    print(f"    {'kernel':<34} {'splits':>6} {'µs':>9} {'GB/s':>7} {'% read':>7} {'% same':>7} {'x SDPA':>7} "
          f"{'rel_err':>8} {'lse_err':>8}")
    for r in rows:
        name = r["name"] + (f" paged {r['page_size']}" if r.get("page_size") else "")
        if r["ms"] is None:
            print(f"    {name:<34} " + (f"skipped: {r['skip']}" if r["skip"] else f"ERROR: {r['error']}"))
            continue
        f = lambda x, fmt: format(x, fmt) if x is not None else "-"  # noqa: E731
        note = "" if r["passed"] is not False else "  FAIL"
        if r.get("paged_same_bits") is not None:
            note += "  same bits" if r["paged_same_bits"] else "  other bits"
        print(f"    {name:<34} {f(r['splits'], 'd'):>6} {r['ms'] * 1e3:9.1f} {r['GBps']:7.0f} "
              f"{f(r['frac_stream_read'] and 100 * r['frac_stream_read'], '.0f'):>7} "
              f"{f(r.get('frac_same_size_read') and 100 * r['frac_same_size_read'], '.0f'):>7} "
              f"{f(r['ratio_to_best_sdpa'], '.2f'):>7} {f(r['rel_err'], '.1e'):>8} {f(r['lse_err'], '.1e'):>8}{note}",
              flush=True)


def print_summary(rows: list[dict]) -> None:
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["kind"] == "decode" and r["name"] != "cell":
            cells.setdefault((r["shape"], r["dtype"]), []).append(r)
    wins, slower, lowest, lowest_same = [], [], None, None
    for (spec, dtype), rs in cells.items():
        ours = [r for r in rs if r["source"] == "decode" and r["ms"] and r["passed"]]
        peers = [r["ms"] for r in rs if r["name"] in ("sdpa_flash", "sdpa_cudnn") and r["ms"] and r["passed"]]
        if not ours:
            continue
        best = min(ours, key=lambda r: r["ms"])
        if peers:
            (wins if best["ms"] <= min(peers) else slower).append(f"{spec} {dtype}")
        if best["Nk"] >= 32768 and best["frac_stream_read"] is not None:
            if lowest is None or best["frac_stream_read"] < lowest[0]:
                lowest = (best["frac_stream_read"], f"{spec} {dtype}, {best['name']}")
            same = best.get("frac_same_size_read")
            if same is not None and (lowest_same is None or same < lowest_same[0]):
                lowest_same = (same, f"{spec} {dtype}, {best['name']}")
    print(f"\nSummary: the best decode version is as fast as or faster than the faster of SDPA flash and "
          f"cuDNN in {len(wins)} of {len(wins) + len(slower)} cells where both ran"
          + (f"; slower in {', '.join(slower)}" if slower else ""))
    if lowest:
        print(f"At Nk >= 32768 the best decode version reaches at least {100 * lowest[0]:.0f}% of the stream-read "
              f"ceiling (lowest: {lowest[1]})")
    if lowest_same:
        print(f"At Nk >= 32768 the best decode version reaches at least {100 * lowest_same[0]:.0f}% of a streaming "
              f"read of as many bytes (lowest: {lowest_same[1]})")


# ---- Driver ------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path to libflash_ladder.so (default: build-hopper/capi/, then build/capi/)")
    ap.add_argument("--shapes", nargs="+", type=parse_cell, metavar="SHAPE",
                    help="B x H[/Hkv] x Nq x Nk x d, then c for causal, :pPAGE for its page size "
                         "(16x32/8x1x32768x128, 4x32/8x4x5000x128c:p16); default: B in 1,16,64 x Nk in "
                         "4096,32768,131072 x H/Hkv in 32/8,32/32 x Nq in 1,4, d 128, non-causal")
    ap.add_argument("--quick", action="store_true", help="two small cells (GQA with Nq = 4, and Nq = 1), a smoke test")
    ap.add_argument("--dtype", default="bf16", help="comma-separated: fp16,bf16 (default bf16)")
    ap.add_argument("--versions", help="comma-separated decode versions (default: every fl_decode_version_name)")
    ap.add_argument("--peers", default="flash,cudnn",
                    help=f"SDPA backends to compare with, comma-separated from {','.join(PEERS)} (default flash,cudnn)")
    ap.add_argument("--page-size", type=int, default=64,
                    help="keys per page of the paged runs, a multiple of 16; 0: no paged runs (default 64)")
    ap.add_argument("--splits", default="",
                    help="comma-separated split counts to time every version at besides the one "
                         "fl_decode_choose_splits picks (rows of kind decode_splits), e.g. 1,2,4,8,16,33,66")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per measurement (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--flush", choices=("ahead", "clean", "dirty"), default="ahead",
                    help="what runs before each timed call (compare_torch.Timer.flush): ahead (read a "
                         "256 MiB buffer, then a spin of about a millisecond; the default), clean (the "
                         "read alone) or dirty (write the buffer, as runs before 2026-11-24 did: the call "
                         "then pays for writing L2's modified lines back)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every row to this file (a JSON list), rewritten after every cell")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="seconds for the whole run (0: none): a cell is not started when less time is left "
                         "than the longest cell so far took; its row says so")
    args = ap.parse_args(argv)
    args.dtype = [x.strip() for x in args.dtype.split(",") if x.strip()]
    for x in args.dtype:
        if x not in ("fp16", "bf16"):
            ap.error(f"--dtype: rung 10 runs fp16 and bf16, not '{x}'")
    try:
        args.splits = [int(x) for x in args.splits.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--splits: comma-separated integers, not '{args.splits}'")
    if any(n < 1 for n in args.splits):
        ap.error("--splits: every split count is 1 or more")
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for p in args.peers:
        if p not in PEERS:
            ap.error(f"--peers: unknown SDPA backend '{p}': allowed are {', '.join(PEERS)}")
    if args.page_size < 0 or args.page_size % 16:
        ap.error(f"--page-size: a multiple of 16 (or 0), not {args.page_size}")
    if args.shapes and args.quick:
        ap.error("--quick and --shapes both name the cells: give one")
    args.cells = args.shapes or ([parse_cell(s) for s in QUICK] if args.quick else default_cells())
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    load_torch()
    args.lib = ct.find_library(args.lib)
    try:
        ladder = ct.Ladder(args.lib)
    except (OSError, ct.FlError) as e:  # not loadable, or of another ABI version
        sys.exit(f"compare_decode: {e}")
    ok, why = ladder.cuda_available()
    if not ok or not torch.cuda.is_available():
        print(f"compare_decode: no GPU ({why or 'torch.cuda.is_available() is False'})", file=sys.stderr)
        return 2
    known = ladder.decode_versions()
    versions = [x.strip() for x in args.versions.split(",") if x.strip()] if args.versions else known
    unknown = [x for x in versions if x not in known]
    if unknown or not versions:
        sys.exit(f"compare_decode: {', '.join(unknown) or 'no decode version'} not in {args.lib} "
                 f"(it has: {', '.join(known) or 'none'})")
    args.sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    meta = dict(ct.metadata(ladder, "cuda", args.flush), sm_count=args.sm_count)
    print(f"compare_decode: {ladder.build_info} from {args.lib}; torch {torch.__version__}, "
          f"{meta['device']} ({args.sm_count} SMs); versions {', '.join(versions)}", flush=True)

    started, rows = time.perf_counter(), []

    def write_json() -> None:  # after every cell, replaced whole: a run stopped from outside leaves valid JSON
        if args.json:
            with open(args.json + ".part", "w") as f:
                json.dump(rows, f, indent=1)
            os.replace(args.json + ".part", args.json)

    timer = ct.Timer("cuda", args.warmup, args.reps, BUDGET_S, flush=args.flush)
    print("Ceilings (median of CUDA-event timings):", flush=True)
    read_gbps = measure_ceilings(ladder, timer, meta, rows.append)
    write_json()

    jobs = [(c, dt) for dt in args.dtype for c in args.cells]
    print("\nPer cell: µs the median time; GB/s the K and V bytes (2·B·Hkv·Nk·d·elem) over it; % read of "
          "the stream-read ceiling; x SDPA the faster of SDPA flash and cuDNN's time over this one's "
          "(above 1: faster than both)", flush=True)
    longest = 0.0
    for n, (cell, dtype) in enumerate(jobs, 1):
        elem = ct.FL_DTYPES[dtype][1].itemsize
        base = dict(meta, kind="decode", phase="fwd", shape=cell.spec(), B=cell.B, H=cell.H, Hkv=cell.Hkv,
                    Nq=cell.Nq, Nk=cell.Nk, d=cell.d, dtype=dtype, causal=cell.causal,
                    kv_bytes=cell.kv_bytes(elem), checked=None)
        left = args.time_limit - (time.perf_counter() - started) if args.time_limit else None
        if left is not None and left < max(longest, 5.0):
            rows.append(dict(base, name="cell", source="cell", ms=None, passed=None, error=None,
                             skip=f"not started: --time-limit {args.time_limit:.0f} s spent"))
            continue
        print(f"\n[{n}/{len(jobs)}] {cell.spec()} {dtype}: kv {cell.kv_bytes(elem) / 1e9:.2f} GB", flush=True)
        t0, cell_rows = time.perf_counter(), []
        try:
            run_cell(args, ladder, cell, dtype, versions, timer, base, cell_rows.append)
            torch.cuda.synchronize()
        except Exception as e:  # the inputs, the reference, or a CUDA context a kernel broke
            cell_rows.append(dict(base, name="cell", source="cell", ms=None, passed=False, skip=None,
                                  error=ct.short(e)))
        finish_cell(cell_rows, read_gbps)
        print_cell(cell_rows)
        rows.extend(cell_rows)
        write_json()
        torch.cuda.empty_cache()
        longest = max(longest, time.perf_counter() - t0)
        print(f"    ({time.perf_counter() - t0:.1f} s)", flush=True)
        try:  # a kernel that faulted leaves the CUDA context unusable: then nothing later can run
            torch.cuda.synchronize()
        except Exception as e:
            print(f"compare_decode: the CUDA context is lost ({ct.short(e, 200)}); stopping", file=sys.stderr)
            break

    late = sum(1 for r in rows if r["kind"] == "decode" and r["name"] == "cell" and "--time-limit" in (r["skip"] or ""))
    if late:
        print(f"\n{late} cell(s) not started: --time-limit {args.time_limit:.0f} s spent")
    if args.json:
        print(f"\nwrote {len(rows)} rows to {args.json}")
    print_summary(rows)
    # A kernel of the ladder that errs or computes the wrong thing fails the run; SDPA refusing does not.
    bad = [r for r in rows if r["kind"] in ("decode", "decode_splits") and r.get("source") in ("decode", "forward", "cell")
           and (r.get("error") or r.get("passed") is False)]
    if bad:
        print(f"\n{len(bad)} measurement(s) failed or were wrong:")
        for r in bad:
            print(f"  {r['shape']} {r['dtype']} {r['name']}" + (f" paged {r['page_size']}" if r.get("page_size") else "")
                  + ": " + (r.get("error") or f"rel_err {r['rel_err']:.2e}, lse_err {r['lse_err']}, {r['bad']} NaN, "
                            f"paged_same_bits {r.get('paged_same_bits')}"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
