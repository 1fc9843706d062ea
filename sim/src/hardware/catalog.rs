//! Built-in devices, links and nodes, with the sources of their numbers.
//!
//! Rates are per direction and dense (no 2:4 sparsity): where a datasheet gives tensor rates
//! "with sparsity" (H100, H200, Blackwell), the catalog stores half. A GPU's memory is what it
//! shows software (nvidia-smi's total, CUDA's `totalGlobalMem`) where that was read: H100 SXM
//! 81,559 MiB (79.6 GiB) and H200 143,771 MiB (140.4 GiB) on the cards trainsim ran on
//! (`traces/2026-11-27-cuda-h100/` and `-h200/machine.txt`), B200 183,359 MiB (179.1 GiB) and
//! GB200 189,471 MiB (185.0 GiB) as published (below). Elsewhere the size sold: "16/32/40/80
//! GB" of HBM are taken as binary gibibytes (A100 80 GB shows 81,920 MiB; a V100 16 GB shows
//! a little less, 16,130 MiB through PyTorch in a public log, left at 16 GiB: no experiment
//! here would change its fit), as is MI300X's 192 GB (ROCm lists 192 GiB). H200's "141 GB"
//! is neither 141e9 bytes (131.3 GiB) nor 141 GiB: until session 37 the catalog took 141e9,
//! 9 GiB short of what the card holds.
//! Numbers marked "default" are starting points that a calibration profile replaces; they
//! come from common knowledge of the device class, never from a scenario's result.

use super::*;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;
const GB: f64 = 1e9;
const T: f64 = 1e12;

const SPECS: &str = "docs/reference/hardware_specs.json";

fn gpu(
    name: &str,
    fp32: f64,
    fp16: f64,
    bf16: Option<f64>,
    fp8: Option<f64>,
    hbm_bytes: f64,
    mem_bw: f64,
    sms: u32,
    gemm_efficiency: f64,
    source: &str,
) -> DeviceSpec {
    DeviceSpec {
        name: name.into(),
        kind: DeviceKind::Gpu,
        vendor: Vendor::Nvidia,
        peak_flops: PeakFlops {
            fp32: Some(fp32 * T),
            fp16: Some(fp16 * T),
            bf16: bf16.map(|v| v * T),
            fp8: fp8.map(|v| v * T),
        },
        hbm_bytes,
        mem_bandwidth_bytes_per_s: mem_bw * GB,
        compute_units: sms,
        gemm_efficiency,
        fp8_gemm_efficiency: None,
        // STREAM-class kernels reach ~85-90% of HBM bandwidth on these parts (default).
        mem_efficiency: 0.85,
        // Launch plus inter-kernel gap of an eager framework (default).
        kernel_launch_s: 3e-6,
        fpga: None,
        op_efficiency: Vec::new(),
        power: None,
        source: source.into(),
    }
}

fn fpga(name: &str, dsp: f64, sram_bytes: f64, mem_bytes: f64, mem_bw: f64, source: &str) -> DeviceSpec {
    // Default fabric: 300 MHz, one fp16 multiply-accumulate (2 FLOP) per two DSP48E2 slices
    // => 1 FLOP per DSP per cycle at fp16; fp32 takes ~2.5x the DSPs; int8/fp8 packs two.
    let fabric = FpgaFabric { dsp_count: dsp, clock_hz: 300e6, ops_per_dsp_per_cycle: 1.0, sram_bytes };
    let fp16 = fabric.peak_flops();
    DeviceSpec {
        name: name.into(),
        kind: DeviceKind::Fpga,
        // Alveo and Virtex are AMD (Xilinx) parts.
        vendor: Vendor::Amd,
        peak_flops: PeakFlops { fp32: Some(fp16 * 0.4), fp16: Some(fp16), bf16: Some(fp16), fp8: Some(fp16 * 2.0) },
        hbm_bytes: mem_bytes,
        mem_bandwidth_bytes_per_s: mem_bw,
        compute_units: 1,
        // A systolic array sized to the layer keeps most DSPs busy (default).
        gemm_efficiency: 0.8,
        fp8_gemm_efficiency: None,
        mem_efficiency: 0.8,
        kernel_launch_s: 1e-6,
        fpga: Some(fabric),
        // Defaults: convolutions keep the systolic array busy; fully connected layers and
        // recurrent steps at training batch sizes stream weights and fill it partly.
        op_efficiency: vec![("fc".into(), 0.5), ("lstm_step".into(), 0.3), ("lstm_input".into(), 0.7)],
        power: None,
        source: source.into(),
    }
}

/// Every device preset.
/// Each GPU preset's rated board power, the default limit its compute efficiencies were
/// measured at (`hardware::power`), and its idle draw where trainsim measured it: V100 SXM2
/// 300 W, A100 SXM 400 W, H100 SXM and H200 700 W, H200 NVL 600 W, B200 1,000 W, GB200's GPU
/// 1,200 W, MI300X 750 W (the vendors' datasheets, as each preset's source cites). Idle: the H100
/// SXM drew 72 W and the H200 130 W before any work (nvidia-smi, `traces/2026-11-27-cuda-h100/`
/// and `-h200/machine.txt`); the others take the H100's share of their rating (assumed).
fn rated_power(name: &str) -> Option<super::power::Power> {
    use super::power::Power;
    let (rated, idle) = match name {
        "v100-sxm2-16gb" | "v100-sxm2-32gb" => (300.0, None),
        "a100-sxm-40gb" | "a100-sxm-80gb" => (400.0, None),
        "h100-sxm" => (700.0, Some(72.0)),
        "h200" => (700.0, Some(130.0)),
        "h200-nvl" => (600.0, None),
        "b200" => (1000.0, None),
        "gb200" => (1200.0, None),
        "mi300x" => (750.0, None),
        _ => return None,
    };
    Some(Power::rated(rated, idle))
}

pub fn devices() -> Vec<DeviceSpec> {
    // gemm_efficiency defaults: the fraction of dense tensor peak the best-shaped bf16 GEMM
    // reaches. Measured ceilings (stas00/ml-engineering, compute/accelerator/README.md,
    // "Maximum Achievable Matmul FLOPS comparison table", mean of 100 matmuls after 50
    // warm-up, torch 2.6-2.7): A100 SXM 271.2 of 312 TFLOP/s (86.9%), H100 SXM 794.5 of
    // 989 (80.3%, "H200 is the same"). A100 uses 0.78: its ceiling less the allowance the
    // H200 measured below (0.72 of 0.803, 10%), an assumption (no A100 was measured here).
    // Until session 20 it took 0.85, its ceiling less 2%: the only device class assumed to
    // hold its burst rate through a training step. The change was prompted by two A100
    // tables, where GEMM-bound time per token came out 5-20% short at 0.85 (experiments/
    // validation/README.md, "fsdp-a100 by parts"; torchtitan-a100); the value is not read off
    // them. V100 keeps 0.85 (no ceiling measured for it; assumed).
    // H100/H200 use 0.72, measured on an H200 (700 W, as H100 SXM; the same GH100 die;
    // traces/2026-11-26-cuda-h200/, session 18): a short burst reached 0.78-0.81 (the
    // calibration's large-GEMM fit, OpenXLA's sm_90 table), 8192-cubed bf16 GEMMs back to back
    // for 15 s settle at 668 TFLOP/s (0.675; SM clock 1,455-1,485 MHz at the power limit), and
    // a real eager GPT block's forward and backward at five shapes (block.json: GEMMs between
    // memory-bound kernels, which let the clock recover) ran as the model charges it within
    // -2.2% to +1.2% at 0.72 (-1.9% to -4.8% at the 0.75 assumed before). Training sits
    // between the burst and the pure-GEMM stream; GEMM-heavier steps (fused kernels, larger
    // widths) nearer the stream. Shapes
    // then lose more to tile and wave quantisation (`kernels::gemm_tiling`). Calibration
    // (`trainsim calibrate`) replaces them. The newer parts, from the same table's later
    // revision: B200 SXM 1745.0 of 2250 (77.6%, torch 2.7.1+cu128), GB200 1822.0 of 2500
    // (72.9%, torch 2.10 nightly), MI300X 668.4 of 1300 (51.4%, ROCm 6.3, TunableOp); B200 and
    // GB200 take the 7% allowance below the burst ceiling that H100 was given before session
    // 18 (0.72, 0.68; an assumption: no Blackwell card was measured here; the H200's measured
    // allowance, 10%, would make them 0.70 and 0.65); MI300X takes its ceiling as measured
    // (0.51): AMD's own Max-Achievable FLOPS, measured at a thermally settled clock, is higher
    // still (708 of 1307.4 bf16 TFLOP/s, 54%; ROCm blog "Measuring Max-Achievable FLOPs - Part
    // 2", 2025), so no boost-clock allowance applies. H200 NVL takes the H200's 0.72 (the same
    // die at 600 W: assumed, no measurement of the NVL card).
    // fp8 GEMMs reach a smaller share of their own (twice as high) peak: the same table's FP8
    // (`float8_e4m3fn`) rows put H100 SXM at 1402.6 of 1979 (70.9%, torch 2.7.0+cu126), H200
    // SXM 1453.4 (73.4%, 2.7.1+cu128), B200 3432.5 of 4500 (76.3%), GB200 3615.6 of 5000
    // (72.3%). Each preset's fp8 efficiency is its bf16 one scaled by its fp8 ceiling over its
    // bf16 ceiling (the same allowance below the burst): H100 0.72 x 70.9/80.3 = 0.64, H200 (and
    // H200 NVL, assumed) 0.72 x 73.4/80.3 = 0.66, B200 0.72 x 76.3/77.6 = 0.71, GB200 0.68 x
    // 72.3/72.9 = 0.67. trainsim's own H200 run agrees: torch._scaled_mm's largest fp8 GEMMs
    // peaked at 1,448 TFLOP/s (0.73) and fell to 1,050-1,160 at the power limit
    // (traces/2026-11-26-cuda-h200/microbench.json, `fp8_gemm`), and 8192-cubed fp8 GEMMs back
    // to back for 15 s settled at 1,274 (0.644; the bf16 ones at 0.675): fp8 loses at least as
    // much as bf16 to the 700 W limit. MI300X: no fp8 ceiling measured; its bf16 0.51 applies.
    let v100 = "NVIDIA V100 datasheet via ".to_string() + SPECS;
    let a100 = "NVIDIA A100 datasheet via ".to_string() + SPECS;
    let h100 = "NVIDIA H100 datasheet via ".to_string() + SPECS;
    let mut all = vec![
        gpu("v100-sxm2-16gb", 15.7, 125.0, None, None, 16.0 * GIB, 900.0, 80, 0.85, &v100),
        gpu("v100-sxm2-32gb", 15.7, 125.0, None, None, 32.0 * GIB, 900.0, 80, 0.85, &v100),
        gpu("a100-sxm-40gb", 19.5, 312.0, Some(312.0), None, 40.0 * GIB, 1555.0, 108, 0.78, &a100),
        gpu("a100-sxm-80gb", 19.5, 312.0, Some(312.0), None, 80.0 * GIB, 2039.0, 108, 0.78, &a100),
        DeviceSpec {
            fp8_gemm_efficiency: Some(0.64),
            ..gpu("h100-sxm", 66.9, 989.4, Some(989.4), Some(1978.9), 81_559.0 * MIB, 3350.0, 132, 0.72, &h100)
        },
        DeviceSpec {
            fp8_gemm_efficiency: Some(0.66),
            ..gpu(
                "h200",
                66.9,
                989.4,
                Some(989.4),
                Some(1978.9),
                143_771.0 * MIB,
                4800.0,
                132,
                0.72,
                &("NVIDIA H200 product page via ".to_string() + SPECS),
            )
        },
        // H200 NVL, the PCIe card (600 W): NVIDIA's H200 product page, NVL column, tensor rates
        // "with sparsity" halved: bf16/fp16 1,671 -> 835.5, fp8 3,341 -> 1,670.5; fp32 60;
        // 141 GB at 4.8 TB/s as the SXM part (taken to show the SXM part's 143,771 MiB: assumed,
        // not read off an NVL card). 15% below the SXM part's peak at the lower power.
        DeviceSpec {
            fp8_gemm_efficiency: Some(0.66),
            ..gpu(
                "h200-nvl",
                60.0,
                835.5,
                Some(835.5),
                Some(1670.5),
                143_771.0 * MIB,
                4800.0,
                132,
                0.72,
                &("NVIDIA H200 product page (NVL column; sparse rates halved) via ".to_string() + SPECS),
            )
        },
        // B200 as on HGX B200 (1,000 W): NVIDIA Blackwell datasheet, "Individual Blackwell GPU
        // Specifications", HGX B200 column, tensor rates with sparsity halved: fp16/bf16 4.5 ->
        // 2.25 PFLOP/s dense, fp8 9 -> 4.5; fp32 75 TFLOP/s; 180 GB at 7.7 TB/s (the DGX B200
        // page's 64 TB/s for eight would be 8). 180 GB is what a GPU shows (nvidia-smi: 183,359
        // MiB = 179.1 GiB) of its 192 GB of HBM3e; the catalog takes that total. 148 SMs (CUDA
        // device query on HGX B200).
        DeviceSpec {
            fp8_gemm_efficiency: Some(0.71),
            ..gpu(
                "b200",
                75.0,
                2250.0,
                Some(2250.0),
                Some(4500.0),
                183_359.0 * MIB,
                7700.0,
                148,
                0.72,
                &("NVIDIA Blackwell datasheet (HGX B200 column; sparse rates halved) via ".to_string() + SPECS),
            )
        },
        // The Blackwell GPU of GB200 NVL72 (up to 1,200 W): the same table's GB200 NVL72
        // column: fp16/bf16 5 -> 2.5 PFLOP/s dense, fp8 10 -> 5; fp32 80; 186 GB at 8 TB/s
        // (nvidia-smi: 189,471 MiB = 185.0 GiB). SMs as B200's (148; assumed, the die is the
        // same).
        DeviceSpec {
            fp8_gemm_efficiency: Some(0.67),
            ..gpu(
                "gb200",
                80.0,
                2500.0,
                Some(2500.0),
                Some(5000.0),
                189_471.0 * MIB,
                8000.0,
                148,
                0.68,
                &("NVIDIA Blackwell datasheet (GB200 NVL72 column; sparse rates halved) via ".to_string() + SPECS),
            )
        },
        // AMD Instinct MI300X (750 W): AMD's datasheet, dense rates: fp16/bf16 1,307.4 TFLOP/s,
        // fp8 2,614.9, fp32 (vector and matrix) 163.4; 192 GB HBM3 (192 GiB in ROCm's GPU
        // table) at 5.3 TB/s; 304 compute units. Its kernels: no CDNA 3 measurement is in the
        // kernel catalog, so fused attention takes A100's FlashAttention-2 fractions of peak
        // (an assumption, likely optimistic beside its 51% GEMM ceiling) and GEMMs the generic
        // 128x128 tiling (`kernels::arch_of` is None for AMD).
        DeviceSpec {
            vendor: Vendor::Amd,
            ..gpu(
                "mi300x",
                163.4,
                1307.4,
                Some(1307.4),
                Some(2614.9),
                192.0 * GIB,
                5300.0,
                304,
                0.51,
                &("AMD Instinct MI300X datasheet and ROCm GPU specifications via ".to_string() + SPECS),
            )
        },
        // Turing TU104: 11.2 TFLOP/s fp32, 89.2 fp16 tensor, 448 GB/s GDDR6 (NVIDIA Quadro
        // RTX 5000 datasheet; not in the reference file).
        gpu("quadro-rtx5000", 11.2, 89.2, None, None, 16.0 * GIB, 448.0, 48, 0.8, "NVIDIA Quadro RTX 5000 datasheet"),
        host_cpu(),
        cpu_core(),
        fpga(
            "alveo-u280",
            8490.0,
            41e6,
            8.0 * GIB,
            460.0 * GB,
            "AMD UG1393 (HBM 460 GB/s) and DS963 (DSPs, SRAM; unverified) via hardware_specs.json",
        ),
        fpga(
            "alveo-u250",
            11508.0,
            54e6,
            64.0 * GIB,
            77.0 * GB,
            "AMD UG1393 (4 DDR4 channels, 77 GB/s) and DS962 (DSPs; unverified) via hardware_specs.json",
        ),
        fpga(
            "vu9p",
            6840.0,
            (75.9e6 + 270e6) / 8.0,
            64.0 * GIB,
            77.0 * GB,
            "Xilinx UltraScale+ product table (VU9P: 6,840 DSP48E2, BRAM+URAM; unverified) via hardware_specs.json",
        ),
    ];
    for d in &mut all {
        d.power = rated_power(&d.name);
    }
    all
}

/// One core of a server CPU, as the executor's CPU backend uses it (one worker thread per
/// device). Defaults: 2.5 GHz x 32 fp32 FLOP/cycle (two AVX-512 FMA units), 10 GB/s of
/// memory bandwidth per core, 8 GiB; calibration replaces them.
pub fn cpu_core() -> DeviceSpec {
    DeviceSpec {
        name: "cpu-core".into(),
        kind: DeviceKind::Cpu,
        vendor: Vendor::Other,
        peak_flops: PeakFlops { fp32: Some(80e9), fp16: None, bf16: None, fp8: None },
        hbm_bytes: 8.0 * GIB,
        mem_bandwidth_bytes_per_s: 10.0 * GB,
        compute_units: 1,
        gemm_efficiency: 0.7,
        fp8_gemm_efficiency: None,
        mem_efficiency: 0.7,
        kernel_launch_s: 1e-6,
        fpga: None,
        op_efficiency: Vec::new(),
        power: None,
        source: "default server core".into(),
    }
}

/// A generic two-socket server CPU used as the host of GPU nodes.
pub fn host_cpu() -> DeviceSpec {
    DeviceSpec {
        name: "host-cpu".into(),
        kind: DeviceKind::Cpu,
        vendor: Vendor::Other,
        // 64 cores x 2.5 GHz x 32 fp32 FLOP/cycle (AVX-512 FMA x2), default.
        peak_flops: PeakFlops { fp32: Some(5.1e12), fp16: None, bf16: None, fp8: None },
        hbm_bytes: 1024.0 * GIB,
        mem_bandwidth_bytes_per_s: 200.0 * GB,
        compute_units: 64,
        gemm_efficiency: 0.7,
        fp8_gemm_efficiency: None,
        mem_efficiency: 0.7,
        kernel_launch_s: 1e-6,
        fpga: None,
        op_efficiency: Vec::new(),
        power: None,
        source: "default two-socket server".into(),
    }
}

fn link(name: &str, bandwidth: f64, latency_s: f64, efficiency: f64, source: &str) -> LinkSpec {
    LinkSpec { name: name.into(), bandwidth_bytes_per_s: bandwidth, latency_s, efficiency, source: source.into() }
}

/// Every link preset. Bandwidths per direction; an NVLink entry is a GPU's whole NVLink port
/// (all its links) to the NVSwitch or mesh.
pub fn links() -> Vec<LinkSpec> {
    let nccl = "docs/reference/nccl_measurements.json";
    vec![
        // 6 links x 25 GB/s. Efficiency as measured on A100/H100 NVLink by NCCL (~80%).
        link("nvlink2", 150.0 * GB, 2e-6, 0.8, "V100 datasheet; NCCL per-step latency ~2 us (nccl-tests #123)"),
        // 12 x 25 GB/s = 300 GB/s; ~240 effective (sjeaugey, nccl-tests #149).
        link("nvlink3", 300.0 * GB, 2e-6, 0.8, nccl),
        // 450 GB/s line; ~370 effective (nccl-tests #212).
        link("nvlink4", 450.0 * GB, 2e-6, 0.82, nccl),
        // 18 links x 50 GB/s = 900 GB/s per direction ("1.8 TB/s" both ways, NVIDIA Blackwell
        // datasheet); ~770 GB/s GPU to GPU measured by nvbandwidth on GB200 (Azure/AI-
        // benchmarking-guide #7): 0.85. Latency as NVLink 4's.
        link(
            "nvlink5",
            900.0 * GB,
            2e-6,
            0.85,
            "NVIDIA Blackwell datasheet (1.8 TB/s bidirectional per GPU); nvbandwidth p2p ~770 GB/s on GB200 (Azure/AI-benchmarking-guide #7)",
        ),
        // One MI300X Infinity Fabric (xGMI) link between a pair of GPUs: 64 GB/s per direction;
        // 45-48 GB/s reached per link with all seven busy (TransferBench), and RCCL all-reduce
        // over 8 GPUs at 319 GB/s bus bandwidth = 7 x 45.6 (ROCm blog "Understanding RCCL
        // Bandwidth and xGMI Performance on AMD Instinct MI300X", 2025): 0.71. RCCL all-reduce
        // of 1 KiB over 8 GPUs takes 13 us, 14 ring steps: ~1 us each. A mesh node's link
        // (`IntraTopology::Mesh`), not a switch port.
        link(
            "xgmi-mi300x",
            64.0 * GB,
            1e-6,
            0.71,
            "ROCm blog: Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X (2025)",
        ),
        // GB200's NVLink-C2C joins a Grace CPU to its two GPUs at 900 GB/s both ways (NVIDIA
        // GB200 NVL72 page): 225 GB/s per direction for each GPU, assuming an even split.
        // Efficiency as PCIe's (default).
        link("nvlink-c2c-gb200", 225.0 * GB, 1e-6, 0.8, "NVIDIA GB200 NVL72 page (900 GB/s per superchip, split)"),
        // PCIe x16: 8/16/32 GT/s with 128b/130b encoding; ~80% achievable for DMA (default).
        link("pcie3", 15.754 * GB, 3e-6, 0.8, "PCIe 3.0 x16 signalling rate; NCCL hwLat PCI"),
        link("pcie4", 31.5 * GB, 3e-6, 0.8, "PCIe 4.0 x16 signalling rate"),
        link("pcie5", 63.0 * GB, 3e-6, 0.8, "PCIe 5.0 x16 signalling rate"),
        // NCCL reaches 46-48 of 50 GB/s per NDR NIC (~94%), 192 of 200 GB/s on 8x HDR.
        link("ib-edr", 12.5 * GB, 5e-6, 0.94, nccl),
        link("ib-hdr", 25.0 * GB, 5e-6, 0.94, nccl),
        link("ib-ndr", 50.0 * GB, 5e-6, 0.94, nccl),
        // TCP/EFA over Ethernet: ~90% of line rate for large messages, higher latency (default).
        link("eth-25g", 3.125 * GB, 15e-6, 0.9, "25 Gb/s line rate"),
        link("eth-100g", 12.5 * GB, 10e-6, 0.9, "100 Gb/s line rate"),
        link("eth-400g", 50.0 * GB, 10e-6, 0.9, "400 Gb/s line rate"),
        link("opa-100", 12.5 * GB, 5e-6, 0.9, "Omni-Path 100 Gb/s (bigscience tr11)"),
        link("qsfp28", 12.5 * GB, 1e-6, 0.9, "QSFP28 100 GbE board-to-board serial link"),
        // The PipeTransformer rig's inter-node InfiniBand CX353A, quoted at 5 GB/s.
        link("ib-cx353a-5gbs", 5.0 * GB, 5e-6, 0.94, "PipeTransformer paper, SEEDS.md 1.7"),
    ]
}

pub fn device(name: &str) -> Option<DeviceSpec> {
    devices().into_iter().find(|d| d.name == name)
}

pub fn link_preset(name: &str) -> Option<LinkSpec> {
    links().into_iter().find(|l| l.name == name)
}

fn host(dram_gib: f64, pcie: &str) -> HostSpec {
    HostSpec {
        dram_bytes: dram_gib * GIB,
        pcie: link_preset(pcie).expect("pcie preset"),
        cpu: Some(host_cpu()),
        nvme_bytes: 15e12,
        nvme_bandwidth_bytes_per_s: 25.0 * GB,
    }
}

fn node(name: &str, dev: &str, intra: Option<&str>, nics: u32, nic: &str, host: HostSpec) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        device: device(dev).expect("device preset"),
        devices: 8,
        intra_node: intra.map(|l| link_preset(l).expect("link preset")),
        intra_topology: IntraTopology::Switch,
        nics,
        nic: link_preset(nic).expect("link preset"),
        host,
    }
}

/// GB200 NVL72's host side: 36 Grace CPUs, one per two GPUs, each up to 480 GB of LPDDR5X at
/// up to 512 GB/s and 72 Arm Neoverse V2 cores (NVIDIA GB200 NVL72 page: 2,592 cores, 17 TB,
/// 18.4 TB/s), reached over NVLink-C2C. The cores' rate takes `host_cpu`'s default of 32 fp32
/// FLOP/cycle (four 128-bit FMA pipes) at 3 GHz; the NVMe drives the 8-GPU default per 8 GPUs.
fn grace_host(superchips: u32) -> HostSpec {
    let n = superchips as f64;
    let cpu = DeviceSpec {
        name: "grace".into(),
        peak_flops: PeakFlops { fp32: Some(n * 72.0 * 3.0e9 * 32.0), fp16: None, bf16: None, fp8: None },
        hbm_bytes: n * 480.0 * GB,
        mem_bandwidth_bytes_per_s: n * 512.0 * GB,
        compute_units: 72 * superchips,
        source: "NVIDIA GB200 NVL72 page (cores, LPDDR5X, bandwidth); FLOP/cycle default".into(),
        ..host_cpu()
    };
    let gpus = 2.0 * n;
    HostSpec {
        dram_bytes: n * 480.0 * GB,
        pcie: link_preset("nvlink-c2c-gb200").expect("link preset"),
        cpu: Some(cpu),
        nvme_bytes: 15e12 * gpus / 8.0,
        nvme_bandwidth_bytes_per_s: 25.0 * GB * gpus / 8.0,
    }
}

/// Every node preset.
pub fn nodes() -> Vec<NodeSpec> {
    vec![
        node("dgx-1-v100", "v100-sxm2-16gb", Some("nvlink2"), 4, "ib-edr", host(512.0, "pcie3")),
        node("p3.16xlarge", "v100-sxm2-16gb", Some("nvlink2"), 1, "eth-25g", host(488.0, "pcie3")),
        node("p3dn.24xlarge", "v100-sxm2-32gb", Some("nvlink2"), 1, "eth-100g", host(768.0, "pcie3")),
        node("dgx-a100-40gb", "a100-sxm-40gb", Some("nvlink3"), 8, "ib-hdr", host(1024.0, "pcie4")),
        node("dgx-a100-80gb", "a100-sxm-80gb", Some("nvlink3"), 8, "ib-hdr", host(2048.0, "pcie4")),
        // 400 Gb/s EFA as 4 x 100 Gb/s adapters.
        node("p4d.24xlarge", "a100-sxm-40gb", Some("nvlink3"), 4, "eth-100g", host(1152.0, "pcie4")),
        node("dgx-h100", "h100-sxm", Some("nvlink4"), 8, "ib-ndr", host(2048.0, "pcie5")),
        node("hgx-h200", "h200", Some("nvlink4"), 8, "ib-ndr", host(2048.0, "pcie5")),
        // HGX B200 as NVIDIA's DGX B200 builds it (DGX B200 user guide): eight B200 on two
        // NVLink 5 switches, 8 x ConnectX-7 at 400 Gb/s for the compute fabric (the HGX B200
        // spec's "0.8 TB/s" networking = 8 x 400 Gb/s both ways; B300 boards moved to 8 x
        // ConnectX-8 at 800 Gb/s), 2 TB of DDR5, PCIe Gen5 to the host.
        node("hgx-b200", "b200", Some("nvlink5"), 8, "ib-ndr", host(2048.0, "pcie5")),
        // GB200 NVL72 (DGX GB200 user guide): one NVLink domain of 72 GPUs (18 compute trays of
        // 2 Grace + 4 GPUs, 9 NVLink switch trays), each GPU's 900 GB/s NVLink 5 port into the
        // switches; 4 x ConnectX-7 400 Gb/s per tray, one per GPU.
        NodeSpec {
            devices: 72,
            nics: 72,
            host: grace_host(36),
            ..node("gb200-nvl72", "gb200", Some("nvlink5"), 72, "ib-ndr", host(2048.0, "pcie5"))
        },
        // 8 x MI300X on AMD's platform board: each GPU has one xGMI link to each of its seven
        // peers, a full mesh (448 GB/s per GPU); 8 x 400 Gb/s NDR InfiniBand and 1850 GiB of
        // host memory as Azure's ND MI300X v5 (Microsoft Learn, ND MI300X v5-series).
        NodeSpec {
            intra_topology: IntraTopology::Mesh,
            ..node("mi300x-8", "mi300x", Some("xgmi-mi300x"), 8, "ib-ndr", host(1850.0, "pcie5"))
        },
        // This host for the executor's CPU backend: each worker thread is a device, and
        // threads exchange data through shared memory (a memcpy-rate "link"). Two threads by
        // default, as the development machines have two cores.
        NodeSpec {
            name: "host-cpu".into(),
            device: cpu_core(),
            devices: 2,
            intra_node: Some(link("shared-memory", 10.0 * GB, 1e-6, 1.0, "default; replaced by calibration")),
            intra_topology: IntraTopology::Switch,
            nics: 1,
            nic: link_preset("eth-25g").expect("link preset"),
            host: host(64.0, "pcie3"),
        },
        // PipeTransformer: 8 x RTX 5000 per machine on PCIe 3.0 x16, machines at 5 GB/s.
        node("rtx5000-pcie-2x8", "quadro-rtx5000", Some("pcie3"), 1, "ib-cx353a-5gbs", host(512.0, "pcie3")),
    ]
}

pub fn node_preset(name: &str) -> Option<NodeSpec> {
    nodes().into_iter().find(|n| n.name == name)
}
