#!/usr/bin/env bash
# TeraPipe reproduction: the four published settings, a sequence-length sweep and uniform
# slicing against the optimiser. Writes CSVs and plots next to this script.
# Usage (from the repository root, after cargo build --release): experiments/terapipe/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${TRAINSIM:-target/release/trainsim}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. The four settings of SEEDS.md 2.5 with their published latencies (seconds).
echo "setting,published_without_s,published_with_s,simulated_without_s,simulated_with_s,published_speedup,simulated_speedup" >"$here/settings.csv"
for row in "5 1.863 1.328 setting5-gpt3-13b" "6 13.319 7.103 setting6-gpt3-44b" "9 9.990 1.481 setting9-gpt3-175b" \
  "10 5.822 1.160 setting10-gpt3-175b" "6-megatron-order 13.319 7.103 setting6-gpt3-44b-megatron-order"; do
  set -- $row
  f="$here/$4.json"
  "$bin" simulate "$f" --json >"$tmp/r.json"
  python3 - "$tmp/r.json" "$1" "$2" "$3" >>"$here/settings.csv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = r["token_slicing"]
s, wo, w = sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
print(f"({s}),{wo},{w},{t['iteration_s_without']:.4f},{r['iteration_s']:.4f},{wo / w:.3f},{t['speedup']:.3f}")
PY
done

# 1b. The slicing schemes TeraPipe published (SEEDS.md 2.2, 2.5), simulated as given: separates the
# optimiser's choice from the per-slice cost.
echo "setting,scheme,published_with_s,simulated_published_scheme_s,simulated_optimised_s" >"$here/published_schemes.csv"
for row in "5 1.328 setting5-gpt3-13b [[1,[704,688,656]]]*32" "9 1.481 setting9-gpt3-175b [[1,[120]*4+[112]*6+[104]*8+[64]]]*2"; do
  set -- $row
  python3 - "$here/$3.json" "$4" >"$tmp/p.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1])); v["plan"]["token_slices"] = eval(sys.argv[2]); print(json.dumps(v))
PY
  "$bin" simulate "$tmp/p.json" --json >"$tmp/r.json"
  "$bin" simulate "$here/$3.json" --json >"$tmp/o.json"
  python3 - "$tmp/r.json" "$tmp/o.json" "$1" "$2" "$4" >>"$here/published_schemes.csv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); o = json.load(open(sys.argv[2]))
print(f"({sys.argv[3]}),\"{sys.argv[5]}\",{sys.argv[4]},{r['iteration_s']:.4f},{o['iteration_s']:.4f}")
PY
done

# 2. Sequence length, GPT-3 13B on the setting-5 layout (40 stages x 8-way tensor parallel).
echo "seq_len,batch,without_s,with_s,speedup,fits" >"$here/seq_len.csv"
for row in "2048 32" "4096 8" "6144 4" "8192 2"; do
  set -- $row
  python3 - "$here/setting5-gpt3-13b.json" "$1" "$2" >"$tmp/s.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1])); v["training"]["seq_len"] = int(sys.argv[2]); v["training"]["global_batch"] = int(sys.argv[3])
v["name"] = f"GPT-3 13B, seq {sys.argv[2]}, batch {sys.argv[3]}"
print(json.dumps(v))
PY
  "$bin" simulate "$tmp/s.json" --json >"$tmp/r.json"
  python3 - "$tmp/r.json" "$1" "$2" >>"$here/seq_len.csv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = r["token_slicing"]
print(f"{sys.argv[2]},{sys.argv[3]},{t['iteration_s_without']:.4f},{r['iteration_s']:.4f},{t['speedup']:.3f},{r['fits']}")
PY
done

# 2b. The settings whose latencies are kept aside (SEEDS.md 2.5): predictions only, recorded so
# that they can be compared later without having been fitted to.
echo "setting,simulated_without_s,simulated_with_s,simulated_speedup,sub_batches_and_slices" >"$here/heldout_predictions.csv"
for f in "$here"/heldout-setting*.json; do
  "$bin" simulate "$f" --json >"$tmp/r.json"
  python3 - "$tmp/r.json" "$(basename "$f" .json)" >>"$here/heldout_predictions.csv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = r["token_slicing"]
shapes = sorted({(b, len(s)) for b, s in t["slices"]}, reverse=True)
desc = " ".join(f"{b}seq/{n}slices" for b, n in shapes)
print(f"{sys.argv[2].replace('heldout-', '')},{t['iteration_s_without']:.4f},{r['iteration_s']:.4f},{t['speedup']:.3f},{desc}")
PY
done

# 3. Uniform slices against the optimiser (GPT-3 44B setting 6; GPT-3 175B setting 9).
echo "model,slices,uniform_s,optimised_s" >"$here/uniform.csv"
for f in "$here/setting6-gpt3-44b.json" "$here/setting9-gpt3-175b.json"; do
  "$bin" simulate "$f" --json >"$tmp/opt.json"
  for n in 1 2 4 8 16 32 64; do
    python3 - "$f" "$n" >"$tmp/u.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1])); n = int(sys.argv[2]); L = v["training"]["seq_len"]
v["plan"]["token_slices"] = [L // n] * n
print(json.dumps(v))
PY
    "$bin" simulate "$tmp/u.json" --json >"$tmp/r.json"
    python3 - "$tmp/r.json" "$tmp/opt.json" "$n" "$(basename "$f" .json)" >>"$here/uniform.csv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); o = json.load(open(sys.argv[2]))
print(f"{sys.argv[4]},{sys.argv[3]},{r['iteration_s']:.4f},{o['iteration_s']:.4f}")
PY
  done
done

"$bin" plot "$here/settings.csv" --y published_without_s,published_with_s,simulated_without_s,simulated_with_s \
  --title "TeraPipe: iteration latency without and with token slicing" --y-label "seconds" --out "$here/settings.png"
"$bin" plot "$here/seq_len.csv" --lines --y speedup --title "GPT-3 13B, 40 x 8 V100: speedup of token slicing vs sequence length" \
  --y-label "speedup" --out "$here/seq_len.png"
python3 - "$here/uniform.csv" "$tmp" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for model in sorted({r["model"] for r in rows}):
    with open(f"{sys.argv[2]}/{model}.csv", "w") as f:
        f.write("slices,uniform_s,optimised_s\n")
        for r in rows:
            if r["model"] == model:
                f.write(f"{r['slices']},{r['uniform_s']},{r['optimised_s']}\n")
PY
for m in setting6-gpt3-44b setting9-gpt3-175b; do
  "$bin" plot "$tmp/$m.csv" --lines --y uniform_s,optimised_s --title "$m: uniform slices vs the optimiser" \
    --y-label "seconds per iteration" --out "$here/uniform-$m.png"
done
cat "$here/settings.csv" "$here/published_schemes.csv" "$here/heldout_predictions.csv" "$here/seq_len.csv" "$here/uniform.csv"
