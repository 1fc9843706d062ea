#!/usr/bin/env python3
"""Kernel microbenchmarks through PyTorch on the GPU at hand, written as one JSON file.

What a framework running on this GPU gets from its libraries: cuBLAS GEMMs at transformer
shapes (nn.Linear's layout), scaled_dot_product_attention per backend (FlashAttention-2,
cuDNN, memory-efficient, and whatever PyTorch picks by default) over sequence length (512-32k), head
dimension and causality, fp8 GEMMs (torch._scaled_mm) with the eager cost of a dynamic
cast, and the memory-bound ops (copy, LayerNorm, softmax, GeLU, dropout, fused AdamW). Times are CUDA-event medians after warm-ups, on random data.

    python3 microbench.py OUT.json [--quick] [--only SECTION,...]

scripts/validate-gpu runs it; trainsim's predictions for the same shapes are compared in
tests/gpu_microbench.rs against the committed file.
"""
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

WARMUP, REPS = 3, 10


def timed(fn, warmup=WARMUP, reps=REPS):
    """Median device time of one fn() in seconds. Each sample brackets enough back-to-back
    calls (about a millisecond of work) with CUDA events that the GPU never waits for the
    host: one call alone between two events would also time Python's dispatch, tens of
    microseconds, which a training step's queued kernels do not pay."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    inner = max(1, min(100, math.ceil(1e-3 / max(a.elapsed_time(b) * 1e-3, 1e-7))))
    times = []
    for _ in range(reps):
        fn()  # queue work ahead, so the first timed call does not start on an idle GPU
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3 / inner)
    times.sort()
    return times[len(times) // 2]


def gemms(quick):
    rows = []
    hs = [1024, 4096] if quick else [1024, 2048, 4096, 8192]
    for tokens in [2048, 8192]:
        for h in hs:
            for n, k in [(3 * h, h), (h, h), (4 * h, h), (h, 4 * h)]:
                x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                t = timed(lambda: F.linear(x, w))
                rows.append({"m": tokens, "n": n, "k": k, "dtype": "bf16", "seconds": t,
                             "tflops": 2 * tokens * n * k / t / 1e12})
                del x, w
    return rows


def fp8_gemms(quick):
    """torch._scaled_mm with e4m3 operands and tensor-wise scales, bf16 out (what torchao's
    Float8 linears call): with and without fast accumulation (torchao uses it for the forward
    output, not for the gradients). And the eager cost of a dynamic cast (amax, scale, cast)."""
    rows = []
    f8 = torch.float8_e4m3fn
    one = torch.tensor(1.0, device="cuda")
    hs = [1024, 4096] if quick else [1024, 2048, 4096, 8192]
    for tokens in [2048, 8192]:
        for h in hs:
            for n, k in [(3 * h, h), (h, h), (4 * h, h), (h, 4 * h)]:
                x = torch.randn(tokens, k, device="cuda").to(f8)
                w = torch.randn(n, k, device="cuda").to(f8)
                for fast in [True, False]:
                    t = timed(lambda: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one,
                                                       out_dtype=torch.bfloat16, use_fast_accum=fast))
                    rows.append({"m": tokens, "n": n, "k": k, "dtype": "fp8_e4m3", "fast_accum": fast,
                                 "seconds": t, "tflops": 2 * tokens * n * k / t / 1e12})
                del x, w
    for m, k in [(8192, 4096), (8192, 8192), (16384, 8192)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

        def cast():
            return (x * (448.0 / x.abs().max().float())).to(f8)
        rows.append({"op": "dynamic_cast", "m": m, "k": k, "seconds": timed(cast),
                     "note": "x.abs().max(), x * scale, .to(float8_e4m3fn): eager, unfused"})
        del x
    return rows


def sdpa_rows(backends, batch, heads, seq, hdim, causal):
    """One row per backend (None: PyTorch's own choice) of SDPA on random bf16 inputs, (batch, heads,
    seq, hdim) as SDPA sees them: forward alone and forward with backward, with the FlashAttention
    benchmarks' FLOP count (4 s^2 d per head forward, halved under a causal mask; backward 2.5x)."""
    from torch.nn.attention import sdpa_kernel
    # Leaves in (batch, seq, heads, hdim), as a projection's output is laid out, handed to SDPA
    # transposed, as models do: the gradients come back in the leaves' own layout. Each
    # backward starts with the gradients cleared (as flash-attn's benchmark_backward does), so
    # the time is the kernels', not an accumulation into the last call's gradients as well
    # (rows without "grads_reset", before session 27, include one: tests/gpu_microbench.rs).
    q, k, v = (torch.randn(batch, seq, heads, hdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(batch, heads, seq, hdim, device="cuda", dtype=torch.bfloat16)
    fwd_flops = 4 * batch * heads * seq * seq * hdim * (0.5 if causal else 1.0)
    rows = []
    for name, be in backends.items():
        def fwd():
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal)

        def fwd_bwd():
            o = fwd()
            q.grad = k.grad = v.grad = None
            o.backward(dout)
        row = {"backend": name, "seq": seq, "hdim": hdim, "heads": heads, "batch": batch,
               "causal": causal, "dtype": "bf16", "grads_reset": True}
        try:
            if be is None:
                tf, tfb = timed(fwd), timed(fwd_bwd)
            else:
                with sdpa_kernel([be]):
                    tf, tfb = timed(fwd), timed(fwd_bwd)
            row.update({"fwd_s": tf, "fwd_bwd_s": tfb, "bwd_s": tfb - tf,
                        "fwd_tflops": fwd_flops / tf / 1e12,
                        "bwd_tflops": 2.5 * fwd_flops / max(tfb - tf, 1e-9) / 1e12})
        except Exception as e:  # a backend that does not take this shape
            row["error"] = str(e).splitlines()[0][:200]
        rows.append(row)
        q.grad = k.grad = v.grad = None
    return rows


def attention(quick):
    from torch.nn.attention import SDPBackend
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "default": None}
    rows = []
    tokens, hidden = 16384, 2048
    seqs = [1024, 4096, 16384] if quick else [512, 1024, 2048, 4096, 8192, 16384, 32768]
    for seq in seqs:
        for hdim in [64, 128]:
            for causal in [False, True]:
                rows += sdpa_rows(backends, max(1, tokens // seq), hidden // hdim, seq, hdim, causal)
    return rows


def attention_hdim():
    """Kernel-selection cliffs: each SDPA backend over head dimensions between its compiled
    templates (64-256, multiples of 8 and 16), 16 heads, batch 4 x 4,096 tokens, causal or not,
    forward and forward with backward. A kernel without a template for a head dimension runs
    the next larger one, doing the padded work for the useful FLOPs."""
    from torch.nn.attention import SDPBackend
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    rows = []
    for hdim in [64, 72, 80, 96, 112, 128, 160, 192, 224, 256]:
        for causal in [False, True]:
            rows += sdpa_rows(backends, 4, 16, 4096, hdim, causal)
    return rows


def memory_ops():
    rows = []
    n = 1 << 28  # 256 M bf16 elements, 512 MiB
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    eb = 2

    def add(name, fn, bytes_moved, **kw):
        t = timed(fn)
        rows.append({"op": name, "seconds": t, "bytes": bytes_moved, "gbps": bytes_moved / t / 1e9, **kw})
    add("copy", lambda: x.clone(), 2 * n * eb)
    for h in [1024, 4096, 8192]:
        w, b = torch.ones(h, device="cuda", dtype=torch.bfloat16), torch.zeros(h, device="cuda", dtype=torch.bfloat16)
        add("layernorm", lambda: F.layer_norm(x.view(-1, h), (h,), w, b), 2 * n * eb, width=h)
    for s in [1024, 4096]:
        add("softmax", lambda: torch.softmax(x.view(-1, s), dim=-1), 2 * n * eb, width=s)
    add("gelu", lambda: F.gelu(x), 2 * n * eb)
    add("gelu_tanh", lambda: F.gelu(x, approximate="tanh"), 2 * n * eb)
    add("dropout", lambda: F.dropout(x, 0.1, training=True), 2 * n * eb + n)
    add("add", lambda: x + r, 3 * n * eb)
    del x, r
    # Fused AdamW on fp32 parameters, gradients and two moments (read 4, write 3 tensors).
    params = 100_000_000
    p = torch.nn.Parameter(torch.randn(params, device="cuda"))
    p.grad = torch.randn(params, device="cuda")
    for fused in [True, False]:
        opt = torch.optim.AdamW([p], lr=1e-4, fused=fused, foreach=None if fused else True)
        add("adamw_fused" if fused else "adamw_foreach", lambda: opt.step(), params * 4 * 7, params=params)
    return rows


def llama_ops():
    """The Llama block's memory-bound pieces as torchtitan ran them in December 2024, eager and
    under torch.compile, at Llama 3 8B's width and 16,384 tokens: its own RMSNorm class (six
    kernels forward) beside PyTorch's nn.RMSNorm, rotary embeddings on the queries (32 heads)
    and keys (8 heads) through fp32 complex numbers, and SwiGLU's silu(a) * b over 14,336
    columns. Forward alone and forward with backward (gradients to every input)."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0] if "/" in __file__ else ".")
    from block import TitanRMSNorm, apply_rope, rope_freqs
    tokens, h, ffn = 16384, 4096, 14336
    rows = []

    def case(name, make_inputs, fn, **kw):
        for compiled in [False, True]:
            f = torch.compile(fn) if compiled else fn
            ins = make_inputs()
            outs = f(*ins)
            outs = outs if isinstance(outs, tuple) else (outs,)
            grads = [torch.randn_like(o) for o in outs]

            def fwd():
                with torch.no_grad():
                    return f(*ins)

            def fwd_bwd():
                for t in ins:
                    t.grad = None
                o = f(*ins)
                torch.autograd.backward(o if isinstance(o, tuple) else (o,), grads)
            row = {"op": name, "compiled": compiled, "tokens": tokens, **kw}
            try:
                tf, tfb = timed(fwd), timed(fwd_bwd)
                row.update({"fwd_s": tf, "fwd_bwd_s": tfb, "bwd_s": tfb - tf})
            except Exception as e:
                row["error"] = str(e).splitlines()[0][:200]
            rows.append(row)
            print(row, flush=True)
            del ins, outs, grads

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    titan = TitanRMSNorm(h).to("cuda", torch.bfloat16)
    native = torch.nn.RMSNorm(h, eps=1e-5).to("cuda", torch.bfloat16)
    case("rmsnorm_torchtitan", lambda: [rand(tokens, h)], titan, width=h)
    case("rmsnorm_nn", lambda: [rand(tokens, h)], native, width=h)
    freqs = rope_freqs(128, tokens)
    case("rope", lambda: [rand(1, tokens, 32, 128), rand(1, tokens, 8, 128)],
         lambda q, k: (apply_rope(q, freqs), apply_rope(k, freqs)), q_heads=32, kv_heads=8, head_dim=128)
    case("swiglu", lambda: [rand(tokens, ffn), rand(tokens, ffn)], lambda a, b: F.silu(a) * b, width=ffn)
    return rows


def main():
    out = sys.argv[1]
    quick = "--quick" in sys.argv
    torch.manual_seed(0)
    p = torch.cuda.get_device_properties(0)
    t0 = time.time()
    res = {
        "schema": "trainsim-gpu-microbench/1",
        "device": torch.cuda.get_device_name(0),
        "multiprocessors": p.multi_processor_count,
        "memory_bytes": p.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "created": time.strftime("%Y-%m-%d"),
        "method": f"CUDA-event median of {REPS} samples after {WARMUP} warm-ups, each sample the mean of back-to-back calls filling about 1 ms (at most 100), random bf16 data",
    }
    sections = [("gemm", lambda: gemms(quick)), ("fp8_gemm", lambda: fp8_gemms(quick)),
                ("attention", lambda: attention(quick)), ("memory", memory_ops), ("llama_ops", llama_ops),
                ("attention_hdim", attention_hdim)]
    if "--only" in sys.argv:
        keep = sys.argv[sys.argv.index("--only") + 1].split(",")
        sections = [s for s in sections if s[0] in keep]
    for name, fn in sections:
        s = time.time()
        try:
            res[name] = fn()
        except Exception as e:
            res[name + "_error"] = repr(e)[:500]
        print(f"{name}: {time.time() - s:.1f} s", flush=True)
    res["wall_s"] = time.time() - t0
    json.dump(res, open(out, "w"), indent=1)
    best = max((r["tflops"] for r in res.get("gemm", [])), default=math.nan)
    print(f"{res['device']}: best GEMM {best:.0f} TFLOP/s; {len(res.get('attention', []))} attention rows")


if __name__ == "__main__":
    main()
