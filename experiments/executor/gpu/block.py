#!/usr/bin/env python3
"""Two measurements through eager PyTorch on the GPU at hand, written as one JSON file.

1. A GPT block's training step: a stack of pre-LayerNorm blocks (fused QKV, causal
   scaled_dot_product_attention with PyTorch's default backend, output projection, GeLU MLP of
   4 x the width, no biases, no dropout) in bf16, forward and backward, timed per layer at
   several widths, sequence lengths and batch sizes. `tests/gpu_microbench.rs` compares it
   with what trainsim charges one layer of the same shape.
2. A Llama block's training step, as torchtitan writes it (RMSNorm, a GEMM per q/k/v projection
   with grouped key-value heads, rotary embeddings through complex multiplication, repeat_kv,
   causal SDPA, SwiGLU MLP), eager and under torch.compile per block, at Llama 3 8B's width.
3. Sustained GEMM rates: back-to-back 8192-cubed bf16 and fp8 products for many seconds, the
   rate of each half second beside the SM clock, power and temperature nvidia-smi reads, to
   see how far a GPU at its power limit falls below a short burst's rate; with
   `--only-sustained`, the bf16 GEMMs and causal attention forward and backward (cuDNN's and
   FlashAttention-2 through SDPA, 8,192 tokens, head dimension 128) alone.

    python3 block.py OUT.json [--seconds S] [--only-titan-norm | --only-sustained | --only-kempnerforge]

4. With `--only-kempnerforge`: one tensor-parallel rank's share of KempnerForge's Llama-3 7B,
   13B and 70B blocks (TP 4, 4,096 tokens, its local batches), eager and compiled, with and
   without full activation checkpointing, and the memory the device holds outside PyTorch's
   allocator. `--dry-run` runs those rows at toy sizes on the CPU.
"""
import json
import subprocess
import sys
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# `--dry-run` runs the KempnerForge rows at toy sizes on the CPU, to check the script without a GPU.
DEVICE = "cpu" if "--dry-run" in sys.argv else "cuda"


def max_memory_allocated():
    return torch.cuda.max_memory_allocated() if DEVICE == "cuda" else 0


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


def rope_freqs(head_dim, seq, theta=500000.0):
    """Llama 3's rotary angles as unit complex numbers, one row per position (on the GPU)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles).to("cuda")


def apply_rope(x, freqs_cis):
    """torchtitan's apply_rotary_emb on one (batch, seq, heads, head_dim) tensor: fp32 copy,
    complex multiply, cast back."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    f = freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, xc.shape[-1])
    return torch.view_as_real(xc * f).flatten(3).type_as(x)


class TitanRMSNorm(nn.Module):
    """torchtitan's own RMSNorm (models/norms.py at 9dec370, norm_type "rmsnorm" in its Llama 3
    configs): x.float(), pow, mean, rsqrt multiply, type_as and the weight multiply as separate
    eager kernels. PyTorch's nn.RMSNorm, which later torchtitan versions build, may run fused."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class LlamaBlock(nn.Module):
    """torchtitan's Llama 3 TransformerBlock (models/llama/model.py at 9dec370, December 2024):
    pre-RMSNorm, wq/wk/wv/wo without bias, rotary embeddings applied in fp32 complex numbers,
    key-value heads repeated to the query heads, causal SDPA, w2(silu(w1 x) * w3 x)."""

    def __init__(self, h, heads, kv_heads, ffn, seq, norm="nn"):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, h // heads
        make = (lambda: nn.RMSNorm(h, eps=1e-5)) if norm == "nn" else (lambda: TitanRMSNorm(h))
        self.attention_norm, self.ffn_norm = make(), make()
        self.wq = nn.Linear(h, h, bias=False)
        self.wk = nn.Linear(h, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(h, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(h, h, bias=False)
        self.w1 = nn.Linear(h, ffn, bias=False)
        self.w3 = nn.Linear(h, ffn, bias=False)
        self.w2 = nn.Linear(ffn, h, bias=False)
        # A plain attribute, not a buffer: Module.to(bfloat16) would drop a buffer's imaginary part.
        self.freqs_cis = rope_freqs(self.hd, seq)

    def rope(self, x):
        return apply_rope(x, self.freqs_cis)

    def repeat_kv(self, x):
        b, s, kv, d = x.shape
        rep = self.heads // kv
        return x[:, :, :, None, :].expand(b, s, kv, rep, d).reshape(b, s, kv * rep, d)

    def forward(self, x):
        b, s, h = x.shape
        y = self.attention_norm(x)
        q = self.wq(y).view(b, s, self.heads, self.hd)
        k = self.wk(y).view(b, s, self.kv_heads, self.hd)
        v = self.wv(y).view(b, s, self.kv_heads, self.hd)
        q, k = self.rope(q), self.rope(k)
        k, v = self.repeat_kv(k), self.repeat_kv(v)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(a.transpose(1, 2).contiguous().view(b, s, h))
        y = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def finish(rows, row):
    """Frees the row's tensors' cached memory, restarts the peak count, keeps and prints the row."""
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    rows.append(row)
    print(row, flush=True)


def time_stack(model, x, g, warmup, reps):
    """Median seconds of a forward-backward step and of a forward alone (CUDA events)."""
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
    if DEVICE == "cpu":  # --dry-run: wall-clock times
        times, ftimes = [], []
        for fn, out in [(step, times), (fwd, ftimes)]:
            for _ in range(reps):
                s = time.perf_counter()
                fn()
                out.append(time.perf_counter() - s)
        return sorted(times)[reps // 2], sorted(ftimes)[reps // 2]
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
    return times[len(times) // 2], ftimes[len(ftimes) // 2]


def llama_steps(warmup=3, reps=10, compile_budget_s=240.0, only_norm=None):
    """Llama blocks at Llama 3 8B's width (4,096, 32 heads, 8 key-value heads, SwiGLU of 14,336):
    8k tokens at batch 1 and 2 (torchtitan's 8B benchmark runs 2 x 8,192 a GPU), and 32k tokens,
    eager; the 8k rows again with each block under torch.compile(fullgraph=True), as torchtitan's
    apply_compile does (forward and backward graphs compiled by Inductor). Norms: PyTorch's
    nn.RMSNorm ("nn") or torchtitan's December 2024 class ("torchtitan", TitanRMSNorm)."""
    rows = []
    t0 = time.time()
    cases = [(False, "nn", 8192, 1, 4), (False, "nn", 8192, 2, 4), (False, "nn", 32768, 1, 2),
             (True, "nn", 8192, 1, 4), (True, "nn", 8192, 2, 4),
             (False, "torchtitan", 8192, 1, 4), (False, "torchtitan", 8192, 2, 4), (True, "torchtitan", 8192, 2, 4)]
    if only_norm:
        cases = [c for c in cases if c[1] == only_norm]
    for compiled, norm, seq, batch, layers in cases:
        row = {"model": "llama", "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
               "seq": seq, "batch": batch, "layers": layers, "compiled": compiled, "norm": norm}
        if compiled and time.time() - t0 > compile_budget_s:
            row["error"] = "skipped: compile budget spent"
            rows.append(row)
            continue
        try:
            blocks = [LlamaBlock(4096, 32, 8, 14336, seq, norm) for _ in range(layers)]
            model = nn.Sequential(*blocks).to("cuda", torch.bfloat16)
            if compiled:
                for i, blk in enumerate(blocks):
                    model[i] = torch.compile(blk, fullgraph=True)
            x = torch.randn(batch, seq, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            g = torch.randn(batch, seq, 4096, device="cuda", dtype=torch.bfloat16)
            s = time.time()
            step_s, fwd_s = time_stack(model, x, g, warmup, reps)
            row.update({"step_s": step_s, "per_layer_s": step_s / layers, "forward_per_layer_s": fwd_s / layers,
                        "peak_memory_bytes": torch.cuda.max_memory_allocated(), "wall_s": time.time() - s})
            del model, blocks, x, g
        except Exception as e:
            row["error"] = repr(e)[:300]
        finish(rows, row)
    return rows


def rope_half(x, cos, sin):
    """KempnerForge's real-valued rotary embeddings: the head dimension's halves rotated as
    (x1 cos - x2 sin, x2 cos + x1 sin), in the activations' dtype."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class ShardBlock(nn.Module):
    """What one rank of a `tp`-way tensor-parallel Llama block computes: its column-parallel
    q/k/v and gate/up shards (heads/tp query heads, kv_heads/tp key-value heads, ffn/tp), its
    row-parallel o and down shards, nn.RMSNorm over every token (no sequence parallelism: the
    norms' share of the step is small) and KempnerForge's real-valued rotary embeddings, the
    key-value heads repeated before causal SDPA. The collectives are left out."""

    def __init__(self, h, heads, kv_heads, ffn, seq, tp):
        super().__init__()
        self.hd = h // heads
        self.heads, self.kv_heads = heads // tp, kv_heads // tp
        self.attention_norm, self.ffn_norm = nn.RMSNorm(h, eps=1e-5), nn.RMSNorm(h, eps=1e-5)
        self.wq = nn.Linear(h, self.heads * self.hd, bias=False)
        self.wk = nn.Linear(h, self.kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(h, self.kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(self.heads * self.hd, h, bias=False)
        self.w1 = nn.Linear(h, ffn // tp, bias=False)
        self.w3 = nn.Linear(h, ffn // tp, bias=False)
        self.w2 = nn.Linear(ffn // tp, h, bias=False)
        freqs = 1.0 / (500000.0 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        angles = torch.outer(torch.arange(seq).float(), freqs).view(1, seq, 1, self.hd // 2)
        self.cos, self.sin = angles.cos().to(DEVICE, torch.bfloat16), angles.sin().to(DEVICE, torch.bfloat16)

    def forward(self, x):
        b, s, _ = x.shape
        y = self.attention_norm(x)
        q = rope_half(self.wq(y).view(b, s, self.heads, self.hd), self.cos, self.sin)
        k = rope_half(self.wk(y).view(b, s, self.kv_heads, self.hd), self.cos, self.sin)
        v = self.wv(y).view(b, s, self.kv_heads, self.hd)
        rep = self.heads // self.kv_heads
        k = k[:, :, :, None, :].expand(b, s, self.kv_heads, rep, self.hd).reshape(b, s, self.heads, self.hd)
        v = v[:, :, :, None, :].expand(b, s, self.kv_heads, rep, self.hd).reshape(b, s, self.heads, self.hd)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, self.heads * self.hd))
        y = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Checkpointed(nn.Module):
    """A block under full activation checkpointing (non-reentrant), as KempnerForge wraps each.
    `early_stop` False turns off the recomputation's early stop (PyTorch stops recomputing once
    every tensor the backward needs is back), so that the whole forward is recomputed."""

    def __init__(self, inner, early_stop=True):
        super().__init__()
        self.inner, self.early_stop = inner, early_stop

    def forward(self, x):
        if self.early_stop:
            return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)
        with torch.utils.checkpoint.set_checkpoint_early_stop(False):
            return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)


# KempnerForge's Llama-3 shapes (hidden, heads, key-value heads, SwiGLU width) and the local
# batch its TP 4 runs took (data/kempnerforge_h200.json).
KEMPNERFORGE = {"70b": (8192, 64, 8, 28672, 2), "13b": (5120, 40, 8, 17920, 4), "7b": (4096, 32, 8, 14336, 4)}


# (shape, tp, compiled, checkpointed, early stop): eager checkpointing with PyTorch's early stop
# and without it, beside the same shapes unchecked, measured together.
EARLY_STOP_CASES = [("70b", 4, False, True, False), ("70b", 4, False, True, True), ("70b", 4, False, False),
                    ("13b", 4, False, True, False), ("13b", 4, False, True, True), ("13b", 4, False, False),
                    ("7b", 4, False, True, False), ("7b", 4, False, True, True), ("7b", 4, False, False),
                    ("7b", 4, True, False)]


def kempnerforge_steps(layers=2, warmup=3, reps=8, seq=4096, compile_budget_s=200.0, cases=None):
    """One tensor-parallel rank's share of KempnerForge's blocks (ShardBlock), 4,096 tokens a
    sequence: eager and compiled per block (torch.compile(fullgraph=True), Dynamo reset before
    each compiled row so that no shape is made dynamic), with and without full activation
    checkpointing, so that the recomputation's cost is measured beside the step's."""
    import torch.utils.checkpoint  # noqa: F401
    cases = cases or [("70b", 4, False, False), ("70b", 4, True, False), ("70b", 4, True, True),
                      ("70b", 4, False, True), ("13b", 4, False, False), ("13b", 4, True, True),
                      ("7b", 4, True, True), ("13b", 4, True, False), ("70b", 1, False, False)]
    rows, t0 = [], time.time()
    for model_name, tp, compiled, ckpt, *rest in cases:
        early_stop = rest[0] if rest else True
        h, heads, kv, ffn, batch = KEMPNERFORGE[model_name]
        row = {"model": "llama", "shape": model_name, "hidden": h, "heads": heads, "kv_heads": kv,
               "ffn_hidden": ffn, "tp": tp, "seq": seq, "batch": batch, "layers": layers,
               "compiled": compiled, "checkpoint": ckpt, "norm": "nn", "rope": "real"}
        if ckpt:
            row["early_stop"] = early_stop
        if compiled and time.time() - t0 > compile_budget_s:
            row["error"] = "skipped: compile budget spent"
            finish(rows, row)
            continue
        try:
            if compiled:
                torch._dynamo.reset()
            blocks = []
            for _ in range(layers):
                blk = ShardBlock(h, heads, kv, ffn, seq, tp).to(DEVICE, torch.bfloat16)
                blk = Checkpointed(blk, early_stop) if ckpt else blk
                blocks.append(torch.compile(blk, fullgraph=True) if compiled else blk)
            model = nn.Sequential(*blocks)
            x = torch.randn(batch, seq, h, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
            g = torch.randn(batch, seq, h, device=DEVICE, dtype=torch.bfloat16)
            s = time.time()
            step_s, fwd_s = time_stack(model, x, g, warmup, reps)
            row.update({"step_s": step_s, "per_layer_s": step_s / layers, "forward_per_layer_s": fwd_s / layers,
                        "peak_memory_bytes": max_memory_allocated(), "wall_s": time.time() - s})
            del model, blocks, x, g
        except Exception as e:
            row["error"] = repr(e)[:300]
        finish(rows, row)
    return rows


def kernel_profile(shape="7b", tp=4, seq=4096, layers=2, steps=2):
    """The CUDA kernels of one TP rank's ShardBlock step, eager and compiled (torch.profiler):
    per kernel name, its calls and total time over `steps` steps, largest first."""
    from torch.profiler import ProfilerActivity, profile
    rows = []
    h, heads, kv, ffn, batch = KEMPNERFORGE[shape]
    for compiled in (False, True):
        torch._dynamo.reset()
        blocks = [ShardBlock(h, heads, kv, ffn, seq, tp).to(DEVICE, torch.bfloat16) for _ in range(layers)]
        model = nn.Sequential(*[torch.compile(b, fullgraph=True) if compiled else b for b in blocks])
        x = torch.randn(batch, seq, h, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(batch, seq, h, device=DEVICE, dtype=torch.bfloat16)

        def step():
            for p in model.parameters():
                p.grad = None
            x.grad = None
            model(x).backward(g)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        kernels = [{"name": e.key[:160], "calls": e.count, "total_s": e.device_time_total * 1e-6}
                   for e in prof.key_averages() if e.device_time_total > 0]
        kernels.sort(key=lambda k: -k["total_s"])
        row = {"shape": shape, "tp": tp, "seq": seq, "batch": batch, "layers": layers, "steps": steps,
               "compiled": compiled, "kernels": kernels[:60], "kernel_count": len(kernels)}
        print({k: v for k, v in row.items() if k != "kernels"}, [(k["name"][:50], k["calls"], round(k["total_s"] * 1e3, 3)) for k in kernels[:25]], flush=True)
        rows.append(row)
        del model, blocks, x, g
    return rows


def overhead():
    """What the device holds beyond PyTorch's allocator (the CUDA context, cuBLAS's and cuDNN's
    handles and workspaces): the driver's used memory less the allocator's reserve, after
    initialisation, after a bf16 GEMM and after a cuDNN SDPA forward and backward."""
    def reading(what):
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        used, reserved = total - free, torch.cuda.memory_reserved()
        return {"after": what, "used_bytes": used, "reserved_bytes": reserved, "outside_allocator_bytes": used - reserved}
    rows = [reading("init")]
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    rows.append(reading("bf16 GEMM"))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(1, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    rows.append(reading("cuDNN SDPA forward and backward"))
    print(rows, flush=True)
    return rows


def block_steps(layers=4, warmup=3, reps=10):
    rows = []
    for h, heads, seq, batch in [(1024, 16, 1024, 16), (2048, 16, 2048, 8), (4096, 32, 4096, 2),
                                 (8192, 64, 2048, 1), (4096, 32, 16384, 1)]:
        row = {"hidden": h, "heads": heads, "seq": seq, "batch": batch, "layers": layers}
        try:
            model = nn.Sequential(*[Block(h, heads) for _ in range(layers)]).to("cuda", torch.bfloat16)
            x = torch.randn(batch, seq, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            g = torch.randn(batch, seq, h, device="cuda", dtype=torch.bfloat16)
            step_s, fwd_s = time_stack(model, x, g, warmup, reps)
            row.update({"step_s": step_s, "per_layer_s": step_s / layers, "forward_per_layer_s": fwd_s / layers,
                        "peak_memory_bytes": torch.cuda.max_memory_allocated()})
            del model, x, g
        except Exception as e:
            row["error"] = repr(e)[:300]
        finish(rows, row)
    return rows


def sustained(kind, seconds):
    """Rates of back-to-back 8192^3 products (or, for the "sdpa" kinds, causal attention
    forward and backward over 2 x 32 heads x 8,192 tokens x 128) in half-second windows, with
    nvidia-smi samples."""
    n = 8192
    if kind.startswith("sdpa"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        q, k, v = (torch.randn(2, 32, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        g = torch.randn(2, 32, n, 128, device="cuda", dtype=torch.bfloat16)
        backend = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}[kind]

        def mm():
            with sdpa_kernel([backend]):
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(g)
            q.grad = k.grad = v.grad = None
        # Forward 4 x B x H x S^2 x d, backward 2.5 times that, half of it under the mask.
        flops = 3.5 * 4.0 * 2 * 32 * n * n * 128 / 2
    elif kind == "bf16":
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
    if not kind.startswith("sdpa"):
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
    shape = [2, 32, n, 128] if kind.startswith("sdpa") else [n, n, n]
    return {"kind": kind, "shape": shape, "products_per_window": per_window, "windows": windows,
            "nvidia_smi": samples}


def main():
    out = sys.argv[1]
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 20.0
    torch.manual_seed(0)
    res = {"schema": "trainsim-gpu-block/1", "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
           "cuda": torch.version.cuda, "created": time.strftime("%Y-%m-%d"),
           "method": "CUDA-event medians of 10 steps after 3 warm-ups; gradients set to None before each step"}
    sections = [("block", block_steps), ("sustained_bf16", lambda: sustained("bf16", seconds)),
                ("sustained_fp8", lambda: sustained("fp8", seconds)), ("llama", llama_steps)]
    if "--only-titan-norm" in sys.argv:  # the Llama rows with torchtitan's RMSNorm alone
        sections = [("llama", lambda: llama_steps(only_norm="torchtitan"))]
    if "--only-kempnerforge" in sys.argv:  # one TP rank's share of KempnerForge's blocks
        sections = [("kempnerforge", kempnerforge_steps), ("overhead", overhead)]
    if "--only-profile" in sys.argv:  # the 7B shard's kernels, eager and compiled
        sections = [("profile", kernel_profile)]
    if "--only-overhead" in sys.argv:  # in a fresh process
        sections = [("overhead", overhead)]
    if "--only-early-stop" in sys.argv:  # eager rows, checkpointing with and without early stop
        sections = [("early_stop", lambda: kempnerforge_steps(cases=EARLY_STOP_CASES))]
    if "--dry-run" in sys.argv:  # toy shapes on the CPU, compiled rows included
        KEMPNERFORGE.update({"70b": (256, 8, 4, 512, 2), "13b": (192, 8, 4, 384, 2), "7b": (128, 4, 4, 256, 2)})
        sections = [("kempnerforge", lambda: kempnerforge_steps(seq=64, warmup=1, reps=2,
                                                              cases=EARLY_STOP_CASES[:3] + [("7b", 4, True, True)]))]
    if "--only-sustained" in sys.argv:  # GEMMs and attention held for `seconds` each
        sections = [(f"sustained_{k}", lambda k=k: sustained(k, seconds)) for k in ("bf16", "sdpa_cudnn", "sdpa_flash")]
    for name, fn in sections:
        s = time.time()
        try:
            res[name] = fn()
        except Exception as e:
            res[name + "_error"] = repr(e)[:500]
        print(f"{name}: {time.time() - s:.1f} s", flush=True)
        json.dump(res, open(out, "w"), indent=1)  # after each section, so a run cut short keeps the rest
    for k in ["sustained_bf16", "sustained_fp8", "sustained_sdpa_cudnn", "sustained_sdpa_flash"]:
        w = res.get(k, {}).get("windows", [])
        if w:
            first, last = w[0]["tflops"], sum(x["tflops"] for x in w[-5:]) / len(w[-5:])
            print(f"{k}: first window {first:.0f} TFLOP/s, last five {last:.0f}")


if __name__ == "__main__":
    main()
