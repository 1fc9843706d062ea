#!/usr/bin/env python3
"""Predict every A100 record of data/fsdp_llmfoundry_a100.json (MosaicML llm-foundry, PyTorch
FSDP; the file names its source) with a chosen attention kernel, and print predicted against
measured MFU (llm-foundry's definition, as the suite compares it): the ablation behind the
README's attention tables. The scenario of each record is
the validation suite's own (`fsdp_scenario` in experiments/validation/run), so the two agree.

Usage, from the repository root after cargo build --release:
    experiments/validation/fsdp_a100.py flash1-triton   # or: naive, flash, flash2, triton, ...
    TRAINSIM=/path/to/trainsim experiments/validation/fsdp_a100.py flash   # another binary
"""
import importlib.machinery, importlib.util, json, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
loader = importlib.machinery.SourceFileLoader('validation_run', os.path.join(HERE, 'run'))
spec = importlib.util.spec_from_loader('validation_run', loader)
run = importlib.util.module_from_spec(spec)
loader.exec_module(run)

tmp = os.path.join(tempfile.mkdtemp(), "s.json")
binary = os.environ.get('TRAINSIM', 'target/release/trainsim')
attn = sys.argv[1] if len(sys.argv) > 1 else 'flash1-triton'
errs = []
for r in run.load('data/fsdp_llmfoundry_a100.json')['records']:
    open(tmp, 'w').write(json.dumps(run.fsdp_scenario(r, attn)))
    p = subprocess.run([binary, 'simulate', tmp, '--json'], capture_output=True, text=True)
    if p.returncode != 0:
        print(run.fsdp_id(r), 'ERR', p.stderr[:150])
        continue
    o = json.loads(p.stdout)
    mfu = run.fsdp_mfu(r, o)
    e = (mfu - r['MFU']) / r['MFU']
    errs.append(abs(e))
    print(f"{run.fsdp_id(r):32} {r['GPU']} measured {r['MFU']:5.1f}% predicted {mfu:5.1f}% "
          f"err {e * 100:+5.1f}% fits={o['fits']}")
print(f"mean abs err {100 * sum(errs) / len(errs):.1f}% over {len(errs)} records")
