#!/usr/bin/env bash
# Offload reproduction (Colossal-AI §4.5, SEEDS 4.4): GPT-2 10B (h=4096, 50 layers, seq 1024,
# 48 sequences per GPU, full recomputation) scaled by data parallelism over 1, 2, 4 and 8
# A100-40GB GPUs of one node, with Gemini's chunk placement against ZeRO-3 with parameters and
# optimizer offloaded to the CPU; then the largest model each policy trains on the node.
# Writes scaling.csv, scaling.png, capacity.json and the capacity plots.
# Usage, from the repository root after cargo build --release: experiments/offload/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${TRAINSIM:-target/release/trainsim}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "gpus,zero3_cpu_samples_per_s,gemini_samples_per_s,gemini_speedup,zero3_cpu_peak_gib,gemini_peak_gib,gemini_moved_gib,gemini_optimizer_on_device,all_on_device_samples_per_s,all_on_device_fits" >"$here/scaling.csv"
for g in 1 2 4 8; do
  for p in zero3-cpu gemini none; do
    python3 - "$here/gpt2-10b-$p.json" "$g" >"$tmp/$p.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); g = int(sys.argv[2])
s["cluster"]["node"] = {"preset": "dgx-a100-40gb", "devices": g}
s["plan"]["dp"] = g
s["training"]["global_batch"] = 48 * g
s["name"] += f" on {g} GPU(s)"
print(json.dumps(s))
PY
    "$bin" simulate "$tmp/$p.json" --json >"$tmp/$p.out.json"
  done
  python3 - "$tmp" "$g" >>"$here/scaling.csv" <<'PY'
import json, sys
t, g = sys.argv[1], sys.argv[2]
z, m, n = (json.load(open(f"{t}/{p}.out.json")) for p in ("zero3-cpu", "gemini", "none"))
c = m["chunk_placement"][0]; G = 1024 ** 3
print(f"{g},{z['samples_per_s']:.3f},{m['samples_per_s']:.3f},{m['samples_per_s'] / z['samples_per_s']:.3f},"
      f"{z['peak_memory_bytes'] / G:.2f},{m['peak_memory_bytes'] / G:.2f},{c['moved_bytes'] / G:.2f},{c['optimizer_on_device']:.3f},{n['samples_per_s']:.3f},{n['fits']}")
PY
done
"$bin" plot "$here/scaling.csv" --y zero3_cpu_samples_per_s,gemini_samples_per_s --title "GPT-2 10B on A100-40GB: ZeRO-3 CPU offload vs Gemini" --y-label "samples/s" --out "$here/scaling.png"
cat "$here/scaling.csv"
# The largest model per policy on the 8-GPU node, and the sweep over GPU counts.
"$bin" capacity "$here/gpt2-10b-none.json" --vary params --gpus 1,2,4,8 --plot "$here" --json >"$here/capacity.json"
"$bin" capacity "$here/gpt2-10b-none.json" --vary params
# The same search with 4 sequences per GPU, where model states rather than activations bound
# the size.
mkdir -p "$here/mb4"
python3 - "$here/gpt2-10b-none.json" >"$tmp/mb4.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["training"]["micro_batch"] = 4
s["training"]["global_batch"] = 32
s["name"] = "GPT-2 10B family, 4 sequences per GPU"
print(json.dumps(s))
PY
"$bin" capacity "$tmp/mb4.json" --vary params --gpus 1,2,4,8 --plot "$here/mb4" --json >"$here/mb4/capacity.json"
"$bin" capacity "$tmp/mb4.json" --vary params
