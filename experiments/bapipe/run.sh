#!/usr/bin/env bash
# BaPipe reproduction: explore schedule x micro-batch size with balanced partitions for VGG-16,
# ResNet-50 and GNMT-8 on an 8-GPU V100 node and on 8 FPGA boards; compare with data
# parallelism and with GPipe on uniform stages. Writes bapipe.csv and bar plots.
# Usage, from the repository root after cargo build --release: experiments/bapipe/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${TRAINSIM:-target/release/trainsim}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "case,best_schedule,best_micro_batch,speedup_vs_data_parallel,speedup_vs_uniform_gpipe,pipeline_peak_gib,data_parallel_peak_gib,memory_reduction,data_parallel_fits" >"$here/bapipe.csv"
for f in "$here"/*-v100.json "$here"/*-fpga.json; do
  name=$(basename "$f" .json)
  "$bin" partition "$f" --json --write "$tmp/best.json" 2>/dev/null >"$tmp/e.json"
  "$bin" simulate "$tmp/best.json" --json >"$tmp/best_r.json"
  python3 - "$f" >"$tmp/dp.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
v["plan"] = {"dp": 8, "tp": 1, "pp": 1}
v["training"]["micro_batch"] = v["training"]["global_batch"] // 8
print(json.dumps(v))
PY
  "$bin" simulate "$tmp/dp.json" --json >"$tmp/dp_r.json"
  python3 - "$tmp/e.json" "$tmp/best_r.json" "$tmp/dp_r.json" "$name" >>"$here/bapipe.csv" <<'PY'
import json, sys
e, b, d = (json.load(open(p)) for p in sys.argv[1:4])
best = e["best"]; g = 1024 ** 3
dp_time = d["iteration_s"]
speed_dp = dp_time / b["iteration_s"]
uni = e["speedup_vs_uniform_gpipe"]
print(f"{sys.argv[4]},{best['schedule']},{best['micro_batch']},{speed_dp:.3f},{uni:.3f},{b['peak_memory_bytes'] / g:.2f},"
      f"{d['peak_memory_bytes'] / g:.2f},{d['peak_memory_bytes'] / b['peak_memory_bytes']:.2f},{d['fits']}")
PY
done
"$bin" plot "$here/bapipe.csv" --y speedup_vs_data_parallel,speedup_vs_uniform_gpipe --title "BaPipe-style exploration: speedup of the best plan" --y-label "speedup" --out "$here/speedup.png"
"$bin" plot "$here/bapipe.csv" --y pipeline_peak_gib,data_parallel_peak_gib --title "Peak memory per device: explored pipeline vs data parallelism" --y-label "GiB" --out "$here/memory.png"
cat "$here/bapipe.csv"
