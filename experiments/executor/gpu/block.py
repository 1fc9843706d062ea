#!/usr/bin/env python3
"""Two measurements through eager PyTorch on the GPU at hand, written as one JSON file.

1. A GPT block's training step: a stack of pre-LayerNorm blocks (fused QKV, causal
   scaled_dot_product_attention with PyTorch's default backend, output projection, GeLU MLP of
   4 x the width, no biases, no dropout) in bf16, forward and backward, timed per layer at
   several widths, sequence lengths and batch sizes. `tests/gpu_microbench.rs` compares it
   with what trainsim charges one layer of the same shape.
2. Sustained GEMM rates: back-to-back 8192-cubed bf16 and fp8 products for many seconds, the
   rate of each half second beside the SM clock, power and temperature nvidia-smi reads, to
   see how far a GPU at its power limit falls below a short burst's rate.

    python3 block.py OUT.json [--seconds S]
"""
import json
import subprocess
import sys
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.proj = nn.Linear(h, h, bias=False)
        self.fc1 = nn.Linear(h, 4 * h, bias=False)
        self.fc2 = nn.Linear(4 * h, h, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def block_steps(layers=4, warmup=3, reps=10):
    rows = []
    for h, heads, seq, batch in [(1024, 16, 1024, 16), (2048, 16, 2048, 8), (4096, 32, 4096, 2),
                                 (8192, 64, 2048, 1), (4096, 32, 16384, 1)]:
        row = {"hidden": h, "heads": heads, "seq": seq, "batch": batch, "layers": layers}
        try:
            model = nn.Sequential(*[Block(h, heads) for _ in range(layers)]).to("cuda", torch.bfloat16)
            x = torch.randn(batch, seq, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            g = torch.randn(batch, seq, h, device="cuda", dtype=torch.bfloat16)

            def step():
                for p in model.parameters():
                    p.grad = None
                x.grad = None
                model(x).backward(g)

            def fwd():
                with torch.no_grad():
                    model(x)
            for _ in range(warmup):
                step()
            torch.cuda.synchronize()
            times, ftimes = [], []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                step()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e-3)
                a.record()
                fwd()
                b.record()
                b.synchronize()
                ftimes.append(a.elapsed_time(b) * 1e-3)
            times.sort()
            ftimes.sort()
            row.update({"step_s": times[len(times) // 2], "per_layer_s": times[len(times) // 2] / layers,
                        "forward_per_layer_s": ftimes[len(ftimes) // 2] / layers,
                        "peak_memory_bytes": torch.cuda.max_memory_allocated()})
            del model, x, g
        except Exception as e:
            row["error"] = repr(e)[:300]
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        rows.append(row)
        print(row, flush=True)
    return rows


def sustained(kind, seconds):
    """Rates of back-to-back 8192^3 products in half-second windows, with nvidia-smi samples."""
    n = 8192
    if kind == "bf16":
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

        def mm():
            return a @ b
    else:
        one = torch.tensor(1.0, device="cuda")
        a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)

        def mm():
            return torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)
    flops = 2.0 * n ** 3
    for _ in range(3):
        mm()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        mm()
    e1.record()
    e1.synchronize()
    per_window = max(1, int(0.5 / (e0.elapsed_time(e1) * 1e-3 / 10)))
    samples = []
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "250"],
                           stdout=subprocess.PIPE, text=True)
    t_start = time.time()

    def read():
        for line in smi.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                samples.append({"t": time.time() - t_start, "sm_mhz": float(parts[0]),
                                "power_w": float(parts[1]), "temp_c": float(parts[2])})
            except (ValueError, IndexError):
                pass
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    windows = []
    while time.time() - t_start < seconds:
        e0.record()
        for _ in range(per_window):
            mm()
        e1.record()
        e1.synchronize()
        windows.append({"t": time.time() - t_start,
                        "tflops": flops * per_window / (e0.elapsed_time(e1) * 1e-3) / 1e12})
    smi.terminate()
    reader.join(timeout=2)
    return {"kind": kind, "shape": [n, n, n], "products_per_window": per_window, "windows": windows,
            "nvidia_smi": samples}


def main():
    out = sys.argv[1]
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 20.0
    torch.manual_seed(0)
    res = {"schema": "trainsim-gpu-block/1", "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cuda": torch.version.cuda, "created": time.strftime("%Y-%m-%d"),
           "method": "CUDA-event medians of 10 steps after 3 warm-ups; gradients set to None before each step"}
    for name, fn in [("block", block_steps), ("sustained_bf16", lambda: sustained("bf16", seconds)),
                     ("sustained_fp8", lambda: sustained("fp8", seconds))]:
        s = time.time()
        try:
            res[name] = fn()
        except Exception as e:
            res[name + "_error"] = repr(e)[:500]
        print(f"{name}: {time.time() - s:.1f} s", flush=True)
    json.dump(res, open(out, "w"), indent=1)
    for k in ["sustained_bf16", "sustained_fp8"]:
        w = res.get(k, {}).get("windows", [])
        if w:
            first, last = w[0]["tflops"], sum(x["tflops"] for x in w[-5:]) / len(w[-5:])
            print(f"{k}: first window {first:.0f} TFLOP/s, last five {last:.0f}")


if __name__ == "__main__":
    main()
