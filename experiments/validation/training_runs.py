"""The scenarios of the validation suite's training-run tables (torchtitan on H100 and H200,
KempnerForge, FlagPerf, fms-fsdp): one record of a data file in, one trainsim scenario out,
from the record's inputs only (never its measured value). `run` imports them; each data file
(`data/`) names its source and what the scenarios assume.
"""

def torchtitan_h100_scenario(r):
    """One torchtitan H100 record as a scenario: Grand Teton's H100 (96 GB of HBM2e at 2.4 TB/s;
    the SXM peak kept, data/torchtitan_h100.json says why; at its 500 W power limit, which
    trainsim's power model charges from the H100 SXM's rated 700 W: hardware/power.rs), FSDP2 over dp x cp, a GEMM per
    projection, torch.compile's fused RMSNorm and SwiGLU (not the complex rotary embeddings), Float8 linears, SDPA's
    FlashAttention-2, full checkpointing (Tables 1 and 3: eager or compiled, bf16 or Float8,
    per-op selective checkpointing, as each row says). With pipeline parallelism torchtitan keeps the gathered parameters through
    the step (reshard_after_forward off; PyTorch's pipelining reshards and reduces only after the
    last micro-batch's backward): ZeRO-2's traffic. Without it, FSDP2 reshards after forward:
    ZeRO-3. Under pipelining the local batch in as many micro-batches as pipeline stages
    (torchtitan's default), the whole local batch at once otherwise; async TP is Megatron-style
    TP overlap."""
    device = {"preset": "h100-sxm", "name": "H100 96GB HBM2e, 500 W (Grand Teton)",
              "hbm_bytes": 96 * 2**30, "mem_bandwidth_bytes_per_s": 2.4e12, "power_limit_w": 500}
    pp = r['pp']
    # Tables 1 and 3 give compile, Float8 and torchtitan's per-op selective checkpointing per
    # row; the others run compile, Float8 and full checkpointing.
    compiled, float8 = r.get('compile', True), r.get('float8', True)
    plan = {"dp": r['dp'], "tp": r['tp'], "pp": pp, "cp": r['cp'], "recompute": "full",
            "zero_stage": 2 if pp > 1 else 3}
    if r.get('checkpointing') == 'op':
        plan.update({"recompute": "selective", "recompute_modules": ["op_sac"]})
    if r['tp'] > 1:
        plan["sequence_parallel"] = True
    if r['schedule'] == 'interleaved':
        plan.update({"schedule": "interleaved", "virtual_stages": 2})
    elif pp > 1:
        plan["schedule"] = "1f1b"
    # FSDP2 (fully_shard) copies each all-gather out of its flat buffer on the compute stream;
    # Float8 is torchao's Float8Linear with dynamic tensor-wise casts (torchtitan/float8.py).
    # torchtitan's Llama runs a GEMM per projection (wq, wk, wv; w1, w3).
    # torchtitan reduces gradients in fp32 (MixedPrecisionPolicy reduce_dtype from
    # --training.mixed_precision_reduce, whose default and only choice is "float32").
    # torch.compile fuses RMSNorm and SwiGLU but not the rotary embeddings: torchtitan multiplies
    # them as complex numbers (apply_rotary_emb's view_as_complex) and Inductor leaves complex
    # operators to eager kernels ("Torchinductor does not support code generation for complex
    # operators", torch/_inductor/lowering.py, since PyTorch 2.0). Measured on an H100 in
    # session 25 (traces/2026-11-26-cuda-h100/microbench.json llama_ops): compiled 1.17 ms,
    # eager 1.36 ms, where a fused kernel would take about 0.3.
    framework = {"name": "pytorch-fsdp", "gather_copy_out": True, "fp8_casts": "torchao", "grad_reduce_dtype": "fp32",
                 "fused": {"rms_norm": compiled, "swiglu": compiled, "rope": False, "projections": False}}
    if r['tp'] > 1:
        framework["tp_comm_overlap"] = r['async_tp']
        # With tensor parallelism torchtitan computes the loss under PyTorch's loss_parallel
        # (train.py get_train_context at 9dec370): vocabulary-sharded logits, log_softmax
        # decomposed into fp32 kernels with larger temporaries than the fused aten one.
        framework["unfused_loss"] = "loss_parallel"
    if pp > 1:
        # PyTorch's pipelining turns FSDP2's gradient sync off until the last micro-batch's
        # backward (torch/distributed/pipelining/stage.py backward_maybe_with_nosync).
        framework["grad_reduce"] = "after_backward"
    # Under pipelining torchtitan splits the local batch into pipeline_parallel_microbatches,
    # whose default is the pipeline degree (torchtitan/parallelisms/pipelining_utils.py
    # build_pipeline_schedule at 9dec370; the benchmark sets none): 8 micro-batches of 4
    # sequences at local batch 32, of 1 at local batch 8.
    micro = r['local_batch'] // pp if pp > 1 else r['local_batch']
    return {"name": r['id'], "workload": {"preset": r['model']},
            "cluster": {"node": {"preset": "dgx-h100", "device": device}, "nodes": r['gpus'] // 8},
            "training": {"global_batch": r['local_batch'] * r['dp'], "micro_batch": micro,
                         "seq_len": r['seq_len'], "precision": "fp8" if float8 else "bf16",
                         "optimizer": "adam", "attention": "flash2", "framework": framework},
            "plan": plan}


def torchtitan_h100_asynctp_scenario(r):
    """One record of torchtitan's June 2025 async-TP benchmark (data/torchtitan_h100_asynctp.json):
    the same Grand Teton H100s at 500 W and the same model of torchtitan's FSDP2 and TP as
    `torchtitan_h100_scenario`, with the loss compiled too (torchtitan/components/loss.py at
    820504e compiles it under training.compile, as at the H200 table's e7c0cae)."""
    sc = torchtitan_h100_scenario(r)
    sc["training"]["framework"]["fused"]["cross_entropy"] = True
    return sc


def torchtitan_h200_scenario(r):
    """One torchtitan H200 record as a scenario: HGX H200 nodes (the `hgx-h200` preset: 700 W
    H200 SXM, NVLink 4, 400 Gb/s per GPU between hosts as the benchmark's CX-7), FSDP2 over all
    GPUs (ZeRO-3), torchtitan's Llama (a GEMM per projection), torch.compile's fused RMSNorm
    and SwiGLU (the complex rotary embeddings stay eager kernels), Float8 linears with torchao's dynamic tensor-wise casts, SDPA's
    FlashAttention-2, the compiled loss, and the per-op selective checkpointing of
    llama3_8b.toml at e7c0cae. Not
    expressed: the all-gathers in fp8 (enable_fsdp_float8_all_gather; trainsim gathers the
    bf16 weights, twice the bytes)."""
    # At e7c0cae torch.compile also compiles the loss (torchtitan/components/loss.py
    # build_cross_entropy_loss under training.compile): Inductor fuses the fp32 cast,
    # log_softmax and nll_loss into one pass over the bf16 logits each way, which trainsim's
    # fused loss describes. (At 9dec370, the H100 table's, that line was commented out.)
    framework = {"name": "pytorch-fsdp", "gather_copy_out": True, "fp8_casts": "torchao", "grad_reduce_dtype": "fp32",
                 "fused": {"rms_norm": True, "swiglu": True, "rope": False, "projections": False,
                           "cross_entropy": True}}
    g = r['gpus']
    return {"name": r['id'], "workload": {"preset": r['model']},
            "cluster": {"node": "hgx-h200", "nodes": g // 8},
            "training": {"global_batch": r['local_batch'] * g, "micro_batch": r['local_batch'],
                         "seq_len": r['seq_len'], "precision": "fp8", "optimizer": "adam",
                         "attention": "flash2", "framework": framework},
            "plan": {"dp": g, "zero_stage": 3, "recompute": "selective", "recompute_modules": ["op_sac"]}}


def kempnerforge_scenario(r):
    """One KempnerForge H200 record (data/kempnerforge_h200.json, which says what is read from
    the code and what is assumed) as a scenario: nodes of 4 H200 SXM on a full NVLink mesh with
    one NDR NIC per GPU, its Llama-3 shape, FSDP2 over the `dp_shard` ranks (ZeRO-3: every
    block and the root reshard after forward), gradient sync off until each step's last
    micro-batch (unsharded fp32 gradients held until then), DTensor tensor parallelism with
    sequence parallelism, full checkpointing, fused AdamW, torch.compile's fused RMSNorm,
    SwiGLU and (real-valued) rotary embeddings except on the eager run 08, cuDNN's SDPA behind
    the repeated key-value heads, F.cross_entropy on the bf16 logits, and no fp32 master
    weights (the model is cast to bf16 before FSDP2: AdamW's moments are bf16 too), and under
    TP each projection gathering its own input, the token embedding whole on every rank (its
    output wrapped as Replicate) and the head's logits gathered to every rank, the loss computed
    on each. Not expressed: the loss's host synchronisations."""
    node = {"preset": "hgx-h200", "devices": min(4, r['gpus']), "intra_topology": "mesh",
            "intra_node": {"preset": "nvlink4", "bandwidth_bytes_per_s": 150e9},
            "nics": min(4, r['gpus']), "nic": "ib-ndr"}
    workload = {"7b": {"preset": "llama3-8b"}, "70b": {"preset": "llama3-70b"},
                "13b": {"transformer": {"layers": 40, "hidden": 5120, "heads": 40, "kv_heads": 8,
                                        "ffn_hidden": 17920, "vocab": 128256, "mlp": "swiglu",
                                        "norm": "rmsnorm", "rotary": True, "bias": False,
                                        "dropout": False, "tied_embeddings": False}}}[r['model']]
    c = r['compile']
    framework = {"name": "pytorch-fsdp", "gather_copy_out": True, "grad_reduce_dtype": "fp32",
                 "grad_reduce": "after_backward", "unfused_loss": "native",
                 "tp_gather_per_projection": True, "tp_replicate_logits": True, "tp_replicate_embedding": True,
                 "fused": {"rms_norm": c, "swiglu": c, "rope": c, "projections": False, "adam": True}}
    plan = {"dp": r['dp'], "tp": r['tp'], "pp": 1, "zero_stage": 3 if r['dp'] > 1 else 0, "recompute": "full"}
    if r['tp'] > 1:
        plan["sequence_parallel"] = True
    return {"name": r['id'], "workload": workload,
            "cluster": {"node": node, "nodes": max(1, r['gpus'] // 4)},
            "training": {"global_batch": r['dp'] * r['batch'] * r['grad_accum'], "micro_batch": r['batch'],
                         "seq_len": r['seq_len'], "precision": "bf16", "optimizer": "adam",
                         "master_weights": False, "attention": "cudnn", "framework": framework},
            "plan": plan}


FLAGPERF_NODES = {
    # DGX A800: the A100 80 GB with NVLink at 200 GB/s per direction (400 bidirectional).
    "a800": {"preset": "dgx-a100-80gb", "name": "DGX A800",
             "intra_node": {"preset": "nvlink3", "bandwidth_bytes_per_s": 200e9}},
    "h100": "dgx-h100",
    # H800: the H100 with NVLink at 200 GB/s per direction; eight 200 Gb/s HCAs per node.
    "h800": {"preset": "dgx-h100", "name": "H800 node", "nic": "ib-hdr", "nics": 8,
             "intra_node": {"preset": "nvlink4", "bandwidth_bytes_per_s": 200e9}},
}


def flagperf_scenario(r):
    """One FlagPerf row as the case's own files say it ran (data/flagperf.json `codes`)."""
    code, m, tp = r['code'], r['model'], r['tp']
    legacy = code in ('flagscale', 'megatron-deepspeed', 'hf-deepspeed')
    # Megatron pads the vocabulary to a multiple of 128 x TP (--make-vocab-size-divisible-by);
    # Hugging Face's Llama keeps its 32,000.
    pad = 1 if code == 'hf-deepspeed' else 128 * tp
    workload = {"layers": m['layers'], "hidden": m['hidden'], "heads": m['heads'],
                "kv_heads": m.get('kv_heads', m['heads']), "ffn_hidden": m['ffn_hidden'],
                "vocab": -(-m['vocab'] // pad) * pad, "mlp": "swiglu",
                # mcore: learned positions, tied embeddings and biases (core_v0.6.0's defaults,
                # which the script leaves); the others: rotary embeddings, untied, no bias but
                # Megatron-DeepSpeed's (its --disable-bias-linear is commented out, as is RMSNorm).
                "max_positions": r['seq_len'] if code == 'mcore' else 0, "rotary": code != 'mcore',
                "tied_embeddings": code == 'mcore', "bias": code in ('mcore', 'megatron-deepspeed'),
                "norm": "layernorm" if code == 'megatron-deepspeed' else "rmsnorm"}
    if code in ('mcore', 'flagscale'):
        framework = {"name": "megatron-core", "grad_reduce": "after_backward", "param_gather_overlap": False,
                     "tp_comm_overlap": False}
    else:
        framework = {"name": "deepspeed", "gather_per_tensor": False}
        if code == 'megatron-deepspeed':
            framework["grad_reduce"] = "after_backward"
    if legacy:
        # Eager SwiGLU and rotary embeddings, and the key-value heads repeated to the queries'
        # (legacy Megatron's ParallelMLP and ParallelAttention, Hugging Face's Llama); the
        # RMSNorm eager in Hugging Face's LlamaRMSNorm only: FlagScale runs apex's fused kernel.
        framework["fused"] = {"rms_norm": code == 'flagscale', "swiglu": False, "rope": False, "gqa": False}
    if code == 'hf-deepspeed':
        framework["fused"]["projections"] = False
        framework["unfused_loss"] = "fp32"
    plan = {"dp": r['dp'], "tp": tp, "pp": r['pp'], "recompute": "none",
            "zero_stage": 3 if code == 'hf-deepspeed' else 1}
    if tp > 1:
        plan["sequence_parallel"] = r['sequence_parallel']
    if r['pp'] > 1:
        plan["schedule"] = "1f1b"
    # NCCL before 2.21 on every row: the mcore rows ran in NGC's PyTorch 24.02 container
    # (February 2024), FlagScale in 23.09, the DeepSpeed rows on DeepSpeed 0.11 (October 2023);
    # NCCL 2.21.5 is of April 2024 (PyPI nvidia-nccl-cu12's release dates). So each communicator
    # connected rings, trees and NVLS when created, NVLS with 4 MiB buffers (cluster.nccl.version
    # decides only that memory; "2.19" stands for 2.18-2.20, which hold the same).
    return {"name": r['id'], "workload": {"transformer": workload},
            "cluster": {"node": FLAGPERF_NODES[r['hardware']], "nodes": r['nodes'], "nccl": {"version": "2.19"}},
            "training": {"global_batch": r['global_batch'], "micro_batch": r['micro_batch'],
                         "seq_len": r['seq_len'], "precision": r['precision'], "optimizer": "adam",
                         "attention": "te" if code == 'mcore' else "flash2", "framework": framework},
            "plan": plan}


# fms-fsdp's models (fms_fsdp/utils/config_utils.py): Llama 2's, and a 34B of the same family.
FMS_34B = {"layers": 48, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 22016, "vocab": 32000,
           "mlp": "swiglu", "norm": "rmsnorm", "bias": False, "dropout": False, "tied_embeddings": False,
           "rotary": True}


def fms_fsdp_scenario(r):
    """One fms-fsdp record: FSDP1 (FULL_SHARD over every GPU, or HYBRID_SHARD over each node's 8),
    bf16 parameters and reduction (the 'bfSixteen' policy), SDPA's FlashAttention-2, fms's Llama:
    separate q, k, v and w1, wg projections, key/value heads expanded before SDPA
    (fms/modules/attention.py), RMSNorm, SwiGLU and rotary embeddings in eager kernels unless the
    row is compiled. Hardware as data/fms_fsdp.json says (its NIC split an assumption)."""
    node = ({"preset": "p4d.24xlarge", "device": "a100-sxm-80gb"} if r['gpu'] == 'a100'
            else {"preset": "dgx-h100", "nics": 8, "nic": "eth-100g"})
    g, c = r['gpus'], r['compile']
    plan = {"dp": g, "zero_stage": 3, "recompute": "none" if r['checkpointing'] == 'none' else "full"}
    if r['sharding'] == 'hsdp':
        plan["dp_shard"] = 8
    if r['checkpointing'] == 'half':
        # fms-fsdp's selective_checkpointing 1/2 wraps every second block: 20 of 13B's 40.
        plan["recompute_layers"] = 20
    return {"name": r['id'], "workload": {"transformer": FMS_34B} if r['model'] == '34b'
            else {"preset": "llama2-" + r['model']},
            "cluster": {"node": node, "nodes": g // 8},
            "training": {"global_batch": r['local_batch'] * g, "micro_batch": r['local_batch'], "seq_len": 4096,
                         "precision": "bf16", "optimizer": "adam", "attention": "flash2",
                         "framework": {"name": "pytorch-fsdp", "grad_reduce_dtype": "params",
                                       "fused": {"rms_norm": c, "swiglu": c, "rope": c, "projections": False,
                                                 "gqa": False}}},
            "plan": plan}
