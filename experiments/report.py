#!/usr/bin/env python3
"""Run every scenario of an experiments folder through trainsim and print a Markdown table.

Usage: experiments/report.py experiments/parallelism [path/to/trainsim]
"""
import json
import pathlib
import subprocess
import sys

folder = pathlib.Path(sys.argv[1])
binary = sys.argv[2] if len(sys.argv) > 2 else "target/release/trainsim"
print("| scenario | iteration_s | samples/s | MFU | bubble | peak HBM GiB (of) | host GiB/node | fits |")
print("|---|---|---|---|---|---|---|---|")
for path in sorted(folder.glob("*.json")):
    run = subprocess.run([binary, "simulate", str(path), "--json"], capture_output=True, text=True)
    if run.returncode != 0:
        print(f"| {path.stem} | error: {run.stderr.strip()[:80]} | | | | | | |")
        continue
    r = json.loads(run.stdout)
    gib = 1024 ** 3
    print(
        f"| {path.stem} | {r['iteration_s']:.3f} | {r['samples_per_s']:.1f} | {100 * r['mfu']:.1f}% "
        f"| {100 * r['bubble_fraction']:.1f}% | {r['peak_memory_bytes'] / gib:.1f} ({r['memory_capacity_bytes'] / gib:.0f}) "
        f"| {r['host_memory_bytes'] / gib:.1f} | {'yes' if r['fits'] else 'no'} |"
    )
