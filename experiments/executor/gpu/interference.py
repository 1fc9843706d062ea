#!/usr/bin/env python3
"""What a communication kernel running beside them costs the compute kernels of this GPU.

NCCL runs a collective as one CUDA block per channel, each block resident on its own SM for
the whole collective and streaming every byte it moves through the GPU's memory. One GPU has
no peer to talk to, so this emulates such kernels with side kernels of k blocks of 512 threads
(the block size of NCCL's Simple protocol) on a second stream:

- spin: holds k SMs and touches no memory (the SMs alone);
- copy: 16-byte loads and stores between two 1 GiB buffers (a send's or an all-gather's
  traffic, read where sent and written where it lands);
- reduce: two loads, an add and a store per element (a reduce-scatter's local operand);
- ce: cudaMemcpyAsync device to device, which may take no SMs at all (the copy engines).

Each compute kernel (cuBLAS GEMMs at transformer shapes, SDPA forward and backward, LayerNorm,
an add) is timed alone, then again while one side kernel runs from before its first call to
after its last: the ratio is the slowdown a compute kernel suffers beside a collective. Then
a chunked mode launches the copy as back-to-back ~1 ms kernels on a high-priority stream (as
FSDP2 and Megatron issue their collectives), with an event between chunks, which also gives
the side kernel's own rate under the compute load. With --carveout, cuBLAS is asked to leave
k SMs free (torch._C._set_sm_carveout_experimental) and the GEMMs are timed again.

    python3 interference.py OUT.json [--quick]
    python3 interference.py OUT.json --delays      # second pass: start delays, kernel grids
    python3 interference.py OUT.json --clocks      # third pass: the SM clock with SMs held
    python3 interference.py OUT.json --waves       # fourth pass: GEMMs of 0.5-31 tiles per SM

The fourth pass times bf16 GEMMs of 8,192 x N x 4,096 (N 256 to 16,384: from half a tile to
31 tiles of 256 x 128 per SM) alone and beside a spin kernel holding 8, 16 or 32 SMs, with
each one's cuBLAS kernel and grid: how a persistent GEMM's slowdown depends on its tiles.

The third pass holds k SMs with the clock kernel itself (k blocks counting cycles against the
global timer) beside back-to-back 8192-cubed GEMMs on the other SMs, and reads the board power
(NVML) meanwhile: how the clock of a power-limited GPU answers the SMs left to the GEMMs.

The second pass asks two questions of each compute kernel. Its kernels' grids, registers and
shared memory (torch.profiler): does it keep one persistent block per SM? And how long does a
communication kernel issued at a random moment beside back-to-back calls of it wait before it
runs: its time from issue to end, less its time alone. It also times a fixed number of clock
cycles of the spin kernel beside each compute kernel: the SM clock under that load.

Times are CUDA-event medians of several samples. Nothing here is fitted to a training run.
"""
import json
import math
import sys
import time

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F

THREADS = 512
REPEATS = 5
SIDE_SRC = r"""
extern "C" __global__ void side_spin(long long cycles, int* flag) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
  if (cycles < 0 && threadIdx.x == 0) flag[0] = 1;
}
// The SM clock: cycles counted against the global nanosecond timer, written by block 0.
extern "C" __global__ void side_clock(long long cycles, long long* out) {
  long long g0, g1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
  if (blockIdx.x == 0 && threadIdx.x == 0) { out[0] = g0; out[1] = g1; }
}
// Ping-pong between a and b so that no repetition can be folded away.
extern "C" __global__ void side_copy(int4* a, int4* b, long long n, int reps) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (int r = 0; r < reps; r++) {
    const int4* s = (r & 1) ? b : a;
    int4* d = (r & 1) ? a : b;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) d[i] = s[i];
  }
}
extern "C" __global__ void side_reduce(float4* a, float4* b, float4* c, long long n, int reps) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (int r = 0; r < reps; r++) {
    const float4* x = (r & 1) ? b : a;
    const float4* y = (r & 1) ? c : b;
    float4* d = (r & 1) ? a : c;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
      float4 u = x[i], v = y[i];
      d[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
    }
  }
}
"""


def ev():
    return torch.cuda.Event(enable_timing=True)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


class Side:
    """The side kernels, on their own stream, sized in seconds from their rate alone."""

    def __init__(self, priority=0):
        mod = cp.RawModule(code=SIDE_SRC)
        self.spin_k = mod.get_function("side_spin")
        self.copy_k = mod.get_function("side_copy")
        self.reduce_k = mod.get_function("side_reduce")
        self.clock_k = mod.get_function("side_clock")
        self.stamps = cp.zeros(2, dtype=cp.int64)
        self.stream = torch.cuda.Stream(priority=priority)
        self.cs = cp.cuda.ExternalStream(self.stream.cuda_stream)
        self.gib = 1 << 30
        self.bufs = [cp.empty(self.gib, dtype=cp.uint8) for _ in range(3)]
        for b in self.bufs:
            b.fill(0)
        self.flag = cp.zeros(1, dtype=cp.int32)
        self.rate = {}  # variant -> units per second alone (cycles, or repetitions)
        cp.cuda.Device().synchronize()

    def launch(self, kind, k, units, nbytes=None):
        """Queue `units` of work (clock cycles for spin, repetitions over 1 GiB otherwise; a
        copy over its first `nbytes` alone when given)."""
        with self.cs:
            if kind == "spin":
                self.spin_k((k,), (THREADS,), (np.int64(units), self.flag))
            elif kind == "copy":
                n = (nbytes or self.gib) // 16
                self.copy_k((k,), (THREADS,), (self.bufs[0], self.bufs[1], np.int64(n), np.int32(units)))
            elif kind == "reduce":
                self.reduce_k((k,), (THREADS,), (self.bufs[0], self.bufs[1], self.bufs[2],
                                                 np.int64(self.gib // 16), np.int32(units)))
            elif kind == "ce":
                for r in range(units):
                    s, d = (self.bufs[0], self.bufs[1]) if r % 2 == 0 else (self.bufs[1], self.bufs[0])
                    cp.cuda.runtime.memcpyAsync(d.data.ptr, s.data.ptr, self.gib,
                                                cp.cuda.runtime.memcpyDeviceToDevice, self.cs.ptr)
            else:
                raise ValueError(kind)

    def bytes_per_unit(self, kind):
        """Bytes read and written per unit of work (spin: none)."""
        return {"spin": 0, "copy": 2 * self.gib, "reduce": 3 * self.gib, "ce": 2 * self.gib}[kind]

    def measure_alone(self, kind, k):
        """Units per second of this variant alone on the GPU."""
        units = 20_000_000 if kind == "spin" else 2
        torch.cuda.synchronize()
        a, b = ev(), ev()
        a.record(self.stream)
        self.launch(kind, k, units)
        b.record(self.stream)
        b.synchronize()
        first = a.elapsed_time(b) * 1e-3
        # Scale to about 50 ms and time again.
        units = max(1, round(units * 0.05 / first))
        samples = []
        for _ in range(3):
            a.record(self.stream)
            self.launch(kind, k, units)
            b.record(self.stream)
            b.synchronize()
            samples.append(units / (a.elapsed_time(b) * 1e-3))
        self.rate[(kind, k)] = median(samples)
        return self.rate[(kind, k)]

    def units_for(self, kind, k, seconds):
        r = self.rate.get((kind, k)) or self.measure_alone(kind, k)
        return max(1, math.ceil(r * seconds))


def alone(fn, calls):
    """Median seconds per call of `calls` back-to-back calls, the GPU kept busy ahead."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(REPEATS):
        a, b = ev(), ev()
        fn()
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e-3 / calls)
    return median(samples)


def beside(fn, calls, side, kind, k, t_alone, spin_cps):
    """Median seconds per call while one long side kernel runs from before the first call to
    after the last; also whether every sample was covered."""
    samples, covered = [], True
    for _ in range(REPEATS):
        window = calls * t_alone
        units = side.units_for(kind, k, 4 * window + 5e-3)
        torch.cuda.synchronize()
        s0, s1, a, b = ev(), ev(), ev(), ev()
        s0.record(side.stream)
        side.launch(kind, k, units)
        s1.record(side.stream)
        torch.cuda._sleep(int(30e-6 * spin_cps))  # the side kernel takes its SMs first
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        covered &= s0.elapsed_time(a) > 0 and b.elapsed_time(s1) > 0
        samples.append(a.elapsed_time(b) * 1e-3 / calls)
    return median(samples), covered


def chunked(fn, calls, side, k, t_alone, chunk_s=1e-3):
    """The copy as back-to-back ~1 ms kernels on the side stream (high priority) while the
    compute calls run: seconds per compute call, and the side's bytes per second during the
    window (chunks that ended inside it)."""
    side.units_for("copy", k, chunk_s)
    # One repetition over as many bytes as the copy moves alone in chunk_s.
    nbytes = max(1 << 20, int(side.rate[("copy", k)] * side.gib * chunk_s) // (1 << 20) * (1 << 20))
    window = calls * t_alone
    n = max(4, math.ceil(4 * window / chunk_s))
    per_call, rates = [], []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        marks = [ev() for _ in range(n + 1)]
        marks[0].record(side.stream)
        for i in range(n):
            side.launch("copy", k, 1, nbytes)
            marks[i + 1].record(side.stream)
        torch.cuda._sleep(100000)
        a, b = ev(), ev()
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        per_call.append(a.elapsed_time(b) * 1e-3 / calls)
        inside = [i for i in range(n) if a.elapsed_time(marks[i]) >= 0 and marks[i + 1].elapsed_time(b) >= 0]
        if inside:
            t = sum(marks[i].elapsed_time(marks[i + 1]) * 1e-3 for i in inside)
            rates.append(len(inside) * 2 * nbytes / t)
    return median(per_call), (median(rates) if rates else None)


def targets(quick):
    """(name, kind, fn, flops or bytes per call)."""
    bf = torch.bfloat16
    out = []
    for m, n, k in [(8192, 8192, 8192), (16384, 14336, 4096), (16384, 4096, 14336), (8192, 1024, 4096)]:
        x = torch.randn(m, k, device="cuda", dtype=bf)
        w = torch.randn(n, k, device="cuda", dtype=bf)
        out.append((f"gemm {m}x{n}x{k}", "gemm", (lambda x=x, w=w: F.linear(x, w)), 2 * m * n * k))
    if not quick:
        q, kk, v = (torch.randn(2, 32, 4096, 128, device="cuda", dtype=bf, requires_grad=True) for _ in range(3))
        g = torch.randn(2, 32, 4096, 128, device="cuda", dtype=bf)

        def attn():
            o = F.scaled_dot_product_attention(q, kk, v, is_causal=True)
            o.backward(g)

        # Causal forward (2 GEMMs) and backward (5), half the square each.
        out.append(("sdpa fwd+bwd 2x32x4096x128 causal", "attention", attn, 3.5 * 4 * 2 * 32 * 4096 * 4096 * 128 / 2))
    h = torch.randn(16384, 8192, device="cuda", dtype=bf)
    lw, lb = torch.ones(8192, device="cuda", dtype=bf), torch.zeros(8192, device="cuda", dtype=bf)
    out.append(("layernorm 16384x8192", "memory", lambda: F.layer_norm(h, (8192,), lw, lb), 2 * h.numel() * 2))
    x1, x2 = torch.randn(1 << 27, device="cuda", dtype=bf), torch.randn(1 << 27, device="cuda", dtype=bf)
    y = torch.empty_like(x1)
    out.append(("add 2^27 bf16", "memory", lambda: torch.add(x1, x2, out=y), 3 * x1.numel() * 2))
    return out


def kernels(fn):
    """The CUDA kernels one call runs: name, grid, block, registers, shared memory, time."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    # Grids and blocks are in the exported trace's args.
    import os
    import tempfile
    f = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    f.close()
    prof.export_chrome_trace(f.name)
    trace = json.load(open(f.name))
    os.unlink(f.name)
    out = []
    for ev_ in trace.get("traceEvents", []):
        if ev_.get("cat") == "kernel":
            a = ev_.get("args", {})
            out.append({"name": ev_["name"][:160], "us": ev_.get("dur"), "grid": a.get("grid"), "block": a.get("block"),
                        "registers": a.get("registers per thread"), "smem": a.get("shared memory"),
                        "blocks_per_sm": a.get("blocks per SM")})
    return out


def delays(fn, t_alone, side, spin_cps, samples=24):
    """A copy of 16 blocks (about 0.5 ms alone) issued on a high-priority stream at random
    moments while back-to-back calls keep the GPU busy: its issue-to-end time less its time
    alone, per sample. And the SM clock beside the calls: a fixed count of spin cycles on 8
    blocks, timed."""
    import random
    rng = random.Random(7)
    k = 16
    side.units_for("copy", k, 1e-3)
    nbytes = max(1 << 20, int(side.rate[("copy", k)] * side.gib * 0.5e-3) // (1 << 20) * (1 << 20))

    def one(busy):
        a, b = ev(), ev()
        a.record(side.stream)
        side.launch("copy", k, 1, nbytes)
        b.record(side.stream)
        return a, b

    torch.cuda.synchronize()
    solo = []
    for _ in range(7):
        a, b = one(False)
        b.synchronize()
        solo.append(a.elapsed_time(b) * 1e-3)
    base = median(solo)
    calls = max(4, math.ceil(0.12 / t_alone))  # 120 ms of queued work
    waits = []
    for i in range(samples):
        torch.cuda.synchronize()
        for _ in range(calls):
            fn()
        time.sleep(0.02 + rng.random() * 0.04)  # somewhere in the middle of the queue
        a, b = one(True)
        torch.cuda.synchronize()
        waits.append(a.elapsed_time(b) * 1e-3 - base)
    # SM clock: 4 M cycles on 8 blocks beside the calls, against the global timer.
    torch.cuda.synchronize()
    for _ in range(calls):
        fn()
    time.sleep(0.03)
    with side.cs:
        side.clock_k((8,), (THREADS,), (np.int64(4_000_000), side.stamps))
    torch.cuda.synchronize()
    g0, g1 = (int(x) for x in side.stamps.get())
    clock = 4e6 / ((g1 - g0) * 1e-9)
    return {"side_alone_s": base, "side_bytes": 2 * nbytes, "waits_s": waits, "spin_mhz_beside": clock / 1e6,
            "spin_mhz_alone": spin_cps / 1e6}


def main_delays(path):
    result = {"gpu": torch.cuda.get_device_name(0), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
              "torch": torch.__version__, "targets": []}
    hi = Side(priority=-1)
    spin_cps = hi.measure_alone("spin", 1)
    for name, kind, fn, work in targets(False):
        t1 = alone(fn, 1)
        t = alone(fn, max(2, min(300, math.ceil(0.02 / t1))))
        row = {"name": name, "kind": kind, "alone_s": t}
        try:
            row["kernels"] = kernels(fn)
        except Exception as e:
            row["kernels_error"] = str(e)[:300]
        row.update(delays(fn, t, hi, spin_cps))
        w = sorted(row["waits_s"])
        print(f"{name}: {t * 1e3:.3f} ms/call; copy of {row['side_alone_s'] * 1e3:.3f} ms alone waits "
              f"median {w[len(w) // 2] * 1e3:.3f} ms, max {w[-1] * 1e3:.3f} ms; SM clock {row['spin_mhz_beside']:.0f} MHz "
              f"beside (alone {row['spin_mhz_alone']:.0f})", flush=True)
        for kk in row.get("kernels", [])[:6]:
            print(f"   {kk.get('us')} us grid {kk.get('grid')} block {kk.get('block')} regs {kk.get('registers')} "
                  f"smem {kk.get('smem')} {kk['name'][:70]}", flush=True)
        result["targets"].append(row)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    print("wrote", path)


def main_clocks(path):
    """The SM clock and board power beside back-to-back GEMMs on 132 - k SMs, k = 0 taken
    as 1 block (the clock kernel needs one)."""
    import threading
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    side = Side(priority=-1)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    fn = lambda: F.linear(x, w)  # noqa: E731
    t = alone(fn, 15)
    result = {"gpu": torch.cuda.get_device_name(0), "gemm_alone_s": t,
              "idle_w": None, "rows": []}
    torch.cuda.synchronize()
    time.sleep(0.5)
    result["idle_w"] = pynvml.nvmlDeviceGetPowerUsage(h) / 1e3
    for k in (1, 4, 8, 16, 32, 48, 66, 88):
        for _ in range(3):
            torch.cuda.synchronize()
            for _ in range(math.ceil(0.4 / t)):
                fn()
            time.sleep(0.15)
            watts = []
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    watts.append(pynvml.nvmlDeviceGetPowerUsage(h) / 1e3)
                    time.sleep(0.005)
            th = threading.Thread(target=sample)
            th.start()
            with side.cs:
                side.clock_k((k,), (THREADS,), (np.int64(40_000_000), side.stamps))
            time.sleep(0.05)
            stop.set()
            th.join()
            torch.cuda.synchronize()
            g0, g1 = (int(v) for v in side.stamps.get())
            mhz = 40e6 / ((g1 - g0) * 1e-9) / 1e6
            result["rows"].append({"held": k, "mhz": mhz, "ms": (g1 - g0) / 1e6,
                                   "watts": median(watts) if watts else None})
            print(f"held {k:3}: SM clock {mhz:.0f} MHz over {(g1 - g0) / 1e6:.1f} ms, board "
                  f"{median(watts) if watts else float('nan'):.0f} W", flush=True)
    # The clock kernel alone, for its own draw.
    for k in (1, 66):
        with side.cs:
            side.clock_k((k,), (THREADS,), (np.int64(400_000_000), side.stamps))
        time.sleep(0.1)
        wv = pynvml.nvmlDeviceGetPowerUsage(h) / 1e3
        torch.cuda.synchronize()
        g0, g1 = (int(v) for v in side.stamps.get())
        result["rows"].append({"held": k, "alone": True, "mhz": 400e6 / ((g1 - g0) * 1e-9) / 1e6, "watts": wv})
        print(f"clock kernel alone on {k}: {400e6 / ((g1 - g0) * 1e-9) / 1e6:.0f} MHz, {wv:.0f} W", flush=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", path)


def main_waves(path):
    side = Side()
    spin_cps = side.measure_alone("spin", 1)
    for k in (8, 16, 32):
        side.measure_alone("spin", k)
    result = {"gpu": torch.cuda.get_device_name(0), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
              "torch": torch.__version__, "rows": []}
    for m, n, kk in [(8192, 256, 4096), (8192, 512, 4096), (8192, 1024, 4096), (4096, 1024, 4096),
                     (8192, 1536, 4096), (8192, 2048, 4096), (8192, 3072, 4096), (8192, 4096, 4096),
                     (8192, 8192, 4096), (8192, 16384, 4096)]:
        x = torch.randn(m, kk, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, kk, device="cuda", dtype=torch.bfloat16)
        fn = (lambda x=x, w=w: F.linear(x, w))  # noqa: E731
        t1 = alone(fn, 1)
        calls = max(2, min(400, math.ceil(0.02 / t1)))
        t = alone(fn, calls)
        row = {"m": m, "n": n, "k": kk, "alone_s": t, "tflops": 2 * m * n * kk / t / 1e12, "beside_spin": []}
        try:
            row["kernels"] = kernels(fn)
        except Exception as e:
            row["kernels_error"] = str(e)[:300]
        for held in (8, 16, 32):
            tb, covered = beside(fn, calls, side, "spin", held, t, spin_cps)
            row["beside_spin"].append({"held": held, "seconds": tb, "slowdown": tb / t, "covered": covered})
        t_after = alone(fn, calls)
        row["alone_after_s"] = t_after
        names = [(kk_["name"][:48], kk_["grid"]) for kk_ in row.get("kernels", [])[:2]]
        print(f"{m}x{n}x{kk}: {t * 1e3:.3f} ms ({row['tflops']:.0f} TFLOP/s; after {t_after * 1e3:.3f}), beside 8/16/32 held: "
              + " ".join(f"x{b['slowdown']:.2f}" + ("" if b["covered"] else "*") for b in row["beside_spin"])
              + f"  {names}", flush=True)
        result["rows"].append(row)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    print("wrote", path)


def main():
    path = sys.argv[1]
    if "--waves" in sys.argv:
        return main_waves(path)
    if "--clocks" in sys.argv:
        return main_clocks(path)
    if "--delays" in sys.argv:
        return main_delays(path)
    quick = "--quick" in sys.argv
    props = torch.cuda.get_device_properties(0)
    result = {
        "gpu": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
        "torch": torch.__version__, "cuda": torch.version.cuda, "threads_per_side_block": THREADS,
        "side_alone": [], "targets": [],
    }

    def save():
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    side = Side()
    hi = Side(priority=-1)
    # Clock cycles per second of the spin kernel (SM clock under this load).
    spin_cps = side.measure_alone("spin", 1)
    variants = [("spin", k) for k in (8, 16, 32, 66)] + [("copy", k) for k in (4, 8, 16, 32)] \
        + [("reduce", k) for k in (8, 16, 32)] + [("ce", 0)]
    if quick:
        variants = [("spin", 16), ("copy", 16), ("ce", 0)]
    for kind, k in variants:
        r = side.measure_alone(kind, k)
        row = {"kind": kind, "blocks": k, "units_per_s": r}
        if kind != "spin":
            row["bytes_per_s"] = r * side.bytes_per_unit(kind)
        result["side_alone"].append(row)
        print(f"side {kind:6} k={k:2}: " + (f"{row['bytes_per_s'] / 1e9:7.1f} GB/s read+written" if kind != "spin"
                                             else f"{r / 1e6:.0f} Mcycles/s"), flush=True)
    save()
    carve = getattr(torch._C, "_set_sm_carveout_experimental", None)
    for name, kind, fn, work in targets(quick):
        t0 = time.time()
        t1 = alone(fn, 1)
        calls = max(2, min(300, math.ceil(0.02 / t1)))
        t = alone(fn, calls)
        row = {"name": name, "kind": kind, "work": work, "calls": calls, "alone_s": t, "beside": [], "chunked": []}
        print(f"{name}: alone {t * 1e3:.3f} ms/call ({calls} calls)", flush=True)
        for skind, k in variants:
            tb, covered = beside(fn, calls, side, skind, k, t, spin_cps)
            row["beside"].append({"side": skind, "blocks": k, "seconds": tb, "slowdown": tb / t, "covered": covered})
            print(f"  beside {skind:6} k={k:2}: {tb * 1e3:.3f} ms/call  x{tb / t:.3f}" + ("" if covered else "  (not covered)"),
                  flush=True)
        for k in ((16,) if quick else (8, 16, 32)):
            tc, rate = chunked(fn, calls, hi, k, t)
            row["chunked"].append({"blocks": k, "seconds": tc, "slowdown": tc / t, "side_bytes_per_s": rate})
            print(f"  chunked copy k={k:2} (high priority): x{tc / t:.3f}, side "
                  + (f"{rate / 1e9:.1f} GB/s" if rate else "-"), flush=True)
        if kind == "gemm" and carve is not None:
            row["carveout"] = []
            for k in (16, 32):
                try:
                    carve(k)
                    tk = alone(fn, calls)
                    tb, covered = beside(fn, calls, side, "copy", k, tk, spin_cps)
                except Exception as e:  # an API this PyTorch may lack or spell otherwise
                    print(f"  carveout {k}: {e}", flush=True)
                    break
                finally:
                    try:
                        carve(None)
                    except Exception:
                        carve(0)
                row["carveout"].append({"blocks": k, "alone_s": tk, "beside_copy_s": tb, "covered": covered})
                print(f"  carveout {k}: alone x{tk / t:.3f}, beside copy k={k}: x{tb / t:.3f}", flush=True)
        row["wall_s"] = time.time() - t0
        result["targets"].append(row)
        save()
    print("wrote", path)


if __name__ == "__main__":
    main()
