#!/usr/bin/env python3
"""Writes measured results into the docs, from the JSON the benchmarks wrote. Standard library only.

    python3 bench/report.py --results DIR          # rewrite the result blocks in docs/ and README.md
    python3 bench/report.py --results DIR --check  # exit 1 if that would change anything

DIR holds any of these (tests/gpu_suite.sh writes all three; docs/results/ keeps the published ones):

    ladder.json   the ladder program (bench/ladder.cpp, --json): one run {"problem", "device",
                  "rows"}, or several under names ({"default": run, "seq4096_heads16": run})
    bench.json    ladder_bench (bench/ladder_bench.cpp): Google Benchmark's JSON; what ran is read
                  from each benchmark's label (rung=... device=... N=...), numbers from its counters
    torch.json    bench/compare_torch.py --json: a list of rows, one per kernel, shape and phase,
                  the ladder's rungs (kind "rung") and PyTorch's SDPA backends (kind "sdpa"), each
                  of phase "fwd", "bwd" (the backward alone) or "fwd+bwd" (rows without a phase,
                  from before the backward was measured, are "fwd"), and with --memory-sweep the
                  extra memory of a forward+backward against N (kind "memory")

What it rewrites: the text between a pair of markers, each alone on its line,

    <!-- results:NN_name:begin -->  ...  <!-- results:NN_name:end -->   in docs/*.md: one rung
    <!-- gpu-table:begin -->        ...  <!-- gpu-table:end -->         in README.md: every rung

and blocks of one kind of result for one rung (and its versions), NN_name__KIND:

    results:NN_name__bwd_torch    the backward (bwd, fwd+bwd) of the rung beside SDPA's backends,
                                  with ratios to FlashAttention-2's and cuDNN's (torch.json)
    results:NN_name__bwd_memory   the extra memory of a forward+backward against N, the rung beside
                                  standard attention (torch.json's memory sweep), and the figure
                                  docs/figures/backward_memory.png once bench/plot.py --memory made it

A block is made of parts, one per JSON file (ladder, bench, torch), each headed by the device, the
date and the command that measured it. A file that is missing (or that a failed stage left as
{"error": ...}) leaves its parts as they are; a block no file has anything for is left alone. So
running this twice, or with only some of the files, never loses a table.
"""
from __future__ import annotations

from collections import Counter
import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections import OrderedDict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("ladder", "bench", "torch", "memory", "io")
# Blocks NN_name__KIND: what each KIND shows (the functions that write them are below).
BLOCK_KINDS = ("bwd_torch", "bwd_memory", "summary", "bwd_summary", "probes", "grid_summary", "bwd_grid_summary", "decode",
               "ring", "builds")
SDPA = [("flash", "flash"), ("cudnn", "cuDNN"), ("efficient", "mem-efficient"), ("math", "math")]

# The one ratio convention of every table: speed relative to a peer, the peer's time over ours.
RATIOS = ("Each \"x peer\" column is speed relative to that peer, its time over ours on the same "
          "inputs in the same run: above 1 is faster than the peer, 0.50 takes twice its time.")


def speed(peer_ms, ours_ms) -> str:
    """Speed relative to a peer (its time over ours), e.g. '1.07'; '-' when either is missing."""
    return "%.2f" % (peer_ms / ours_ms) if peer_ms and ours_ms else "-"


def not_run_lines(left_out) -> list:
    """One line per reason a kernel was not run (a dtype, head dim or mask it does not take)."""
    if not left_out:
        return []
    return [""] + ["Not run on %s: %s  " % (", ".join(dict.fromkeys(shapes)), cell(why))
                   for why, shapes in left_out.items()]
DTYPES = ["fp32", "fp16", "bf16"]


def dtype_key(t: str) -> int:
    return DTYPES.index(t) if t in DTYPES else len(DTYPES)


def kernel_key(name: str) -> tuple:
    """The ladder's rungs in order, then PyTorch's backends in SDPA's order. Numbers in a name compare
    as numbers, so that v10 comes after v9 (and is a rung's newest), not after v1."""
    peers = [p for p, _ in SDPA]
    if name.startswith("sdpa_") and name[5:] in peers:
        return (1, peers.index(name[5:]), ())
    return (0, 0, tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name) if t))

# A block: its begin marker, its body, its end marker, each marker alone on its line. A marker
# quoted in prose (`<!-- results:NN_name:begin -->` inside backticks) is not alone and not a block.
BLOCK_RE = re.compile(
    r"^(?P<begin>[ \t]*<!--[ \t]*(?P<name>results:(?P<rung>[A-Za-z0-9_]+)|gpu-table):begin[ \t]*-->[ \t]*)\n"
    r"(?P<body>.*?)"
    r"^(?P<end>[ \t]*<!--[ \t]*(?P=name):end[ \t]*-->[ \t]*)$",
    re.M | re.S)
PART_RE = re.compile(r"^<!-- part:([a-z]+) -->[ \t]*$", re.M)
WRITTEN_BY = "<!-- written by bench/report.py from the results JSON: edit the JSON and rerun, not this text -->"


# ---- Formatting (the same rules as bench/ladder.cpp, so the tables read alike) --------------------

def sig3(x) -> str:
    """Three significant digits without an exponent: 1234, 12.3, 0.0123."""
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-"
    a = abs(x)
    for limit, fmt in ((100, "%.0f"), (10, "%.1f"), (1, "%.2f"), (0.1, "%.3f"), (0.01, "%.4f"),
                       (0.001, "%.5f")):
        if a >= limit:
            return fmt % x
    return "%.2e" % x


def describe_bytes(b) -> str:
    """1.50 GiB, 512 B: as fl::describe_bytes prints them."""
    if b is None or not isinstance(b, (int, float)) or not math.isfinite(b):
        return "-"
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    u = 0
    while b >= 1024 and u < len(units) - 1:
        b /= 1024.0
        u += 1
    return "%.0f %s" % (b, units[u]) if u == 0 else "%.2f %s" % (b, units[u])


def sci(x) -> str:
    return "-" if x is None or not math.isfinite(x) else "%.1e" % x


def cell(s) -> str:
    """Table cells hold one line and no bare '|'."""
    return " ".join(str(s).split()).replace("|", "\\|")


def short(s, limit=160) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= limit else s[:limit - 4] + " ..."


def table(head, rows, right) -> list[str]:
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


class Notes:
    """Footnotes under a table, so long reasons (why skipped, what failed) keep rows one line."""

    def __init__(self):
        self.items: list[str] = []

    def ref(self, text: str) -> str:
        text = short(text, 300)
        if text not in self.items:
            self.items.append(text)
        return " [%d]" % (self.items.index(text) + 1)

    def lines(self) -> list[str]:
        return [""] + ["[%d] %s  " % (i + 1, cell(t)) for i, t in enumerate(self.items)] if self.items else []


def day(s) -> str:
    return str(s or "")[:10] or "date unknown"


# ---- Reading the JSON ------------------------------------------------------------------------------

def read_json(path: str):
    """The parsed file; None (with a message) when it is absent or says it was not produced."""
    if not os.path.exists(path):
        print(f"report: {path}: not there; the blocks it feeds are left as they are")
        return None
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            sys.exit(f"report: {path} is not valid JSON: {e}")
    if isinstance(doc, dict) and set(doc) == {"error"}:
        print(f"report: {path}: {short(doc['error'])}; the blocks it feeds are left as they are")
        return None
    return doc


def ladder_runs(doc) -> list[dict]:
    """One ladder run, or several under names, as a list of runs (each with its name in "key")."""
    if doc is None:
        return []
    if isinstance(doc, dict) and "rows" in doc:
        return [dict(doc, key="run")]
    runs = []
    if isinstance(doc, dict):
        for key, run in doc.items():
            if isinstance(run, dict) and "rows" in run:
                runs.append(dict(run, key=key))
    if not runs:
        sys.exit("report: ladder.json holds no ladder run (expected {\"problem\", \"device\", \"rows\"} "
                 "or named runs of that form)")
    return runs


def ladder_command(run: dict) -> str:
    """The ladder command line that gives this run's problem (its defaults left out)."""
    p, dev, rows = run.get("problem", {}), run.get("device", {}), run.get("rows", [])
    args = ["ladder"]
    backends = {r.get("backend") for r in rows}
    if backends == {"cuda"}:
        args += ["--device", "cuda"]
    elif backends == {"cpu"}:
        args += ["--device", "cpu"]

    def flag(name, value, default):
        if value is not None and value != default:
            args.extend([name, str(value)])

    flag("--batch", p.get("batch"), 1)
    flag("--heads", p.get("heads"), 4)
    flag("--kv-heads", p.get("kv_heads"), p.get("heads"))
    if p.get("seq_q") == p.get("seq_k"):
        flag("--seq", p.get("seq_q"), 512)
    else:
        flag("--seq-q", p.get("seq_q"), None)
        flag("--seq-k", p.get("seq_k"), None)
    d = p.get("head_dim", 64)
    flag("--head-dim", d, 64)
    if p.get("causal"):
        args.append("--causal")
    scale = p.get("scale")
    if scale and d and abs(scale - 1 / math.sqrt(d)) > 1e-6 * scale:
        args += ["--scale", "%.6g" % scale]
    flag("--dtype", p.get("dtype"), "fp32")
    flag("--inputs", p.get("inputs"), "normal")
    flag("--seed", p.get("seed"), 1234)
    flag("--reps", dev.get("reps_gpu") if "cuda" in backends else None, 10)
    return " ".join(str(a) for a in args + ["--json", "ladder.json"])


def ladder_device(run: dict) -> str:
    dev = run.get("device", {})
    if dev.get("gpu_available"):
        return dev.get("gpu_name") or "a GPU"
    why = dev.get("gpu_skipped_reason")
    return "the CPU only (no GPU: %s)" % short(why, 100) if why else "the CPU only"


def problem_text(run: dict) -> str:
    p = run.get("problem", {})
    return "%s, %s" % (p.get("shape", "?"), p.get("dtype", "?"))


def bench_records(doc) -> list[dict]:
    """One record per benchmark of ladder_bench's JSON: what ran, and its numbers or its error.
    With repetitions the median aggregate stands for the benchmark, as in bench/plot.py."""
    if doc is None:
        return []
    if not isinstance(doc, dict) or "benchmarks" not in doc:
        sys.exit("report: bench.json is not Google Benchmark JSON (no \"benchmarks\")")
    ctx = doc.get("context", {})
    date = ctx.get("date_utc") or ctx.get("date", "")
    by_run: "OrderedDict[str, list]" = OrderedDict()
    for b in doc.get("benchmarks", []):
        by_run.setdefault(b.get("run_name", b.get("name")), []).append(b)
    records = []
    for entries in by_run.values():
        label = next((e.get("label") for e in entries if e.get("label")), "")
        info = dict(kv.split("=", 1) for kv in label.split() if "=" in kv)
        if "rung" not in info:
            continue  # not one of ours
        medians = [e for e in entries if e.get("run_type") == "aggregate" and e.get("aggregate_name") == "median"]
        runs = [e for e in entries if e.get("run_type", "iteration") == "iteration"]
        good = [e for e in runs if not e.get("error_occurred")]
        if medians:
            entry, error = medians[0], None
        elif good:
            good.sort(key=lambda e: e.get("real_time", 0))
            entry, error = good[len(good) // 2], None
        else:
            entry, error = None, (runs[0].get("error_message", "error") if runs else "no run recorded")
        rec = {"rung": info["rung"], "phase": info.get("phase", "fwd"),
               "device": info.get("device", "?"), "dtype": info.get("dtype", "?"),
               "B": int(info.get("B", 0)), "H": int(info.get("H", 0)), "N": int(info.get("N", 0)),
               "d": int(info.get("d", 0)), "causal": info.get("causal", "0") == "1",
               "gpu": ctx.get("gpu", "?"), "host": ctx.get("host_name", ""), "date": date, "error": error}
        if entry is not None:
            unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[entry.get("time_unit", "ns")]
            rec.update(ms=entry.get("real_time", float("nan")) * unit, tflops=entry.get("TFLOP/s"),
                       gbps=entry.get("GB/s"), modelled=entry.get("modelled_bytes"),
                       extra=entry.get("extra_bytes"), rel_err=entry.get("rel_err"))
        records.append(rec)
    return records


def torch_rows(doc) -> list[dict]:
    if doc is None:
        return []
    if not isinstance(doc, list):
        sys.exit("report: torch.json is not compare_torch.py's JSON (expected a list of rows)")
    return [r for r in doc if isinstance(r, dict)]


def phase(row: dict) -> str:
    """A row's phase: "fwd", "bwd" or "fwd+bwd" ("fwd" for rows from before there was a phase)."""
    return row.get("phase") or "fwd"


def torch_command(rows: list[dict]) -> str:
    # a "time" row is compare_torch's note that its --time-limit stopped it: it measured no dtype
    compared = [r for r in rows if r.get("kind") not in ("memory", "time")]
    swept = any(r.get("kind") == "memory" for r in rows)
    dtypes = sorted({r["dtype"] for r in compared if r.get("dtype")}, key=dtype_key)
    device = "cpu" if all(r.get("device") == "cpu" for r in compared if r.get("kind") == "rung") else None
    args = ["python3", "bench/compare_torch.py"]
    if device:
        args += ["--device", "cpu"]
    if dtypes and dtypes != ["fp32"]:
        args += ["--dtype", ",".join(dtypes)]
    if swept:
        args += ["--memory-sweep"] + (["only"] if not compared else [])
    sustained = {r.get("sustained_s") for r in compared if r.get("sustained_s")}
    if sustained:
        args += ["--sustained", "%g" % max(sustained)]
    rounds = {r.get("rounds") for r in compared if r.get("rounds")}
    if rounds:
        args += ["--rounds", "%d" % max(rounds)]
    return " ".join(args + ["--json", "torch.json"])


def run_command(run: dict) -> str | None:
    """The command a probes run records at the end of its "what" (after "; compare_torch.py"), with
    the path it is run by; None where it records none."""
    m = re.search(r"(?:^|; )(compare_torch\.py .*)$", run.get("what", ""))
    return "python3 bench/" + m.group(1) if m else None


def torch_header(rows: list[dict], command: str | None = None) -> str:
    """Where, when and by what the rows were measured; command: the run's own command where it
    recorded one (a probes run), else the one torch_command rebuilds from the rows."""
    meta = next((r for r in rows if r.get("device")), {})
    extra = []
    if meta.get("torch"):
        extra.append("PyTorch " + meta["torch"] + (" (CUDA %s)" % meta["torch_cuda"] if meta.get("torch_cuda") else ""))
    # Rows of several runs (a file merged from two, as docs/results/README.md says): each day with
    # the dtypes it measured.
    days: "OrderedDict[str, list]" = OrderedDict()
    for r in rows:
        if r.get("date") and r.get("kind") in ("rung", "sdpa"):
            days.setdefault(day(r["date"]), [])
            if r.get("dtype") and r["dtype"] not in days[day(r["date"])]:
                days[day(r["date"])].append(r["dtype"])
    when = day(meta.get("date")) if len(days) <= 1 else \
        " and ".join("%s rows of %s" % ("/".join(sorted(t, key=dtype_key)), d) for d, t in days.items())
    return "on %s, %s%s, by `%s`" % (meta.get("device", "an unknown device"), when,
                                     ", " + ", ".join(extra) if extra else "", command or torch_command(rows))


# ---- The parts of a block --------------------------------------------------------------------------

def ladder_rows_table(run: dict, rows: list[dict], with_rung: bool) -> list[str]:
    notes = Notes()
    # A rung that does not take the problem's dtype, head dim or mask is one note, not a row.
    not_taken = [r for r in rows if r.get("status") == "skipped" and "does not run" in str(r.get("note", ""))]
    rows = [r for r in rows if r not in not_taken]
    head = (["rung"] if with_rung else []) + ["device", "dtype", "time (ms)", "TFLOP/s", "speed-up",
                                              "modelled IO", "extra memory", "rel err O", "check"]
    right = ([False] if with_rung else []) + [False, False, True, True, True, True, True, True, False]
    body = []
    for r in rows:
        if r.get("o_bad"):
            err = "%d bad" % r["o_bad"]
        else:
            err = sci(r.get("o_rel_l2"))
        check = r.get("status", "?") + (notes.ref(r["note"]) if r.get("note") else "")
        speed = r.get("speedup")
        body.append(([r.get("rung", "?")] if with_rung else []) + [
            r.get("device", "?"), r.get("dtype", "?"), sig3(r.get("time_ms")), sig3(r.get("tflops")),
            sig3(speed) + "x" if speed is not None else "-", describe_bytes(r.get("modelled_bytes")),
            describe_bytes(r.get("extra_bytes")), err, check])
    out = table(head, body, right) + notes.lines()
    if not_taken:
        out += ["", "Not run (a dtype, head dim or mask the rung does not take): " +
                ", ".join(dict.fromkeys(str(r.get("rung", "?")) for r in not_taken)) + "."]
    return out


def ladder_part(runs: list[dict], rung: str | None) -> str:
    """The ladder's rows: one rung's (rung given) or every rung's, one table per run."""
    out = []
    for run in runs:
        rows = [r for r in run.get("rows", []) if rung is None or r.get("rung") == rung]
        if not rows:
            continue
        out += ["", "The `ladder` program on %s, %s, by `%s` (problem: %s)." % (
            ladder_device(run), day(run.get("device", {}).get("date")), ladder_command(run), problem_text(run)), ""]
        out += ladder_rows_table(run, rows, with_rung=rung is None)
    if not out:
        return ""
    if rung is None:
        out += ["", "Speed-up is over the rung above on the same device. Modelled IO is the rung's "
                "closed-form traffic between device memory and the chip ([the IO model](io_model.md)); "
                "rel err O is the relative L2 error against the fp64 oracle."]
    return "\n".join(out).strip("\n")


def bench_part(records: list[dict], rung: str) -> str:
    recs = [r for r in records if r["rung"] == rung and r.get("phase", "fwd") == "fwd"]
    if not recs:
        return ""
    groups: "OrderedDict[tuple, list]" = OrderedDict()
    for r in recs:
        groups.setdefault((r["device"], r["gpu"], r["host"], r["date"], r["dtype"], r["B"], r["H"], r["d"],
                           r["causal"]), []).append(r)
    out = []
    for (device, gpu, host, date, dtype, b, h, d, causal), rs in groups.items():
        where = gpu if device == "cuda" else "the CPU" + (" of " + host if host else "")
        out += ["", "The Google Benchmark sweep on %s, %s, by `ladder_bench --fl_device=%s "
                "--benchmark_out=bench.json --benchmark_out_format=json`: B=%d H=%d d=%d%s, %s, "
                "against N." % (where, day(date), device, b, h, d, " causal" if causal else "", dtype), ""]
        notes = Notes()
        body = []
        for r in sorted(rs, key=lambda r: r["N"]):
            if r.get("error"):
                why = "out of device memory" if "free" in r["error"] and "needs" in r["error"] else "not run"
                body.append([str(r["N"]), "-", "-", "-", "-", "-", "-", why + notes.ref(r["error"])])
                continue
            body.append([str(r["N"]), sig3(r["ms"]), sig3(r["tflops"]), sig3(r["gbps"]),
                         describe_bytes(r["modelled"]), describe_bytes(r["extra"]), sci(r["rel_err"]), "ok"])
        out += table(["N", "time (ms)", "TFLOP/s", "modelled GB/s", "modelled IO", "extra memory",
                      "rel err O", "ran"], body, [True, True, True, True, True, True, True, False])
        out += notes.lines()
    out += ["", "Time is the median over repetitions; modelled GB/s is the modelled IO divided by that time."]
    return "\n".join(out).strip("\n")


def torch_groups(rows: list[dict], phases=("fwd",)) -> "OrderedDict[tuple, list]":
    """The rungs' and SDPA's rows of the given phases, by (shape, dtype), in the order measured."""
    groups: "OrderedDict[tuple, list]" = OrderedDict()
    for r in rows:
        if r.get("kind") in ("rung", "sdpa") and r.get("shape") and phase(r) in phases:
            groups.setdefault((r["shape"], r.get("dtype", "?")), []).append(r)
    return groups


def rung_of(row: dict) -> str:
    """'05_fa2_loop_order (cuda)' -> '05_fa2_loop_order'."""
    return str(row.get("name", "")).split(" (")[0]


def in_rung(name: str, rung: str) -> bool:
    """A rung's own name, or one of its versions ('06_tensor_core_mma/v2_ldmatrix')."""
    return name == rung or name.startswith(rung + "/")


def torch_part(rows: list[dict], rung: str) -> str:
    mine = [r for r in rows if r.get("kind") == "rung" and in_rung(rung_of(r), rung) and phase(r) == "fwd"]
    versioned = any(rung_of(r) != rung for r in mine)
    if not mine:
        return ""
    notes = Notes()
    body = []
    left_out: "OrderedDict[str, list]" = OrderedDict()  # why -> shapes
    for (shape, dtype), rs in torch_groups(rows).items():
        peers = {r["name"][len("sdpa_"):]: r["ms"] for r in rs if r.get("kind") == "sdpa" and r.get("ms")}
        for r in rs:
            if r.get("kind") != "rung" or not in_rung(rung_of(r), rung):
                continue
            lead = [shape, dtype] + ([rung_of(r)[len(rung) + 1:]] if versioned else [])
            if r.get("ms") is None:
                if r.get("skip"):  # a dtype, head dim or mask it does not take: a note, not a row
                    left_out.setdefault(short(r["skip"], 200), []).append(shape + " " + dtype)
                    continue
                why = r.get("error") or "not measured"
                body.append(lead + ["-", "-", "-", "ERROR" + notes.ref(why)] + ["-"] * len(SDPA))
                continue
            ratios = [speed(peers.get(p), r["ms"]) for p, _ in SDPA]
            body.append(lead + [sig3(r["ms"]), sig3(r.get("tflops")), sci(r.get("rel_err")),
                                ("PASS" if r.get("passed") else "FAIL")] + ratios)
    out = ["Beside PyTorch's attention kernels %s. %s Shapes are B x H x N x d, c for causal." % (
        torch_header(rows), RATIOS), ""]
    head = ["shape", "dtype"] + (["version"] if versioned else [])
    out += table(head + ["time (ms)", "TFLOP/s", "rel err O", "check"] + ["x " + n for _, n in SDPA],
                 body, [False] * len(head) + [True, True, True, False] + [True] * len(SDPA))
    out += notes.lines()
    out += not_run_lines(left_out)
    return "\n".join(out)


def torch_summary_part(rows: list[dict]) -> str:
    """For the README: per dtype, every kernel's time on every shape, the SDPA backends last."""
    groups = torch_groups(rows)
    if not groups:
        return ""
    out = ["Beside PyTorch's attention kernels %s: milliseconds per forward (lower is better), "
           "each rung called through the C ABI on the same inputs, in the same run, as PyTorch's "
           "SDPA backends. Shapes are B x H x N x d, c for causal; - where a kernel did not run "
           "(too little memory, or a dtype or shape it does not take)." % torch_header(rows)]
    for dtype in sorted({k[1] for k in groups}, key=dtype_key):
        shapes = [s for (s, t) in groups if t == dtype]
        kernels: list[str] = []
        for (s, t), rs in groups.items():
            if t == dtype:
                for r in rs:
                    if r["name"] not in kernels:
                        kernels.append(r["name"])
        kernels.sort(key=kernel_key)
        body = []
        for k in kernels:
            row = [k]
            for s in shapes:
                r = next((r for r in groups[(s, dtype)] if r["name"] == k), None)
                if r is None or r.get("ms") is None:
                    row.append("-")
                else:
                    row.append(sig3(r["ms"]) + ("" if r.get("passed") in (True, None) else " FAIL"))
            body.append(row)
        out += ["", "**%s**" % dtype, ""]
        out += table(["kernel"] + shapes, body, [False] + [True] * len(shapes))
    return "\n".join(out)


def backward_torch_part(rows: list[dict], rung: str) -> str:
    """The rung's backward beside SDPA's, one table per dtype: each shape where the rung has a
    backward row, its rows (each version's) and then each SDPA backend's, with bwd and fwd+bwd times
    and TFLOP/s, dQ's, dK's and dV's errors, and the times as ratios to FlashAttention-2's (SDPA
    flash) and cuDNN's in the same run."""
    groups = torch_groups(rows, phases=("bwd", "fwd+bwd"))
    peers = ["sdpa_" + p for p, _ in SDPA]
    notes = Notes()
    left_out: "OrderedDict[str, list]" = OrderedDict()  # why -> shapes
    by_dtype: "OrderedDict[str, list]" = OrderedDict()
    versioned = any(rung_of(r) != rung for rs in groups.values() for r in rs
                    if r.get("kind") == "rung" and in_rung(rung_of(r), rung))
    for (shape, dtype), rs in groups.items():
        kernels: "OrderedDict[str, dict]" = OrderedDict()  # name -> phase -> row
        for r in rs:
            kernels.setdefault(r["name"], {})[phase(r)] = r
        mine = [n for n, ph in kernels.items()
                if any(x.get("kind") == "rung" for x in ph.values()) and in_rung(n.split(" (")[0], rung)]
        if not mine:
            continue

        def ms(name, ph):
            r = kernels.get(name, {}).get(ph)
            return r.get("ms") if r else None

        for name in mine + [n for n in peers if n in kernels]:
            ph = kernels[name]
            b, fb = ph.get("bwd"), ph.get("fwd+bwd")
            label = name.split(" (")[0]
            if name in mine and versioned:
                label = label[len(rung) + 1:] or label
            elif name.startswith("sdpa_"):
                label = dict(SDPA).get(name[5:], name) + " (SDPA)"
            lead = [shape, label]
            if all(x is None or x.get("ms") is None for x in (b, fb)):
                x = b or fb
                if x.get("skip"):  # does not take this problem (dtype, d, mask): a note, not a row
                    left_out.setdefault(label + ": " + short(x["skip"], 200), []).append(shape)
                    continue
                why = x.get("error") or "not measured"
                status = "refused" if name.startswith("sdpa_") else "ERROR"
                by_dtype.setdefault(dtype, []).append(lead + ["-"] * 5 + [status + notes.ref(why)] + ["-"] * 4)
                continue
            x = next(x for x in (b, fb) if x is not None and x.get("ms") is not None)
            errs = " / ".join(sci(x.get(k)) for k in ("dq_rel_err", "dk_rel_err", "dv_rel_err"))

            def ratio(ph_name, peer):
                return speed(ms("sdpa_" + peer, ph_name), ms(name, ph_name))

            check = "PASS" if all(y.get("passed") for y in (b, fb) if y is not None and y.get("ms") is not None) \
                else "FAIL"
            by_dtype.setdefault(dtype, []).append(lead + [
                sig3(b.get("ms") if b else None), sig3(b.get("tflops") if b else None),
                sig3(fb.get("ms") if fb else None), sig3(fb.get("tflops") if fb else None), errs, check,
                ratio("bwd", "flash"), ratio("bwd", "cudnn"), ratio("fwd+bwd", "flash"), ratio("fwd+bwd", "cudnn")])
    if not by_dtype:
        return ""
    out = ["The backward beside PyTorch's attention kernels %s, each on the same inputs and the same "
           "random dO in the same run. bwd is the backward alone (the rung's fl_backward on the O and "
           "lse of its own forward; SDPA's autograd backward on one forward's graph), fwd+bwd a forward "
           "followed by a backward; TFLOP/s count 2.5x and 3.5x the forward's FLOPs. The errors are "
           "the relative L2 errors of dQ / dK / dV against an fp64 autograd reference. %s Shapes "
           "are B x H x N x d, c for causal." % (torch_header(rows), RATIOS)]
    for dtype in sorted(by_dtype, key=dtype_key):
        out += ["", "**%s**" % dtype, ""]
        out += table(["shape", "version" if versioned else "kernel", "bwd (ms)", "bwd TFLOP/s", "fwd+bwd (ms)",
                      "fwd+bwd TFLOP/s", "rel err dQ / dK / dV", "check", "bwd x FA2", "bwd x cuDNN",
                      "fwd+bwd x FA2", "fwd+bwd x cuDNN"], by_dtype[dtype],
                     [False, False, True, True, True, True, True, False, True, True, True, True])
    out += notes.lines()
    out += not_run_lines(left_out)
    return "\n".join(out)


# Dense peaks by GPU and dtype (TFLOP/s, the datasheet's; shared/anchors.md): the "% of peak" column.
PEAKS = {("H100", "bf16"): 989.0, ("H100", "fp16"): 989.0, ("H100", "fp32"): 67.0,
         ("H200", "bf16"): 989.0, ("H200", "fp16"): 989.0, ("H200", "fp32"): 67.0}


def peak_of(device: str, dtype: str):
    return next((p for (gpu, t), p in PEAKS.items() if gpu in (device or "") and t == dtype), None)


def summary_part(rows: list[dict], rung: str, ph: str = "fwd", n: int = 4096, dtype: str = "bf16",
                 run_rows: list[dict] | None = None, command: str | None = None) -> str:
    """One table up front: each version of the rung (or the rung) at one shape per head dim
    (N = n, B·N = 16384, H = 16, not causal, the dtype given), its TFLOP/s, % of the GPU's dense
    peak, speed relative to the version before it, to FlashAttention-2 and to cuDNN (SDPA flash
    and cudnn), all from one run (run_rows: that run's rows, for the header, where it measured more
    than these)."""
    want = {d: "%dx16x%dx%d" % (16384 // n, n, d) for d in (64, 128)}
    cells = {}  # (name, d) -> ms, tflops
    peers = {}  # (peer, d) -> ms
    device = ""
    shown = []
    for r in rows:
        if r.get("kind") not in ("rung", "sdpa") or phase(r) != ph or r.get("dtype") != dtype or not r.get("ms"):
            continue
        d = next((d for d, sh in want.items() if r.get("shape") == sh), None)
        if d is None:
            continue
        if r["kind"] == "sdpa":
            peers[(r["name"][len("sdpa_"):], d)] = r["ms"]
            shown.append(r)
        elif in_rung(rung_of(r), rung):
            cells[(rung_of(r), d)] = (r["ms"], r.get("tflops"))
            device = r.get("device", device)
            shown.append(r)
    # Versions in order; a name that stands for one of them ("mma") last, compared with none.
    names = sorted({k[0] for k in cells}, key=lambda n: (n.endswith("/mma"), kernel_key(n)))
    if not names:
        return ""
    peak = peak_of(device, dtype)
    head = ["version"]
    for d in (64, 128):
        head += ["TFLOP/s d=%d" % d] + (["% of peak"] if peak else []) + ["x previous", "x FA2", "x cuDNN"]
    body, prev = [], None
    for name in names:
        row = [name[len(rung) + 1:] or name]
        for d in (64, 128):
            ms, tf = cells.get((name, d), (None, None))
            pms = cells.get((prev, d), (None, None))[0] if prev else None
            row += [sig3(tf)] + (["%.0f %%" % (100 * tf / peak) if tf and peak else "-"] if peak else [])
            row += [speed(pms, ms), speed(peers.get(("flash", d)), ms), speed(peers.get(("cudnn", d)), ms)]
        body.append(row)
        prev = name if not name.endswith("/mma") else prev
    what = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward + backward"}[ph]
    out = ["The %s in one run %s: %s, B x H x N = %d x 16 x %d, not causal. %s%s" % (
        what, torch_header(run_rows or shown, command), dtype, 16384 // n, n, RATIOS,
        (" %% of peak is of the GPU's dense %s tensor-core peak, %.0f TFLOP/s (datasheet)." % (dtype, peak))
        if peak else ""), ""]
    out += table(head, body, [False] + [True] * (len(head) - 1))
    return "\n".join(out)


def ladder_summary_part(rows: list[dict], n: int = 4096, d: int = 64) -> str:
    """For the README: the whole ladder in one table per pass, from one run. Each rung at one shape
    (H = 16, N = n, d, not causal, B·N = 16384 or B = 1 as the run measured it), its fastest version
    in each dtype it runs, TFLOP/s, speed relative to the row above and to PyTorch's backends on
    the same inputs."""
    def shape_ok(r):
        sh = str(r.get("shape", ""))
        parts = sh.split("x")
        return len(parts) == 4 and parts[1] == "16" and parts[2] == str(n) and parts[3] == str(d)
    out = []
    # A rung with a backward pass borrows its forward from an earlier rung: no forward row of its own.
    with_backward = {rung_of(r).split("/")[0] for r in rows if r.get("kind") == "rung" and phase(r) == "bwd"}
    for ph, what in (("fwd", "Forward"), ("bwd", "Backward")):
        best: "OrderedDict[tuple, dict]" = OrderedDict()  # (rung, dtype) -> fastest row
        peers = {}  # (dtype, peer) -> ms
        device = ""
        for r in rows:
            if r.get("kind") not in ("rung", "sdpa") or phase(r) != ph or not shape_ok(r) or not r.get("ms"):
                continue
            if r["kind"] == "sdpa":
                peers[(r.get("dtype"), r["name"][len("sdpa_"):])] = r["ms"]
                continue
            name = rung_of(r)
            top = name.split("/")[0]
            if ph == "fwd" and top in with_backward:
                continue
            key = (top, r.get("dtype"))
            alias = name == top + "/mma"  # names one of the versions: a row only where they are not
            if key not in best or (best[key].get("_alias") and not alias) or \
                    (bool(best[key].get("_alias")) == alias and r["ms"] < best[key]["ms"]):
                best[key] = dict(r, _alias=alias)
            device = r.get("device", device)
        if not best:
            continue
        body, prev = [], None
        for (top, dtype), r in sorted(best.items(), key=lambda kv: (kv[0][0], dtype_key(kv[0][1]))):
            version = rung_of(r)[len(top) + 1:] or "-"
            row = [top, dtype, version, sig3(r.get("tflops")),
                   "%.2f" % (r["tflops"] / prev) if prev and r.get("tflops") else "-"]
            row += [speed(peers.get((dtype, p)), r["ms"]) for p, _ in SDPA]
            body.append(row)
            prev = r.get("tflops")
        shown = list(best.values()) + [r for r in rows if r.get("kind") == "sdpa" and phase(r) == ph and shape_ok(r)]
        out += ["", "**%s**, %s, H = 16, N = %d, d = %d, not causal:" % (what, torch_header(shown), n, d), ""]
        out += table(["rung", "dtype", "fastest version", "TFLOP/s", "x row above"] + ["x " + nm for _, nm in SDPA],
                     body, [False, False, False, True, True] + [True] * len(SDPA))
    if not out:
        return ""
    return "\n".join(["%s A rung runs in fp32 (00-05, 07's first version) or in 16 bits on the tensor "
                      "cores; PyTorch's backends are compared in the same dtype and run. '-' where a backend "
                      "does not run that dtype. Every shape is in [the results](docs/results.md)." % RATIOS] + out)


def probes_part(probes: list, rung: str) -> str:
    """The one-process comparisons made while a rung's versions were built (probes.json: a list of
    runs, each {"name", "what", "rows": compare_torch.py rows}): per run, TFLOP/s of each kernel on
    each shape, so that a chapter's prediction-and-outcome notes quote numbers a table holds."""
    out = []
    for i, run in enumerate(probes):
        rows = [r for r in run.get("rows", []) if r.get("ms")]
        if not any(in_rung(rung_of(r), rung) for r in rows):
            continue
        # A backward run: the backward alone ("bwd") and a deterministic mode's ("bwd-det") of each
        # kernel, each its own column ("v2_deterministic bwd-det").
        # A run that timed other rungs' backward beside this rung's forward (rungs 08 and 09 together)
        # shows this rung its forward rows only.
        if any(phase(r) in ("bwd", "bwd-det") for r in rows if in_rung(rung_of(r), rung)):
            rows = [dict(r, name="%s %s" % (r["name"], phase(r))) for r in rows if phase(r) in ("bwd", "bwd-det")]
        else:
            timed_backward = {rung_of(r).split("/")[0] for r in rows
                              if phase(r) in ("bwd", "bwd-det") and not rung_of(r).startswith("sdpa_")}
            rows = [r for r in rows if phase(r) == "fwd" and rung_of(r).split("/")[0] not in timed_backward]
        if len({r.get("dtype") for r in rows}) > 1:  # a run of several dtypes: a row per shape and dtype
            rows = [dict(r, shape="%s %s" % (r["shape"], r.get("dtype"))) for r in rows]
        kernels: list = []
        shapes: list = []
        for r in rows:
            if r["name"] not in kernels:
                kernels.append(r["name"])
            if r["shape"] not in shapes:
                shapes.append(r["shape"])
        kernels.sort(key=kernel_key)
        cell = {(r["shape"], r["name"]): r for r in rows}

        def label(k: str) -> str:
            base, _, ph = k.partition(" ")
            base = base if k.startswith("sdpa_") else k.split(" (")[0]
            ph = ph.rsplit(") ", 1)[-1] if ")" in ph else ph
            name = base.replace(rung + "/", "") if not base.startswith("sdpa_") else \
                dict(SDPA).get(base[5:], base) + " (SDPA)"
            return name + (" " + ph if ph in ("bwd", "bwd-det") else "")
        newest = max((k for k in kernels if in_rung(k.split(" (")[0], rung)), key=kernel_key)
        others = [k for k in kernels if k != newest]
        body = []
        for sh in shapes:
            ms = lambda k: cell[(sh, k)]["ms"] if (sh, k) in cell else None
            body.append([sh] + [sig3(cell[(sh, k)].get("tflops")) if (sh, k) in cell else "-" for k in kernels] +
                        [speed(ms(k), ms(newest)) for k in others])
        dtypes = "/".join(sorted({r.get("dtype", "?") for r in rows}, key=dtype_key))
        out += ["", "Run %d, %s (%s), %s, %s: TFLOP/s of each kernel, then %s's speed relative to each of the "
                "others (their time over its)." % (i + 1, run.get("name", "?"), run.get("what", ""),
                                                   torch_header(rows, run_command(run)),
                                                   dtypes, label(newest)), ""]
        out += table(["shape"] + [label(k) for k in kernels] + ["%s x %s" % (label(newest), label(k)) for k in others],
                     body, [False] + [True] * (len(kernels) + len(others)))
    return "\n".join(out).strip("\n")


def grid_run_of(run: dict, rung: str) -> bool:
    """Whether a probes run stands as the grid run of `rung`: "grid": true (of every rung it
    measured) or "grid": [the rungs it stands for] (a run that also timed other rungs' versions,
    such as rung 08's forward beside rung 09, without replacing their own grid run)."""
    g = run.get("grid")
    return g is True or isinstance(g, list) and rung in g


def grid_summary_part(probes: list, rung: str, ph: str = "fwd") -> str:
    """The summary table (summary_part) of phase `ph` from the newest probes run marked as the
    rung's grid run (grid_run_of) that measured the rung in that phase, once per dtype it holds:
    for a rung whose versions were all measured together in a run of their own rather than in
    torch.json's run."""
    run = next((p for p in reversed(probes) if grid_run_of(p, rung) and
                any(in_rung(rung_of(r), rung) and phase(r) == ph for r in p.get("rows", []))), None)
    if run is None:
        return ""
    dtypes = sorted({r.get("dtype") for r in run["rows"] if r.get("dtype")}, key=lambda t: (t != "bf16", dtype_key(t)))
    return "\n\n".join(p for p in (summary_part(run["rows"], rung, ph, dtype=t, run_rows=run["rows"],
                                                 command=run_command(run))
                                    for t in dtypes) if p)


def decode_part(rows: list[dict], figure: str | None) -> str:
    """Rung 10 (NN_name__decode): bench/compare_decode.py's rows in torch.json, the newest run's:
    the ceilings, then per cell every kernel's time, the bytes of K and V it read per second, that
    as a share of the streaming read and against the faster of SDPA's flash and cuDNN."""
    dec = [r for r in rows if r.get("kind") in ("decode", "ceiling") and r.get("date")]
    if not dec:
        return ""
    newest = max(day(r["date"]) for r in dec)
    dec = [r for r in dec if day(r["date"]) == newest]
    ceil = {r["name"]: r for r in dec if r["kind"] == "ceiling"}
    read = ceil.get("stream_read", {}).get("GBps")
    copy = ceil.get("copy", {}).get("GBps")
    device = dec[0].get("device", "?")
    out = ["Measured on %s, %s (`python3 bench/compare_decode.py --json torch.json`): a streaming read "
           "reaches %s GB/s and a device-to-device copy moves %s GB/s (reads and writes). GB/s below "
           "counts the bytes of K and V once per KV head, the same for every kernel; \"of read\" is that "
           "over the streaming read, \"of same\" over a streaming read of as many bytes as the cell's K and "
           "V (up to 2 GiB; what one call that reads that much reaches, its fixed cost included), "
           "\"x SDPA\" the faster of flash's and cuDNN's time over the kernel's "
           "(above 1: faster)." % (device, newest, sig3(read), sig3(copy)), ""]
    notes = Notes()
    body = []
    # A kernel that refuses a kind of cell by design (v1 has no paged path) refuses it in every cell:
    # its refusal is listed once, at the first such cell, with how many cells it stands for.
    def refusal(r: dict):
        return ((r["name"], r.get("page_size"), r["skip"]) if r["kind"] == "decode" and r.get("ms") is None
                and r.get("skip") and r.get("name") != "cell" else None)
    refusals = Counter(k for k in map(refusal, dec) if k)
    listed = set()
    for r in dec:
        if r["kind"] != "decode" or r.get("name") == "cell" and not r.get("skip"):
            continue
        name = r["name"] + (" paged %d" % r["page_size"] if r.get("page_size") else "")
        lead = [r.get("shape", "?"), r.get("dtype", "?"), name]
        if r.get("ms") is None:
            why = r.get("skip") or r.get("error") or "not measured"
            key = refusal(r)
            if key in listed:
                continue
            if key and refusals[key] > 1:
                listed.add(key)
                why += " (the same in all %d cells; listed once)" % refusals[key]
            body.append(lead + ["-"] * 7 + [("skipped" if r.get("skip") else "ERROR") + notes.ref(why)])
            continue
        frac = r.get("frac_stream_read")
        check = "PASS" if r.get("passed") else ("-" if r.get("passed") is None else "FAIL")
        if r.get("paged_same_bits") is not None:
            check += ", same bits" if r["paged_same_bits"] else ", other bits"
        body.append(lead + [str(r["splits"]) if r.get("splits") else "-", sig3(r["ms"] * 1e3), sig3(r.get("GBps")),
                            "%.0f%%" % (100 * frac) if frac is not None else "-",
                            "%.0f%%" % (100 * r["frac_same_size_read"]) if r.get("frac_same_size_read") else "-",
                            "%.2f" % r["ratio_to_best_sdpa"] if r.get("ratio_to_best_sdpa") else "-",
                            sci(r.get("rel_err")), check])
    out += table(["cell", "dtype", "kernel", "splits", "time (us)", "GB/s", "of read", "of same", "x SDPA",
                  "rel err O", "check"], body, [False, False, False, True, True, True, True, True, True, True, False])
    out += notes.lines()
    if figure:
        out += ["", "![Bandwidth against KV length](%s)" % figure]
    return "\n".join(out)


def memory_part(rows: list[dict], rung: str, figure: str | None) -> str:
    """The memory sweep (compare_torch.py --memory-sweep): for each N, the extra device memory of a
    forward+backward of each of the rung's versions that ran it and of standard attention (SDPA
    math), where standard attention ran out of memory its predicted need; the figure when there is
    one (`figure`: its path relative to the page)."""
    mem = [r for r in rows if r.get("kind") == "memory" and r.get("seq_q")]
    names = []
    for r in mem:
        if r["name"] not in names and (r["name"] == "sdpa_math" or in_rung(rung_of(r), rung)):
            names.append(r["name"])
    notes = Notes()
    # A rung whose every row was skipped (it does not run the sweep's dtype) is a note, not a column.
    skipped = [n for n in names if n != "sdpa_math" and all(r.get("status") == "skipped" for r in mem if r["name"] == n)]
    for n in skipped:
        why = next((r.get("skip") for r in mem if r["name"] == n and r.get("skip")), "skipped")
        notes.ref("%s: %s" % (n, why))
    cols = [n for n in names if n not in skipped]
    if not any(n != "sdpa_math" for n in cols):
        return ""
    seqs = sorted({int(r["seq_q"]) for r in mem})
    body = []
    for n in seqs:
        cells = [str(n)]
        value = {}
        for name in cols:
            r = next((r for r in mem if r["name"] == name and int(r["seq_q"]) == n), None)
            if r is None:
                cells.append("-")
            elif r.get("status") == "ok":
                cells.append(describe_bytes(r.get("extra_bytes")))
                value[name] = r.get("extra_bytes")
            elif r.get("status") == "out of memory":
                cells.append("out of memory (needs ~%s)" % describe_bytes(r.get("predicted_extra_bytes"))
                             + notes.ref("%s at N=%d: out of device memory; the need is predicted from %s"
                                         % (name, n, r.get("predicted_from") or "the measured points")))
                value[name] = r.get("predicted_extra_bytes")
            else:
                cells.append("-" + notes.ref("%s at N=%d: %s" % (name, n, r.get("skip") or r.get("error") or
                                                                   r.get("status") or "not measured")))
        ours = [value.get(c) for c in cols if c != "sdpa_math"]
        std = value.get("sdpa_math")
        predicted = any(r.get("status") == "out of memory" for r in mem if int(r["seq_q"]) == n and r["name"] in cols)
        cells.append(("~" if predicted else "") + "%.0fx" % (std / ours[0]) if std and ours and ours[0] else "-")
        body.append(cells)
    first = mem[0]
    head = ["N"] + [("standard attention (SDPA math)" if c == "sdpa_math" else rung_of({"name": c})) for c in cols] \
        + ["standard / %s" % rung_of({"name": next(c for c in cols if c != "sdpa_math")})]
    out = ["Extra device memory of one forward and backward %s: B=%s H=%s d=%s %s, Nq = Nk = N, beyond "
           "the inputs, outputs and gradients. For a rung, its workspaces (the peak of PyTorch's "
           "allocator while fl_forward and fl_backward run; the library allocates nothing else); for "
           "standard attention, what SDPA's math backend keeps and makes through autograd (S, P and "
           "their gradients). Where it runs out of device memory, the N^2 prediction from the last N "
           "it ran." % (torch_header(rows), first.get("batch", "?"), first.get("heads", "?"),
                        first.get("head_dim", "?"), first.get("dtype", "?")), ""]
    out += table(head, body, [True] * len(head))
    out += notes.lines()
    if figure:
        out += ["", "![extra device memory of a forward and backward against N](%s)" % figure]
    return "\n".join(out)


# ---- Rewriting the pages ---------------------------------------------------------------------------

def split_parts(body: str) -> dict:
    """The parts of an existing block, by name; {} when it has none (the "not measured" text)."""
    marks = list(PART_RE.finditer(body))
    parts = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(body)
        parts[m.group(1)] = body[m.end():end].strip("\n")
    return parts


def new_body(old_body: str, fresh: dict) -> str | None:
    """The block's new text: fresh parts where a file was read (None: file missing, keep the old
    part). None when nothing is left to show, so the block stays as it is."""
    old = split_parts(old_body)
    parts = OrderedDict()
    for name in PARTS:
        text = fresh.get(name)
        if text is None:
            text = old.get(name, "")
        if text:
            parts[name] = text
    if not parts:
        return None
    chunks = [WRITTEN_BY]
    for name, text in parts.items():
        chunks += ["<!-- part:%s -->" % name, text, ""]
    return "\n".join(chunks)


def rewrite(text: str, fresh_for) -> tuple[str, list[str]]:
    """Rewrites every block in a page; fresh_for(rung or None) gives the fresh parts of a block."""
    changed = []

    def one(m):
        body = new_body(m.group("body"), fresh_for(m.group("rung")))
        if body is None:
            return m.group(0)
        if body + "\n" != m.group("body"):
            changed.append(m.group("name"))
        return "%s\n%s\n%s" % (m.group("begin"), body, m.group("end"))

    return BLOCK_RE.sub(one, text), changed


def check_markers(path: str, text: str):
    """Every begin has its end: refuse a page where the regex would silently skip a block."""
    begins = re.findall(r"^[ \t]*<!--[ \t]*(results:[A-Za-z0-9_]+|gpu-table):begin[ \t]*-->[ \t]*$", text, re.M)
    found = [m.group("name") for m in BLOCK_RE.finditer(text)]
    if sorted(begins) != sorted(found):
        missing = [b for b in begins if b not in found]
        sys.exit(f"report: {path}: block(s) {', '.join(missing)} have no matching end marker on a line of their own")
    for name in found:
        if "__" in name and name.split("__", 1)[1] not in BLOCK_KINDS:
            sys.exit(f"report: {path}: block {name}: unknown kind '{name.split('__', 1)[1]}' (known: "
                     f"{', '.join(BLOCK_KINDS)})")


def pages(docs_dir: str, readme: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(docs_dir):
        dirs.sort()
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".md")]
    if readme and os.path.exists(readme):
        out.append(readme)
    return out


def io_part(rows: list) -> str:
    """bench/ncu_io.py's rows: DRAM bytes Nsight Compute measured for one forward, beside the
    bytes the rung's IO model predicts for the same shape."""
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return ""
    first = ok[0]
    out = ["Device-memory traffic of one forward on %s, %s, measured by Nsight Compute "
           "(`dram__bytes_read.sum` + `dram__bytes_write.sum` over the rung's kernels) with "
           "`python3 bench/ncu_io.py --probe build-hopper/bench/io_probe --json io.json`: fp32, "
           "B=1, H=%d, d=%d." % (first.get("device", "?"), day(first.get("date", "")),
                                 first.get("heads", 0), first.get("head_dim", 0)), ""]
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["rung"], str(r.get("seq", "")), "-", "-", "-", cell(short(r["error"], 80))])
            continue
        mod = r["modelled_read"] + r["modelled_written"]
        mea = r["measured_read"] + r["measured_written"]
        body.append([r["rung"], str(r["seq"]), describe_bytes(mod), describe_bytes(mea),
                     "%.2f" % (mea / mod), ""])
    out += table(["rung", "N", "modelled", "measured (DRAM)", "measured / modelled", "note"], body,
                 [False, True, True, True, True, False])
    return "\n".join(out)


def ring_part(doc: dict) -> str:
    """bench/ring_probe's JSON (rung 11): the link, the local kernels, and each ring version's parallel
    efficiency at each N beside the same rungs on one GPU, with the relative L2 difference of its outputs."""
    eff = [e for e in doc.get("efficiency", []) if not e.get("error")]
    if not eff:
        return ""
    out = ["On %d %s GPUs (%s), `ring_probe --ring-versions %s --efficiency %s` (%s, whole problem %s, "
           "causal, zigzag): parallel efficiency t_1 / (P · t_P), t_1 the same local rungs on one GPU on the "
           "whole problem (%s forward, %s backward), t_P the ring's call on the wall clock." % (
               doc.get("gpus", 0), doc.get("device", "?"), day(doc.get("date", "")),
               ",".join(OrderedDict((e["version"], 1) for e in eff)), ",".join(OrderedDict((str(e["N"]), 1) for e in eff)),
               doc.get("dtype", "?"), doc.get("shape", "?").replace("Nq=131072 Nk=131072 ", "").replace(" causal=0", ""),
               doc.get("fwd", {}).get("rung", "?"), doc.get("bwd", {}).get("rung", "?")), ""]
    links = doc.get("links", [])
    if links:
        out += ["The link, each way, one send and one receive per GPU in one NCCL group: " + ", ".join(
            "%s GB/s at %s" % (sig3(l["GBps"]), describe_bytes(l["bytes"])) for l in links) +
            ". The local kernels on one full step (%d by %d keys, not causal): forward %s TFLOP/s, "
            "backward %s TFLOP/s." % (doc.get("step_len", 0), doc.get("step_len", 0), sig3(doc["fwd"]["tflops"]),
                                      sig3(doc["bwd"]["tflops"])), ""]
    versions = list(OrderedDict((e["version"], 1) for e in eff))
    ns = sorted({e["N"] for e in eff})
    by = {(e["N"], e["version"]): e for e in eff}
    head = ["N", "one GPU fwd (ms)", "one GPU bwd (ms)"] + ["%s fwd" % v for v in versions]
    has_bwd = [v for v in versions if any(by.get((n, v), {}).get("efficiency_bwd") for n in ns)]
    head += ["%s bwd" % v for v in has_bwd] + ["%s fwd+bwd" % v for v in has_bwd]
    body = []
    for n in ns:
        any_e = next(by[(n, v)] for v in versions if (n, v) in by)
        row = [str(n), sig3(any_e["one_ms"]), sig3(any_e["one_bwd_ms"]) if any_e.get("one_bwd_ms") else "-"]
        row += ["%.2f" % by[(n, v)]["efficiency"] if (n, v) in by else "-" for v in versions]
        row += ["%.2f" % by[(n, v)]["efficiency_bwd"] if by.get((n, v), {}).get("efficiency_bwd") else "-" for v in has_bwd]
        row += ["%.2f" % by[(n, v)]["efficiency_fwd_bwd"] if by.get((n, v), {}).get("efficiency_fwd_bwd") else "-"
                for v in has_bwd]
        body.append(row)
    out += table(head, body, [True] * len(head))
    worst = {}
    for e in eff:
        for k, x in (e.get("rel_l2") or {}).items():
            if x is not None and k != "lse":
                worst[k] = max(worst.get(k, 0.0), x)
    if worst:
        bar = max(e.get("bar") or 0 for e in eff)
        out += ["", "Outputs against one GPU's on the same inputs, the largest relative L2 difference over every N and "
                "version: " + ", ".join("%s %s" % (k.upper().replace("D", "d", 1) if k != "o" else "O", sci(x))
                                        for k, x in worst.items()) +
                " (the bar, (P + 2) units of roundoff: %s)." % sci(bar)]
    return "\n".join(out)


def builds_part(doc: list, rung: str) -> str:
    """builds.json: the rung's timings of switch or probe builds (ladder's backward time in each mode, or
    rung 08's forward time, ms) and the writer's step by phase under the GPU's global timer (us), one
    table each a run."""
    out = []
    for i, b in enumerate(doc):
        if b.get("rung") != rung or (not b.get("rows") and not b.get("phases")):
            continue
        out += ["Build run %s, %s (%s), on %s, %s, by `%s`." % (
            chr(ord("a") + i), b.get("name", "?"), b.get("what", ""), b.get("device", "?"), b.get("date", "?"),
            b.get("command", "?")), ""]
        if b.get("rows"):
            what = "forward" if rung.startswith("08") else "backward"  # rung 08 has no mode: its column is "-"
            out += ["| shape | variant | %s, default (ms) | %s, mode (ms) |" % (what, what), "|---|---|---:|---:|"]
            ms = lambda x: "-" if x is None else "%.4f" % x
            out += ["| %s | %s | %s | %s |" % (r["shape"], r["variant"], ms(r.get("default_ms")), ms(r.get("mode_ms")))
                    for r in b["rows"]]
            out.append("")
        if b.get("phases"):
            out += ["| shape | variant | issue (us) | wait for the read (us) | wait for the landing (us) | "
                    "fence and hand-on (us) | turn seen after the hand-on (us) | first turns, ranks 0-4 (us) |",
                    "|---|---|---:|---:|---:|---:|---:|---|"]
            out += ["| %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %s |" % (
                p["shape"], p["variant"], p["issue_us"], p["wait_read_us"], p["wait_all_us"], p["hand_on_us"],
                p["turn_seen_us"], ", ".join("%.1f" % t for t in p.get("first_turn_us", [])) or "-")
                for p in b["phases"]]
            out.append("")
    return "\n".join(out).rstrip("\n")


def run(results: str, docs_dir: str, readme: str, check: bool) -> int:
    ladder_doc = read_json(os.path.join(results, "ladder.json"))
    bench_doc = read_json(os.path.join(results, "bench.json"))
    torch_doc = read_json(os.path.join(results, "torch.json"))
    io_doc = read_json(os.path.join(results, "io.json"))
    probes_doc = read_json(os.path.join(results, "probes.json"))
    ring_doc = read_json(os.path.join(results, "ring.json"))
    builds_doc = read_json(os.path.join(results, "builds.json"))
    runs, records, trows = ladder_runs(ladder_doc), bench_records(bench_doc), torch_rows(torch_doc)

    def fresh_for(rung, page):
        if rung == "io_model":  # docs/io_model.md: measured beside modelled
            return {"io": io_part(io_doc) if isinstance(io_doc, list) else None}
        if rung and "__" in rung:  # NN_name__KIND: one kind of result for one rung
            step, kind = rung.split("__", 1)
            if kind == "bwd_torch":
                return {"torch": backward_torch_part(trows, step) if torch_doc is not None else None}
            if kind == "probes":
                return {"torch": probes_part(probes_doc, step) if isinstance(probes_doc, list) else None}
            if kind == "bwd_grid_summary":
                return {"torch": grid_summary_part(probes_doc, step, "bwd") if isinstance(probes_doc, list) else None}
            if kind == "grid_summary":
                return {"torch": grid_summary_part(probes_doc, step) if isinstance(probes_doc, list) else None}
            if kind == "ring":
                return {"torch": ring_part(ring_doc) if isinstance(ring_doc, dict) else None}
            if kind == "builds":
                return {"torch": builds_part(builds_doc, step) if isinstance(builds_doc, list) else None}
            if kind == "decode":
                figure = os.path.join(docs_dir, "figures", "decode_bandwidth.png")
                rel = (os.path.relpath(figure, os.path.dirname(page)).replace(os.sep, "/")
                       if os.path.exists(figure) else None)
                return {"torch": decode_part(trows, rel) if torch_doc is not None else None}
            if kind in ("summary", "bwd_summary"):
                ph = "fwd" if kind == "summary" else "bwd"
                return {"torch": summary_part(trows, step, ph) if torch_doc is not None else None}
            figure = os.path.join(docs_dir, "figures", "backward_memory.png")
            rel = os.path.relpath(figure, os.path.dirname(page)).replace(os.sep, "/") if os.path.exists(figure) else None
            return {"memory": memory_part(trows, step, rel) if torch_doc is not None else None}
        if rung is None:  # README's gpu-table: the ladder in one table
            return {"ladder": "", "bench": "",
                    "torch": ladder_summary_part(trows) if torch_doc is not None else None}
        if rung == "results":  # docs/results.md: the ladder's runs beside PyTorch
            return {"ladder": ladder_part(runs, None) if ladder_doc is not None else None,
                    "bench": None,
                    "torch": torch_summary_part(trows) if torch_doc is not None else None}
        return {"ladder": ladder_part(runs, rung) if ladder_doc is not None else None,
                "bench": bench_part(records, rung) if bench_doc is not None else None,
                "torch": torch_part(trows, rung) if torch_doc is not None else None}

    stale = 0
    for path in pages(docs_dir, readme):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        check_markers(path, text)
        new, changed = rewrite(text, lambda rung: fresh_for(rung, path))
        rel = os.path.relpath(path, REPO) if os.path.abspath(path).startswith(REPO + os.sep) else path
        if not changed:
            continue
        stale += 1
        if check:
            print(f"report: {rel}: out of date ({', '.join(changed)})")
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            print(f"report: {rel}: rewrote {', '.join(changed)}")
    if stale == 0:
        print("report: every block is up to date")
    return 1 if check and stale else 0


# ---- Self-test: made-up JSON in, tables out, in a temporary folder ---------------------------------

def self_test(keep: str | None = None) -> int:
    page = ("# 00\n\nText `<!-- results:00_naive_eigen:begin -->` quoted in prose is no block.\n\n"
            "<!-- results:00_naive_eigen:begin -->\nNot measured yet: run tests/gpu_suite.sh and bench/report.py.\n"
            "<!-- results:00_naive_eigen:end -->\n\nAfter.\n")
    readme = "# R\n\n<!-- gpu-table:begin -->\nNo GPU measurement has been recorded yet.\n<!-- gpu-table:end -->\n"
    row = {"rung": "00_naive_eigen", "backend": "cuda", "device": "H100", "dtype": "fp32", "status": "PASS",
           "note": "", "time_ms": 1.5, "tflops": 45.8, "speedup": None, "modelled_bytes": 5436080128,
           "extra_bytes": 2147483648, "o_rel_l2": 3.1e-7, "o_bad": 0}
    run1 = {"problem": {"batch": 1, "heads": 16, "kv_heads": 16, "seq_q": 4096, "seq_k": 4096, "head_dim": 64,
                        "causal": False, "scale": 0.125, "dtype": "fp32", "seed": 1234, "inputs": "normal",
                        "shape": "B=1 H=16 Hkv=16 Nq=4096 Nk=4096 d=64 causal=0"},
            "device": {"gpu_available": True, "gpu_name": "NVIDIA H100 80GB HBM3", "date": "2030-01-02",
                       "reps_gpu": 10},
            "rows": [row, dict(row, rung="01_safe_softmax", status="FAIL", note="a | reason", o_bad=7)]}
    bench = {"context": {"gpu": "NVIDIA H100 80GB HBM3", "date_utc": "2030-01-03"}, "benchmarks": [
        {"name": "a", "run_name": "a", "run_type": "aggregate", "aggregate_name": "median", "real_time": 2.0,
         "time_unit": "ms", "TFLOP/s": 34.4, "GB/s": 2700, "modelled_bytes": 5.4e9, "extra_bytes": 2 ** 31,
         "rel_err": 2e-7, "label": "rung=00_naive_eigen device=cuda dtype=fp32 B=1 H=16 N=4096 d=64 causal=0"},
        {"name": "b", "run_name": "b", "run_type": "iteration", "error_occurred": True,
         "error_message": "00_naive_eigen needs 34 GiB, 30 GiB free",
         "label": "rung=00_naive_eigen device=cuda dtype=fp32 B=1 H=16 N=16384 d=64 causal=0"}]}
    torch_json = [
        {"kind": "rung", "name": "00_naive_eigen (cuda)", "shape": "1x16x4096x64", "dtype": "fp32", "ms": 3.0,
         "tflops": 22.9, "rel_err": 3e-7, "passed": True, "device": "NVIDIA H100 80GB HBM3",
         "date": "2030-01-04T00:00:00+00:00", "torch": "2.11"},
        {"kind": "sdpa", "name": "sdpa_flash", "shape": "1x16x4096x64", "dtype": "fp32", "ms": None,
         "error": "no fp32"},
        {"kind": "sdpa", "name": "sdpa_math", "shape": "1x16x4096x64", "dtype": "fp32", "ms": 1.5,
         "passed": True}]
    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        docs, res = os.path.join(tmp, "docs"), os.path.join(tmp, "results")
        os.makedirs(docs)
        os.makedirs(res)
        chapter, rm = os.path.join(docs, "00_naive_eigen.md"), os.path.join(tmp, "README.md")
        results_page = os.path.join(docs, "results.md")
        all_results = readme.replace("gpu-table", "results:results")
        for path, text in ((chapter, page), (rm, readme), (results_page, all_results)):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)

        def read(p):
            with open(p, encoding="utf-8") as f:
                return f.read()

        # No files at all: nothing changes.
        run(res, docs, rm, False)
        expect(read(chapter) == page and read(rm) == readme, "pages changed with no results")
        # Only ladder.json (a named run, as tests/gpu_suite.sh writes it).
        with open(os.path.join(res, "ladder.json"), "w") as f:
            json.dump({"seq4096_heads16": run1}, f)
        run(res, docs, rm, False)
        c1 = read(chapter)
        expect("NVIDIA H100 80GB HBM3, 2030-01-02" in c1, "ladder header (device, date) missing")
        expect("`ladder --device cuda --heads 16 --seq 4096 --json ladder.json`" in c1, "ladder command wrong:\n" + c1)
        expect("5.06 GiB" in c1 and "2.00 GiB" in c1 and "3.1e-07" in c1, "ladder numbers missing")
        expect("01_safe_softmax" not in c1, "another rung's row in rung 00's block")
        expect("Not measured yet" not in c1, "placeholder kept")
        expect("quoted in prose is no block" in c1 and c1.endswith("After.\n"), "text outside the block changed")
        r1 = read(results_page)
        expect("01_safe_softmax" in r1 and "7 bad" in r1 and "a \\| reason" in r1, "results page wrong:\n" + r1)
        expect(read(rm) == readme, "the README's one table needs torch.json, not the ladder's")
        # Idempotent.
        expect(run(res, docs, rm, True) == 0, "--check finds changes right after a rewrite")
        # bench.json and torch.json added: the ladder part stays, the others appear.
        with open(os.path.join(res, "bench.json"), "w") as f:
            json.dump(bench, f)
        with open(os.path.join(res, "torch.json"), "w") as f:
            json.dump(torch_json, f)
        expect(run(res, docs, rm, True) == 1, "--check misses new results")
        run(res, docs, rm, False)
        c2 = read(chapter)
        expect("2030-01-02" in c2 and "2030-01-03" in c2 and "2030-01-04" in c2, "a part is missing:\n" + c2)
        expect("out of device memory" in c2 and "| 4096 | 2.00 | 34.4 |" in c2, "bench table wrong:\n" + c2)
        expect("| 1x16x4096x64 | fp32 | 3.00 | 22.9 | 3.0e-07 | PASS | - | - | - | 0.50 |" in c2,
               "torch table wrong:\n" + c2)
        # ladder.json gone (or an error placeholder): its part is kept as it was.
        with open(os.path.join(res, "ladder.json"), "w") as f:
            json.dump({"error": "not produced"}, f)
        os.remove(os.path.join(res, "bench.json"))
        run(res, docs, rm, False)
        expect(read(chapter) == c2, "a missing file changed its part")

        # The backward blocks (NN_name__bwd_torch, NN_name__bwd_memory): empty until torch.json has
        # backward and memory rows; the forward tables never show a backward row.
        bwd_page = os.path.join(docs, "07_x.md")
        bwd_text = ("# 07\n\n## Measured (written by bench/report.py)\n\n"
                    "<!-- results:07_x__bwd_torch:begin -->\n<!-- results:07_x__bwd_torch:end -->\n\n"
                    "<!-- results:07_x__bwd_memory:begin -->\n<!-- results:07_x__bwd_memory:end -->\n")
        with open(bwd_page, "w", encoding="utf-8") as f:
            f.write(bwd_text)
        run(res, docs, rm, False)
        expect(read(bwd_page) == bwd_text, "backward blocks filled without backward rows:\n" + read(bwd_page))
        common = {"shape": "1x16x4096x64", "dtype": "bf16", "device": "NVIDIA H100 80GB HBM3",
                  "date": "2030-01-05T00:00:00+00:00", "torch": "2.11"}
        grads = {"dq_rel_err": 2e-3, "dk_rel_err": 3e-3, "dv_rel_err": 4e-3, "passed": True}
        bwd_rows = [
            dict(common, kind="rung", name="07_x (cuda)", phase="fwd", ms=1.0, tflops=300, rel_err=2e-3, passed=True),
            dict(common, kind="rung", name="07_x (cuda)", phase="bwd", ms=4.0, tflops=200, **grads),
            dict(common, kind="rung", name="07_x (cuda)", phase="fwd+bwd", ms=5.0, tflops=210, **grads),
            dict(common, kind="rung", name="07_x/v2 (cuda)", phase="bwd", ms=None, error="boom", passed=False),
            dict(common, kind="rung", name="07_x/v2 (cuda)", phase="fwd+bwd", ms=None, error="boom", passed=False),
            dict(common, kind="sdpa", name="sdpa_flash", phase="bwd", ms=2.0, tflops=400, **grads),
            dict(common, kind="sdpa", name="sdpa_flash", phase="fwd+bwd", ms=2.5, tflops=420, **grads),
            dict(common, kind="sdpa", name="sdpa_cudnn", phase="bwd", ms=1.0, tflops=800, **grads),
            dict(common, kind="sdpa", name="sdpa_cudnn", phase="fwd+bwd", ms=1.25, tflops=840, **grads),
            dict(common, kind="sdpa", name="sdpa_math", phase="bwd", ms=None, error="refused | why"),
            dict(common, kind="sdpa", name="sdpa_math", phase="fwd+bwd", ms=None, error="refused | why")]
        mem = {"kind": "memory", "phase": "fwd+bwd", "dtype": "bf16", "batch": 1, "heads": 16, "head_dim": 64,
               "device": "NVIDIA H100 80GB HBM3", "date": "2030-01-05T00:00:00+00:00"}
        mem_rows = [dict(mem, name="07_x (cuda)", seq_q=1024, status="ok", extra_bytes=2 ** 20),
                    dict(mem, name="sdpa_math", seq_q=1024, status="ok", extra_bytes=2 ** 30),
                    dict(mem, name="07_x (cuda)", seq_q=2048, status="ok", extra_bytes=2 ** 21),
                    dict(mem, name="sdpa_math", seq_q=2048, status="out of memory", predicted_extra_bytes=2 ** 32,
                         predicted_from="N=1024 measured x (N/1024)^2"),
                    dict(mem, name="07_y (cuda)", seq_q=1024, status="ok", extra_bytes=1)]
        with open(os.path.join(res, "torch.json"), "w") as f:
            json.dump(torch_json + bwd_rows + mem_rows, f)
        run(res, docs, rm, False)
        b = read(bwd_page)
        expect("| 1x16x4096x64 | 07_x | 4.00 | 200 | 5.00 | 210 | 2.0e-03 / 3.0e-03 / 4.0e-03 | PASS | 0.50 | "
               "0.25 | 0.50 | 0.25 |" in b, "backward table wrong:\n" + b)
        expect("| 1x16x4096x64 | v2 | - | - | - | - | - | ERROR [" in b and "refused [" in b and "refused \\| why" in b,
               "backward errors and refusals missing:\n" + b)
        expect("--memory-sweep --json torch.json" in b, "command without --memory-sweep:\n" + b)
        expect("| 1024 | 1.00 MiB | 1.00 GiB | 1024x |" in b and "out of memory (needs ~4.00 GiB)" in b
               and "~2048x" in b and "07_y" not in b, "memory table wrong:\n" + b)
        expect("backward_memory.png" not in b, "a link to a figure that does not exist")
        os.makedirs(os.path.join(docs, "figures"))
        open(os.path.join(docs, "figures", "backward_memory.png"), "wb").close()
        run(res, docs, rm, False)
        expect("](figures/backward_memory.png)" in read(bwd_page), "figure link missing")
        c3 = read(chapter)
        expect("| 1x16x4096x64 | fp32 | 3.00 | 22.9 | 3.0e-07 | PASS | - | - | - | 0.50 |" in c3 and "07_x" not in c3
               and c3.count("| 1x16x4096x64 |") == 1, "backward or memory rows reached a forward block:\n" + c3)
        # Rung 10's block (NN_name__decode): empty without decode rows; the newest run's rows.
        dec_page = os.path.join(docs, "10_x.md")
        dec_text = "# 10\n\n<!-- results:10_x__decode:begin -->\n<!-- results:10_x__decode:end -->\n"
        with open(dec_page, "w", encoding="utf-8") as f:
            f.write(dec_text)
        run(res, docs, rm, False)
        expect(read(dec_page) == dec_text, "decode block filled without decode rows:\n" + read(dec_page))
        dc = {"device": "NVIDIA H100 80GB HBM3", "date": "2030-01-06T00:00:00+00:00", "dtype": "bf16",
              "shape": "16x32/8x1x32768x128"}
        dec_rows = [dict(dc, kind="ceiling", name="stream_read", GBps=3100.0, ms=0.7),
                    dict(dc, kind="ceiling", name="copy", GBps=2900.0, ms=0.7),
                    dict(dc, kind="decode", name="10_decoding/v1_split_kv", splits=2, ms=0.8, GBps=2900.0,
                         frac_stream_read=0.935, frac_same_size_read=0.951, ratio_to_best_sdpa=1.05, rel_err=3e-3,
                         passed=True),
                    dict(dc, kind="decode", name="10_decoding/v2_paged", page_size=64, splits=2, ms=0.8,
                         GBps=2900.0, frac_stream_read=0.935, ratio_to_best_sdpa=1.05, rel_err=3e-3, passed=True,
                         paged_same_bits=True),
                    dict(dc, kind="decode", name="sdpa_flash", ms=None, error="refused | gqa"),
                    dict(dc, kind="decode", name="cell", shape="64x32x1x131072x128", ms=None, skip="needs 137 GB"),
                    dict(dc, kind="decode", name="10_decoding/v1_split_kv", date="2030-01-01T00:00:00+00:00",
                         ms=9.0, GBps=1.0, splits=1, passed=True)]
        with open(os.path.join(res, "torch.json"), "w") as f:
            json.dump(torch_json + bwd_rows + mem_rows + dec_rows, f)
        run(res, docs, rm, False)
        dp = read(dec_page)
        expect("reaches 3.10e+03 GB/s" in dp or "reaches 3100 GB/s" in dp, "decode ceiling missing:\n" + dp)
        expect("| 16x32/8x1x32768x128 | bf16 | 10_decoding/v1_split_kv | 2 | 800 | 2900 | 94% | 95% | 1.05 | 3.0e-03 | PASS |"
               in dp and "v2_paged paged 64" in dp and "PASS, same bits" in dp, "decode table wrong:\n" + dp)
        expect("ERROR [" in dp and "skipped [" in dp and "needs 137 GB" in dp and "| 9.00 |" not in dp
               and "| 1.00 |" not in dp, "decode errors, skips or an old run wrong:\n" + dp)
        expect("07_x" not in dp and "sdpa_math" not in dp, "other rows reached the decode block:\n" + dp)
        with open(bwd_page, "a", encoding="utf-8") as f:
            f.write("<!-- results:07_x__nonsense:begin -->\n<!-- results:07_x__nonsense:end -->\n")
        try:
            run(res, docs, rm, True)
            failures.append("an unknown block kind was accepted")
        except SystemExit as e:
            expect("unknown kind 'nonsense'" in str(e), "unknown kind message: %s" % e)
        if keep:
            shutil.copytree(tmp, keep, dirs_exist_ok=True)
    # The summary table: versions in order, each against the one before and the peers, one shape.
    sh = lambda d: {"shape": "4x16x4096x%d" % d, "dtype": "bf16", "phase": "fwd", "device": "NVIDIA H100 80GB HBM3"}
    rows = [dict(sh(d), kind="rung", name="06_x/v%d_a (cuda)" % v, ms=ms, tflops=tf)
            for d in (64, 128) for v, ms, tf in ((1, 2.0, 300.0), (2, 1.0, 600.0))]
    rows += [dict(sh(d), kind="sdpa", name="sdpa_" + p, ms=ms) for d in (64, 128) for p, ms in (("flash", 1.5), ("cudnn", 0.8))]
    t = summary_part(rows, "06_x")
    expect("| v1_a | 300 | 30 % | - | 0.75 | 0.40 | 300 | 30 % | - | 0.75 | 0.40 |" in t
           and "| v2_a | 600 | 61 % | 2.00 | 1.50 | 0.80 |" in t, "summary table wrong:\n" + t)
    if failures:
        print("report self-test FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print("report self-test passed")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", help="folder with ladder.json, bench.json, torch.json (any may be missing)")
    ap.add_argument("--docs", default=os.path.join(REPO, "docs"), help="the pages with results blocks (default: docs/)")
    ap.add_argument("--readme", default=os.path.join(REPO, "README.md"), help="the README with the gpu-table block")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is out of date")
    ap.add_argument("--self-test", action="store_true", help="run on made-up JSON in a temporary folder")
    ap.add_argument("--keep", help=argparse.SUPPRESS)  # --self-test --keep DIR: leave its pages in DIR
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test(args.keep)
    if not args.results:
        ap.error("--results DIR is required (docs/results holds the published results)")
    if not os.path.isdir(args.results):
        ap.error(f"--results {args.results}: not a folder")
    return run(args.results, args.docs, args.readme, args.check)


if __name__ == "__main__":
    sys.exit(main())
