//! The presets of today's hardware read back as their sources give them, and the topology of
//! the nodes they build: a 72-GPU NVLink domain, and AMD's Infinity Fabric mesh.

use super::kernels::{self, GpuArch};
use super::nccl::{Arch, NcclSystem};
use super::*;
use crate::engine::collective::expand;
use crate::lower::{Collective, CollectiveKind};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// A GPU holds what software sees on it: nvidia-smi's total on the H100 SXM and the H200 that
/// trainsim ran on (`traces/2026-11-27-cuda-h100/` and `-h200/machine.txt`: 81,559 and 143,771
/// MiB). The H200's "141 GB" is not 141e9 bytes: taking it so left 9 GiB of every H200 out of
/// the question "does it fit".
#[test]
fn gpu_memory_is_what_the_card_shows() {
    eq(dev("h100-sxm").hbm_bytes, 81_559.0 * MIB);
    eq(dev("h200").hbm_bytes, 143_771.0 * MIB);
    assert!(dev("h200").hbm_bytes / GIB > 140.0 && dev("h100-sxm").hbm_bytes / GIB < 80.0);
    eq(dev("a100-sxm-80gb").hbm_bytes, 81_920.0 * MIB);
}

fn dev(name: &str) -> DeviceSpec {
    catalog::device(name).unwrap_or_else(|| panic!("device preset {name}"))
}

fn node(name: &str) -> NodeSpec {
    catalog::node_preset(name).unwrap_or_else(|| panic!("node preset {name}"))
}

#[track_caller]
fn eq(a: f64, b: f64) {
    assert!((a - b).abs() <= 1e-9 * b.abs(), "{a} vs {b}");
}

/// Dense peaks (the datasheets' "with sparsity" tensor rates halved), memory and bandwidth.
#[test]
fn new_devices_read_back_as_cited() {
    // (name, fp32, bf16 = fp16, fp8 in TFLOP/s; memory bytes; bandwidth GB/s; compute units)
    let cases: [(&str, f64, f64, f64, f64, f64, u32); 4] = [
        ("b200", 75.0, 2250.0, 4500.0, 183_359.0 * MIB, 7700.0, 148),
        ("gb200", 80.0, 2500.0, 5000.0, 189_471.0 * MIB, 8000.0, 148),
        ("h200-nvl", 60.0, 835.5, 1670.5, 143_771.0 * MIB, 4800.0, 132),
        ("mi300x", 163.4, 1307.4, 2614.9, 192.0 * GIB, 5300.0, 304),
    ];
    for (name, fp32, bf16, fp8, hbm, bw, cu) in cases {
        let d = dev(name);
        assert_eq!(d.kind, DeviceKind::Gpu, "{name}");
        eq(d.peak_flops.at(Precision::Fp32), fp32 * 1e12);
        eq(d.peak_flops.at(Precision::Bf16), bf16 * 1e12);
        eq(d.peak_flops.at(Precision::Fp16), bf16 * 1e12);
        // fp8 is a peak of its own, not the bf16 fallback: fp8 training is accepted.
        eq(d.peak_flops.fp8.expect("fp8 tensor cores"), fp8 * 1e12);
        eq(d.hbm_bytes, hbm);
        eq(d.mem_bandwidth_bytes_per_s, bw * 1e9);
        assert_eq!(d.compute_units, cu, "{name}");
        assert!(d.source.contains("hardware_specs.json"), "{name}: {}", d.source);
        assert!(d.gemm_efficiency > 0.4 && d.gemm_efficiency < 0.8, "{name}");
    }
    // The H200 NVL card is the SXM part at lower power: same memory, 15% less peak.
    let (sxm, nvl) = (dev("h200"), dev("h200-nvl"));
    assert_eq!(sxm.hbm_bytes, nvl.hbm_bytes);
    assert!(nvl.peak_flops.at(Precision::Bf16) < 0.9 * sxm.peak_flops.at(Precision::Bf16));
    assert_eq!(dev("mi300x").vendor, Vendor::Amd);
    for name in ["b200", "gb200", "h200-nvl", "h100-sxm"] {
        assert_eq!(dev(name).vendor, Vendor::Nvidia, "{name}");
    }
}

#[test]
fn new_nodes_and_links_read_back_as_cited() {
    let nvlink5 = catalog::link_preset("nvlink5").expect("nvlink5");
    eq(nvlink5.bandwidth_bytes_per_s, 900e9);
    let xgmi = catalog::link_preset("xgmi-mi300x").expect("xgmi");
    eq(xgmi.bandwidth_bytes_per_s, 64e9);

    let hgx = node("hgx-b200");
    assert_eq!((hgx.device.name.as_str(), hgx.devices, hgx.nics), ("b200", 8, 8));
    assert_eq!(hgx.intra_node.as_ref().map(|l| l.name.as_str()), Some("nvlink5"));
    assert_eq!(hgx.intra_topology, IntraTopology::Switch);
    eq(hgx.nic.bandwidth_bytes_per_s, 50e9); // 400 Gb/s ConnectX-7

    let nvl = node("gb200-nvl72");
    assert_eq!((nvl.device.name.as_str(), nvl.devices, nvl.nics), ("gb200", 72, 72));
    assert_eq!(nvl.intra_node.as_ref().map(|l| l.name.as_str()), Some("nvlink5"));
    assert_eq!(nvl.intra_topology, IntraTopology::Switch);
    eq(nvl.nic.bandwidth_bytes_per_s, 50e9);
    // 36 Grace CPUs: 17.28 TB of LPDDR5X at 18.4 TB/s, over NVLink-C2C.
    eq(nvl.host.dram_bytes, 36.0 * 480e9);
    eq(nvl.host.cpu.as_ref().expect("grace").mem_bandwidth_bytes_per_s, 36.0 * 512e9);
    assert_eq!(nvl.host.pcie.name, "nvlink-c2c-gb200");

    let mi = node("mi300x-8");
    assert_eq!((mi.device.name.as_str(), mi.devices, mi.nics), ("mi300x", 8, 8));
    assert_eq!(mi.intra_topology, IntraTopology::Mesh);
    // Seven 64 GB/s links per GPU: 448 GB/s of line rate per direction.
    eq(mi.intra_port_bytes_per_s().expect("mesh"), 448e9);
}

/// NCCL's model is for NVIDIA GPUs: an AMD GPU (and a renamed copy of one) takes the generic
/// collectives instead of being run as an Ampere GPU under NCCL.
#[test]
fn amd_gpus_do_not_run_as_nccl_and_blackwell_does() {
    assert_eq!(Arch::of(&dev("mi300x")), None);
    let renamed = DeviceSpec { name: "my accelerator".into(), ..dev("mi300x") };
    assert_eq!(Arch::of(&renamed), None);
    assert_eq!(kernels::arch_of(&dev("mi300x")), None);
    assert!(NcclSystem::new(&ClusterSpec::new(node("mi300x-8"), 2)).is_none());
    assert!(Topology::new(&ClusterSpec::new(node("mi300x-8"), 1)).nccl().is_none());
    // An unknown NVIDIA GPU keeps the old default.
    let custom = DeviceSpec { name: "custom device".into(), ..dev("h100-sxm") };
    assert_eq!(Arch::of(&custom), Some(Arch::Ampere));

    for name in ["b200", "gb200"] {
        assert_eq!(Arch::of(&dev(name)), Some(Arch::Blackwell), "{name}");
        assert_eq!(kernels::arch_of(&dev(name)), Some(GpuArch::Blackwell), "{name}");
    }
    assert_eq!(Arch::of(&dev("h200-nvl")), Some(Arch::Hopper));
    assert_eq!(kernels::arch_of(&dev("h200-nvl")), Some(GpuArch::Hopper));
    // Blackwell borrows Hopper's kernels, said so in the sources.
    assert!(kernels::gemm_tiling(Some(GpuArch::Blackwell)).source.starts_with("assumed"));
    assert!(kernels::BLACKWELL_ATTENTION_SOURCE.starts_with("assumed"));
    let auto = kernels::FlashKernel::Auto.resolve(Some(GpuArch::Blackwell));
    let (rates, measured_on) = kernels::attention_rates(Some(GpuArch::Blackwell), auto);
    assert_eq!((rates.kernel, measured_on), (kernels::FlashKernel::Cudnn, GpuArch::Hopper));
}

/// GB200 NVL72 is one node of 72 GPUs on NVLink switches: every pair routes over the two
/// NVLink ports (never a NIC), each GPU has its own NIC, and NCCL sees one NVLS domain.
#[test]
fn a_72_gpu_nvlink_domain_is_one_switch() {
    let c = ClusterSpec::new(node("gb200-nvl72"), 2);
    let topo = Topology::new(&c);
    assert_eq!((topo.devices_per_node, topo.nodes, topo.nics), (72, 2, 72));
    let nvlink = c.node.intra_node.as_ref().expect("nvlink5").effective_bytes_per_s();
    for (a, b) in [(0, 71), (17, 53), (70, 3)] {
        assert!(topo.same_switch(a, b));
        let r = topo.route(a, b);
        assert_eq!(r.links(), &[2 * a, 2 * b + 1], "{a} -> {b}");
        eq(topo.capacities()[r.links[0] as usize], nvlink);
        assert_eq!(topo.pair_cap(a, b), f64::INFINITY);
    }
    // Across racks: each GPU through its own NIC.
    let nics: std::collections::BTreeSet<u32> = (0..72).map(|d| topo.nic_of(d)).collect();
    assert_eq!(nics.len(), 72);
    let r = topo.route(5, 72 + 5);
    assert_eq!(r.links(), &[topo.nic_out(0, 5), topo.nic_out(1, 5) + 1]);
    let sys = topo.nccl().expect("NVIDIA");
    assert!(sys.nvlink && sys.nvls);
    assert_eq!(sys.arch, Arch::Blackwell);
    eq(sys.intra_bytes_per_s, nvlink);
}

/// MI300X's mesh: each port carries 7 links, a pair of GPUs gets one, a collective step among
/// k of the node's GPUs gets k - 1.
#[test]
fn an_infinity_fabric_mesh_caps_flows_by_the_links_they_use() {
    let c = ClusterSpec::new(node("mi300x-8"), 2);
    let topo = Topology::new(&c);
    let link = c.node.intra_node.as_ref().expect("xgmi").effective_bytes_per_s();
    assert!(topo.is_mesh());
    eq(topo.capacities()[0], 7.0 * link);
    eq(topo.pair_cap(0, 1), link);
    assert_eq!(topo.pair_cap(0, 8), f64::INFINITY, "across nodes the NICs decide");
    assert_eq!(topo.pair_cap(3, 3), f64::INFINITY);
    eq(topo.group_cap(8), 7.0 * link);
    eq(topo.group_cap(2), link);

    let caps = |members: Vec<u32>, kind| {
        let steps = expand(&Collective::new(kind, members, 1e9), &topo);
        assert!(!steps.is_empty());
        steps.iter().flat_map(|s| s.flows.iter().map(|f| (f.source, f.target, f.cap_bytes_per_s))).collect::<Vec<_>>()
    };
    // All eight: seven links' worth per flow.
    for (_, _, cap) in caps((0..8).collect(), CollectiveKind::AllReduce) {
        eq(cap, 7.0 * link);
    }
    // Two GPUs of a node share one link; four share three.
    for (_, _, cap) in caps(vec![2, 6], CollectiveKind::AllGather) {
        eq(cap, link);
    }
    for (_, _, cap) in caps(vec![0, 1, 2, 3], CollectiveKind::ReduceScatter) {
        eq(cap, 3.0 * link);
    }
    // A broadcast chain hops over one link at a time.
    for (_, _, cap) in caps((0..8).collect(), CollectiveKind::Broadcast) {
        eq(cap, link);
    }
    // Across two nodes: the NIC rings are not capped, the in-node rings are.
    for (s, t, cap) in caps((0..16).collect(), CollectiveKind::AllReduce) {
        if topo.same_switch(s, t) {
            eq(cap, 7.0 * link);
        } else {
            assert_eq!(cap, f64::INFINITY);
        }
    }
    // A switch node is never capped.
    let h = Topology::new(&ClusterSpec::new(node("dgx-a100-80gb"), 1));
    assert_eq!(h.group_cap(2), f64::INFINITY);
}

/// The presets and `docs/reference/hardware_specs.json` (where their sources are recorded)
/// say the same: dense peaks, fp32 and memory bandwidth.
#[test]
fn catalog_agrees_with_the_reference_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/hardware_specs.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("JSON");
    let entry = |prefix: &str| {
        v["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .find(|g| g["gpu"].as_str().is_some_and(|n| n.starts_with(prefix)))
            .unwrap_or_else(|| panic!("no {prefix} entry"))
            .clone()
    };
    let num = |g: &serde_json::Value, k: &str| g[k].as_f64().unwrap_or_else(|| panic!("{k} in {g}"));
    for (preset, prefix, bf16_key, fp8_key, fp32_key) in [
        ("b200", "B200 SXM", "bf16_fp16_tensor_dense", "fp8_tensor_dense", "fp32"),
        ("gb200", "GB200", "bf16_fp16_tensor_dense", "fp8_tensor_dense", "fp32"),
        ("h200-nvl", "H200 NVL", "bf16_fp16_tensor_dense", "fp8_tensor_dense", "fp32"),
        ("mi300x", "AMD Instinct MI300X", "bf16_fp16_matrix_dense", "fp8_matrix_dense", "fp32_vector"),
    ] {
        let (d, g) = (dev(preset), entry(prefix));
        eq(d.peak_flops.at(Precision::Bf16), num(&g, bf16_key) * 1e12);
        eq(d.peak_flops.fp8.expect("fp8"), num(&g, fp8_key) * 1e12);
        eq(d.peak_flops.at(Precision::Fp32), num(&g, fp32_key) * 1e12);
        eq(d.mem_bandwidth_bytes_per_s, num(&g, "mem_bw_GBps") * 1e9);
        // Sparse rates are twice the dense ones the catalog stores.
        let sparse = if preset == "mi300x" { "bf16_fp16_matrix_sparse" } else { "bf16_fp16_tensor_sparse" };
        assert!((num(&g, sparse) / num(&g, bf16_key) - 2.0).abs() < 1e-3, "{preset}");
    }
}

/// A GPU's generation comes from the model number among its name's words, as the presets,
/// `nvidia-smi` and the export parts write them; the kernel model and NCCL's tables agree.
#[test]
fn gpu_generation_reads_the_model_number_in_any_name() {
    use kernels::generation_in_name as g;
    for (name, arch) in [
        ("h100-sxm", Some(GpuArch::Hopper)),
        ("NVIDIA H100 80GB HBM3", Some(GpuArch::Hopper)),
        ("NVIDIA H800", Some(GpuArch::Hopper)),
        ("H20", Some(GpuArch::Hopper)),
        ("gh200", Some(GpuArch::Hopper)),
        ("h200-nvl", Some(GpuArch::Hopper)),
        ("H100 96GB HBM2e, 500 W (Grand Teton)", Some(GpuArch::Hopper)),
        ("NVIDIA A800-SXM4-80GB", Some(GpuArch::Ampere)),
        ("a100-sxm-40gb", Some(GpuArch::Ampere)),
        ("gb200", Some(GpuArch::Blackwell)),
        ("b200", Some(GpuArch::Blackwell)),
        ("v100-sxm2-32gb", Some(GpuArch::Volta)),
        ("quadro-rtx5000", Some(GpuArch::Turing)),
        ("Quadro RTX 5000", Some(GpuArch::Turing)),
        ("Tesla T4", Some(GpuArch::Turing)),
        ("my cluster GPU", None),
        ("mi300x", None),
        ("th100x", None),
    ] {
        assert_eq!(g(name), arch, "{name}");
    }
    let nvidia = |name: &str| DeviceSpec { name: name.into(), ..catalog::device("h100-sxm").unwrap() };
    assert_eq!(Arch::of(&nvidia("NVIDIA H800")), Some(Arch::Hopper));
    assert_eq!(kernels::arch_of(&nvidia("NVIDIA H800")), Some(GpuArch::Hopper));
    assert_eq!(Arch::of(&nvidia("Tesla T4")), Some(Arch::Volta));
    // An NVIDIA GPU of no known generation: NCCL's Ampere row, the kernel model's generic one.
    assert_eq!(Arch::of(&nvidia("my cluster GPU")), Some(Arch::Ampere));
    assert_eq!(kernels::arch_of(&nvidia("my cluster GPU")), None);
}
