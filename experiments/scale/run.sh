#!/usr/bin/env bash
# Weak scaling of GPT-3 175B on DGX H100 nodes at fixed work per GPU (tp 8, pp 8 interleaved with
# 3 chunks, 32 micro-batches per replica; dp 2, 8, 32, 160): the committed scenarios, then
# variants written to a temporary folder (no spread of devices or kernels, the device spread alone, 3% per-kernel
# jitter, expected and drawn with seeds 0-2,
# a fixed bucket size, a hypothetical 1 us latency above the SuperPOD's scalable units, and the
# same plan under 1F1B with and without Megatron-Core's overlapped parameter gather), then the
# data-parallel reduce-scatter alone (nccl-test). Prints the Markdown tables of README.md.
# Usage, from the repository root after cargo build --release: experiments/scale/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${TRAINSIM:-target/release/trainsim}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - "$bin" "$here" "$tmp" <<'PY'
import json, subprocess, sys
bin, here, tmp = sys.argv[1:4]

def simulate(path):
    out = subprocess.run([bin, "simulate", path, "--json"], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    c = next(t for t in r["time_breakdown"] if t["role"] == "critical_device")
    return r, c

def variant(gpus, tag, change):
    s = json.load(open(f"{here}/gpt3-175b-weak-{gpus}xh100.json"))
    change(s)
    path = f"{tmp}/{gpus}-{tag}.json"
    json.dump(s, open(path, "w"))
    return path

parts = [("gemm_s", "GEMM"), ("attention_s", "attention"), ("memory_bound_s", "memory-bound"),
         ("embedding_head_s", "embedding+head"), ("optimizer_s", "optimizer"),
         ("exposed_tp_comm_s", "TP exposed"), ("exposed_dp_comm_s", "DP exposed"),
         ("exposed_pp_comm_s", "PP exposed"), ("bubble_s", "bubble"), ("host_s", "host")]

print("Critical device (pipeline stage 7), seconds per iteration:\n")
print("| scenario | GPUs | iteration s | MFU | " + " | ".join(n for _, n in parts) + " |")
print("|---|---|---|---|" + "---|" * len(parts))
base = {}
for name in ["128xh100", "512xh100", "2048xh100", "10240xh100", "10240xh100-superpod"]:
    r, c = simulate(f"{here}/gpt3-175b-weak-{name}.json")
    base[name] = r
    print(f"| gpt3-175b-weak-{name} | {r['devices']:,} | {r['iteration_s']:.4f} | {100 * r['mfu']:.2f}% | "
          + " | ".join(f"{c[k]:.4f}" for k, _ in parts) + " |")

def sim_key(**kv):
    return lambda s: s.__setitem__("simulation", dict(kv))

def one_f_one_b(overlap):
    def change(s):
        s["plan"]["schedule"] = "1f1b"
        del s["plan"]["virtual_stages"]
        if not overlap:
            s["training"]["framework"] = {"name": "megatron-core", "param_gather_overlap": False}
    return change

def bucket(b):
    def change(s):
        s["plan"]["bucket_bytes"] = b
        s["simulation"] = {"device_variability": 0, "kernel_jitter": 0}
    return change

def superpod_latency(s):
    s["cluster"]["fabric"] = {"preset": "dgx-superpod", "extra_latency_s": 1e-6}

variants = [
    ("device_variability 0, kernel_jitter 0 (no spread)", sim_key(device_variability=0, kernel_jitter=0), [128, 512, 2048, 10240]),
    ("kernel_jitter 0 (the device spread alone)", sim_key(kernel_jitter=0), [128, 10240]),
    ("kernel_jitter 0.03 (expected waits)", sim_key(kernel_jitter=0.03), [128, 10240]),
    ("kernel_jitter 0.03 (seed 0)", sim_key(kernel_jitter=0.03, kernel_jitter_draws=True), [128, 10240]),
    ("kernel_jitter 0.03 (seed 1)", sim_key(kernel_jitter=0.03, kernel_jitter_draws=True, seed=1), [128, 10240]),
    ("kernel_jitter 0.03 (seed 2)", sim_key(kernel_jitter=0.03, kernel_jitter_draws=True, seed=2), [128, 10240]),
    ("no spread, bucket_bytes 640e6", bucket(640e6), [128]),
    ("no spread, bucket_bytes 160e6", bucket(160e6), [10240]),
    ("dgx-superpod, extra_latency_s 1e-6 (hypothetical)", superpod_latency, [128, 10240]),
    ("1F1B (no virtual stages)", one_f_one_b(True), [128, 10240]),
    ("1F1B, param_gather_overlap false", one_f_one_b(False), [128, 10240]),
]
print("\nVariants (temporary files), critical device:\n")
print("| variant | GPUs | iteration s | MFU | GEMM | TP exposed | DP exposed | bubble |")
print("|---|---|---|---|---|---|---|---|")
for label, change, sizes in variants:
    for g in sizes:
        r, c = simulate(variant(g, label.replace(" ", "_").replace(",", "").replace("(", "").replace(")", ""), change))
        print(f"| {label} | {g:,} | {r['iteration_s']:.4f} | {100 * r['mfu']:.2f}% | {c['gemm_s']:.4f} | "
              f"{c['exposed_tp_comm_s']:.4f} | {c['exposed_dp_comm_s']:.4f} | {c['bubble_s']:.4f} |")
PY

echo
for n in 2 32 160; do
  "$bin" nccl-test --op reduce_scatter --node dgx-h100 --nodes "$n" --gpus 1 --min-bytes 16M --max-bytes 1G --step-factor 8
done
