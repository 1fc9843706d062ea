#!/usr/bin/env python3
"""Predict every A100 record of data/fsdp_llmfoundry_a100.json (MosaicML llm-foundry, PyTorch
FSDP; the file names its source) and print predicted against measured MFU.

Usage, from the repository root after cargo build --release:
    experiments/validation/fsdp_a100.py flash    # or: naive, triton, flash2, ... (training.attention)
    TRAINSIM=/path/to/trainsim experiments/validation/fsdp_a100.py flash   # another binary

Model shapes (layers, d_model, n_heads) are llm-foundry's scripts/train/yamls/pretrain/mpt-*.yaml
(scripts/train/yamls/mpt/*.yaml at 5f43bf160, when the A100 table was published): head
dimension 64 for 125m and 350m, 128 for the rest (760m, 1b and 3b were "modified so that
d_head == 128 to satisfy FlashAttention"). The yamls of that time set attn_impl: triton
(MosaicML's Triton FlashAttention).
"""
import json, os, subprocess, sys, tempfile
tmp = os.path.join(tempfile.mkdtemp(), "s.json")
recs=json.load(open(os.path.join(os.path.dirname(__file__), 'data', 'fsdp_llmfoundry_a100.json')))['records']
cfg={'125m':(12,768,12),'350m':(24,1024,16),'760m':(24,1536,12),'1b':(24,2048,16),'3b':(32,2560,20),'7b':(32,4096,32),'13b':(40,5120,40),'30b':(48,7168,56),'70b':(80,8192,64)}
binary=os.environ.get('TRAINSIM','target/release/trainsim')
attn=sys.argv[1]
errs=[]
for r in recs:
    m=r['Model']
    if m not in cfg: continue
    L,h,heads=cfg[m]
    g=r['# GPUs']; seq=r['SeqLen (T)']
    sc={"name":f"{m} s{seq} g{g}","workload":{"transformer":{"layers":L,"hidden":h,"heads":heads,"vocab":50368,"bias":False,"dropout":False}},
        "cluster":{"node":"dgx-a100-80gb","nodes":max(1,g//8)} if g>=8 else {"node":{"preset":"dgx-a100-80gb","devices":g},"nodes":1},
        "training":{"global_batch":r['GlobalBatchSize'],"micro_batch":r['MicroBatchSize'],"seq_len":seq,"precision":"bf16","optimizer":"adam","attention":attn,"framework":"pytorch-fsdp"},
        "plan":{"dp":g,"zero_stage":3 if r['Sharding Strategy']=='FULL_SHARD' else 2,"recompute":"full" if r['Activation Checkpointing']=='True' else "none"}}
    open(tmp,'w').write(json.dumps(sc))
    p=subprocess.run([binary,'simulate',tmp,'--json'],capture_output=True,text=True)
    if p.returncode!=0:
        print(m,seq,g,'ERR',p.stderr[:150]); continue
    o=json.loads(p.stdout)
    e=(o['mfu']*100-r['MFU'])/r['MFU']
    errs.append(abs(e))
    print(f"{m:5} s{seq:6} g{g:3} mb{r['MicroBatchSize']:3} {r['Sharding Strategy'][:9]} ckpt={r['Activation Checkpointing'][0]} measured {r['MFU']:5.1f}% predicted {o['mfu']*100:5.1f}% err {e*100:+5.1f}% fits={o['fits']}")
print('mean abs err', sum(errs)/len(errs), 'n', len(errs))
