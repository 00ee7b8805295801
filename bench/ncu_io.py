#!/usr/bin/env python3
"""Measured device-memory traffic beside the modelled traffic, for each GPU rung.

For every rung and shape, runs bench/io_probe (one forward) under Nsight Compute, sums
dram__bytes_read.sum and dram__bytes_write.sum over the rung's own kernels (the harness's NaN
poisoning kernel, fill_u16, is left out) and writes one JSON row per (rung, shape) with the
modelled bytes the rung's CPU twin is pinned to. docs/io_model.md shows the result.

    python3 bench/ncu_io.py --probe build-hopper/bench/io_probe --json io.json

Needs `ncu` (Nsight Compute) and a GPU whose counters it may read. Clocks are left alone
(--clock-control none): the numbers are bytes, not times.
"""
import argparse, csv, datetime, io, json, shutil, subprocess, sys

RUNGS = ["00_naive_eigen", "01_safe_softmax", "02_online_softmax", "03_block_matmul",
         "04_fa1_loop_order", "05_fa2_loop_order"]


def find_ncu():
    for c in ("ncu", "/usr/local/cuda/bin/ncu"):
        p = shutil.which(c)
        if p:
            return p
    sys.exit("ncu_io: Nsight Compute (ncu) not found on PATH or in /usr/local/cuda/bin")


def measure(ncu, probe, rung, seq, heads, d, timeout):
    cmd = [ncu, "--clock-control", "none", "--csv", "--page", "raw",
           "--metrics", "dram__bytes_read.sum,dram__bytes_write.sum",
           probe, "--rung", rung, "--seq", str(seq), "--heads", str(heads), "--head-dim", str(d)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    probe_json = next((l for l in p.stdout.splitlines() if l.startswith("{")), None)
    if p.returncode != 0 or probe_json is None:
        return {"rung": rung, "seq": seq, "heads": heads, "head_dim": d,
                "error": (p.stderr.strip() or p.stdout.strip())[-300:], "command": " ".join(cmd)}
    row = json.loads(probe_json)
    # The CSV: a header line, a units line, then one line per kernel launch.
    lines = [l for l in p.stdout.splitlines() if l.startswith('"')]
    reader = list(csv.DictReader(io.StringIO("\n".join(lines))))
    read = written = 0.0
    kernels = []
    for r in reader[1:]:  # reader[0] is the units row
        name = r.get("Kernel Name", "")
        if "fill_u16" in name:
            continue
        scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
        units = reader[0]
        read += float(r["dram__bytes_read.sum"].replace(",", "")) * scale.get(units["dram__bytes_read.sum"], 1)
        written += float(r["dram__bytes_write.sum"].replace(",", "")) * scale.get(units["dram__bytes_write.sum"], 1)
        kernels.append(name.split("(")[0][-60:])
    row.update(measured_read=read, measured_written=written, kernels=kernels, command=" ".join(cmd))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", default="build-hopper/bench/io_probe")
    ap.add_argument("--json", required=True, help="where to write the rows")
    ap.add_argument("--seqs", default="1024,4096")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rungs", default=",".join(RUNGS))
    ap.add_argument("--timeout", type=int, default=120, help="seconds per ncu run")
    a = ap.parse_args()
    ncu = find_ncu()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    rows, failed = [], 0
    for seq in [int(x) for x in a.seqs.split(",")]:
        for rung in a.rungs.split(","):
            try:
                row = measure(ncu, a.probe, rung, seq, a.heads, a.head_dim, a.timeout)
            except subprocess.TimeoutExpired:
                row = {"rung": rung, "seq": seq, "error": f"ncu took over {a.timeout}s"}
            row.update(device=gpu, date=date)
            rows.append(row)
            if "error" in row:
                failed += 1
                print(f"{rung:20s} N={seq:6d}  error: {row['error']}", flush=True)
            else:
                mod = row["modelled_read"] + row["modelled_written"]
                mea = row["measured_read"] + row["measured_written"]
                print(f"{rung:20s} N={seq:6d}  modelled {mod/1e6:10.1f} MB  measured {mea/1e6:10.1f} MB"
                      f"  ratio {mea/mod:6.2f}", flush=True)
    json.dump(rows, open(a.json, "w"), indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
