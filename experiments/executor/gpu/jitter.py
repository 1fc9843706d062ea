#!/usr/bin/env python3
"""How much one kernel's time varies from launch to launch on the GPU at hand, and whether
consecutive launches vary together (what `simulation.kernel_jitter` describes).

Each kernel runs back to back many times on one stream with a CUDA event between consecutive
launches, so every launch's own time is read without the GPU ever waiting for Python. Per
kernel the file keeps every time, and the summary: mean, standard deviation, its ratio to the
mean (the launch-to-launch relative spread), percentiles, the lag-1 autocorrelation, and the
relative spread of sums of 10 and 100 consecutive launches beside what independent launches
would give (the single-launch spread over sqrt(10) and sqrt(100)): a larger one says the
launches drift together (clock and power), not independently.

    python3 jitter.py OUT.json [--launches N] [--dry-run | --steady]

With `--steady`: 10 s of 8192-cubed GEMMs and of cuDNN attention after 10 s of the same load
(the power limit settled), each launch timed alone; and GEMMs with a ~10 ms single-block spin
after every 20 (most SMs idle, as while a collective runs), after 5 s.
"""
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

DRY = "--dry-run" in sys.argv
DEVICE = "cpu" if DRY else "cuda"


def kernels():
    """(name, nominal description, callable) at transformer shapes, bf16."""
    bf = torch.bfloat16
    s = 1 if not DRY else 16  # --dry-run: toy sizes
    a = torch.randn(8192 // s, 8192 // s, device=DEVICE, dtype=bf)
    b = torch.randn(8192 // s, 8192 // s, device=DEVICE, dtype=bf)
    c = torch.randn(4096 // s, 4096 // s, device=DEVICE, dtype=bf)
    x = torch.randn(8192 // s, 4096 // s, device=DEVICE, dtype=bf)
    w = torch.randn(1024 // s, 4096 // s, device=DEVICE, dtype=bf)
    q, k, v = (torch.randn(2, 32, 4096 // s, 128, device=DEVICE, dtype=bf, requires_grad=True) for _ in range(3))
    g = torch.randn(2, 32, 4096 // s, 128, device=DEVICE, dtype=bf)
    n = torch.randn(16384 // s, 8192 // s, device=DEVICE, dtype=bf)
    norm = torch.nn.RMSNorm(8192 // s, device=DEVICE, dtype=bf)
    e1 = torch.randn(2**27 // s**2, device=DEVICE, dtype=bf)
    e2 = torch.randn(2**27 // s**2, device=DEVICE, dtype=bf)

    def sdpa():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(g)
        q.grad = k.grad = v.grad = None

    return [("gemm 8192x8192x8192", lambda: a @ b), ("gemm 4096x4096x4096", lambda: c @ c),
            ("gemm 8192x1024x4096", lambda: F.linear(x, w)), ("sdpa fwd+bwd 2x32x4096x128 causal", sdpa),
            ("rmsnorm 16384x8192", lambda: norm(n)), ("add 2^27", lambda: e1 + e2)]


def times(fn, launches):
    """Each of `launches` back-to-back calls' seconds (CUDA events between them)."""
    for _ in range(20):
        fn()
    if DRY:
        out = []
        for _ in range(launches):
            s = time.perf_counter()
            fn()
            out.append(time.perf_counter() - s)
        return out
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(launches + 1)]
    events[0].record()
    for i in range(launches):
        fn()
        events[i + 1].record()
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) * 1e-3 for i in range(launches)]


def steady(fn, warm_s, record_s, gap_every=0, gap_cycles=0):
    """Per-launch seconds of `fn` over `record_s` after `warm_s` of the same load; with
    `gap_every`, a single-block spin of `gap_cycles` clock cycles (torch.cuda._sleep: one SM
    busy, the rest idle, as beside a collective) after every `gap_every` launches."""
    s = time.time()
    while time.time() - s < warm_s:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
    # Launches that fill record_s, from a timed batch.
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(50):
        fn()
    e1.record()
    e1.synchronize()
    per = e0.elapsed_time(e1) * 1e-3 / 50
    launches = int(record_s / per)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(launches)]
    for i, (a, b) in enumerate(events):
        a.record()
        fn()
        b.record()
        if gap_every and (i + 1) % gap_every == 0:
            torch.cuda._sleep(gap_cycles)
    events[-1][1].synchronize()
    return [a.elapsed_time(b) * 1e-3 for a, b in events]


def summary(t):
    n = len(t)
    mean = sum(t) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in t) / (n - 1))
    lag1 = sum((t[i] - mean) * (t[i + 1] - mean) for i in range(n - 1)) / ((n - 1) * sd * sd) if sd > 0 else 0.0
    srt = sorted(t)
    out = {"launches": n, "mean_s": mean, "sd_s": sd, "cv": sd / mean, "lag1_autocorrelation": lag1,
           "p01_s": srt[n // 100], "p50_s": srt[n // 2], "p99_s": srt[(99 * n) // 100], "max_s": srt[-1]}
    for m in (10, 100):
        sums = [sum(t[i:i + m]) for i in range(0, n - m + 1, m)]
        if len(sums) > 2:
            ms = sum(sums) / len(sums)
            out[f"cv_of_{m}"] = math.sqrt(sum((x - ms) ** 2 for x in sums) / (len(sums) - 1)) / ms
            out[f"cv_of_{m}_if_independent"] = out["cv"] / math.sqrt(m)
    return out


def main():
    out = sys.argv[1]
    launches = int(sys.argv[sys.argv.index("--launches") + 1]) if "--launches" in sys.argv else 2000
    torch.manual_seed(0)
    res = {"schema": "trainsim-gpu-jitter/1", "device": "cpu" if DRY else torch.cuda.get_device_name(0),
           "torch": torch.__version__, "created": time.strftime("%Y-%m-%d"),
           "method": f"{launches} back-to-back launches per kernel after 20 warm-ups, a CUDA event between "
                     "consecutive launches; two passes over the kernels", "kernels": []}
    if "--steady" in sys.argv:  # the same kernels' spread once the power limit has settled
        ks = dict(kernels())
        cases = [("gemm 8192x8192x8192", 10, 10, 0), ("sdpa fwd+bwd 2x32x4096x128 causal", 10, 10, 0),
                 ("gemm 8192x8192x8192", 5, 10, 20)]
        for name, warm, rec, gap in cases:
            t = steady(ks[name], warm, rec, gap, 20_000_000 if gap else 0)
            row = {"kernel": name, "steady": True, "warm_s": warm, "gap_every": gap,
                   "gap_cycles": 20_000_000 if gap else 0, **summary(t), "times_s": [round(x, 9) for x in t]}
            res["kernels"].append(row)
            print({k: v for k, v in row.items() if k != "times_s"}, flush=True)
            json.dump(res, open(out, "w"))
        return
    for p in range(2):
        for name, fn in kernels():
            t = times(fn, launches)
            row = {"kernel": name, "pass": p, **summary(t), "times_s": [round(x, 9) for x in t]}
            res["kernels"].append(row)
            print({k: v for k, v in row.items() if k != "times_s"}, flush=True)
            json.dump(res, open(out, "w"))


if __name__ == "__main__":
    main()
