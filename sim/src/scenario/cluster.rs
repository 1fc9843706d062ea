//! `cluster`: devices, links and nodes (presets or described inline), the node count, the
//! inter-node network and per-device overrides of a heterogeneous cluster.

use super::keys;
use super::limits;
use super::reader::{Obj, Result, invalid, show};
use super::suggest::did_you_mean;
use crate::hardware::fabric::{self, Fabric};
use crate::hardware::nccl_env::NcclEnv;
use crate::hardware::{
    ClusterSpec, DeviceKind, DeviceSpec, FpgaFabric, IntraTopology, LinkSpec, NodeSpec, PeakFlops, Precision, Vendor,
    catalog,
};
use serde_json::Value;

fn parse_link(v: &Value, path: &str) -> Result<LinkSpec> {
    if let Value::String(name) = v {
        return catalog::link_preset(name).ok_or_else(|| {
            let names: Vec<String> = catalog::links().into_iter().map(|l| l.name).collect();
            let hint = did_you_mean(name, names.iter().map(String::as_str));
            invalid(path, format!("\"{name}\" is not a link preset{hint}; presets: {}", names.join(", ")))
        });
    }
    let o = Obj::new(v, path)?;
    o.only(keys::LINK)?;
    let mut link = match o.string("preset")? {
        Some(p) => parse_link(&Value::String(p.into()), &o.key("preset"))?,
        None => LinkSpec {
            name: "custom link".into(),
            bandwidth_bytes_per_s: o.req("bandwidth_bytes_per_s", Obj::positive)?,
            latency_s: 0.0,
            efficiency: 1.0,
            source: "scenario file".into(),
        },
    };
    if let Some(b) = o.positive("bandwidth_bytes_per_s")? {
        link.bandwidth_bytes_per_s = b;
    }
    if let Some(l) = o.non_negative("latency_s")? {
        link.latency_s = l;
    }
    if let Some(e) = o.fraction("efficiency")? {
        link.efficiency = e;
    }
    if let Some(n) = o.string("name")? {
        // NCCL's model reads NVLink from the name (`nccl::is_nvlink`): a renamed NVLink preset
        // keeps the preset's name in brackets.
        use crate::hardware::nccl::is_nvlink;
        link.name = if is_nvlink(&link.name) && !is_nvlink(n) { format!("{n} ({})", link.name) } else { n.into() };
    }
    Ok(link)
}

fn parse_device(v: &Value, path: &str) -> Result<DeviceSpec> {
    if let Value::String(name) = v {
        return catalog::device(name).ok_or_else(|| {
            let names: Vec<String> = catalog::devices().into_iter().map(|d| d.name).collect();
            let hint = did_you_mean(name, names.iter().map(String::as_str));
            invalid(path, format!("\"{name}\" is not a device preset{hint}; presets: {}", names.join(", ")))
        });
    }
    let o = Obj::new(v, path)?;
    o.only(keys::DEVICE)?;
    let mut d = match o.string("preset")? {
        Some(p) => parse_device(&Value::String(p.into()), &o.key("preset"))?,
        None => DeviceSpec {
            name: "custom device".into(),
            kind: DeviceKind::Gpu,
            vendor: Vendor::Nvidia,
            peak_flops: PeakFlops::default(),
            hbm_bytes: o.req("hbm_bytes", Obj::positive)?,
            mem_bandwidth_bytes_per_s: o.req("mem_bandwidth_bytes_per_s", Obj::positive)?,
            compute_units: 1,
            gemm_efficiency: 0.8,
            fp8_gemm_efficiency: None,
            mem_efficiency: 0.85,
            kernel_launch_s: 3e-6,
            fpga: None,
            op_efficiency: Vec::new(),
            power: None,
            source: "scenario file".into(),
        },
    };
    if let Some(k) = o.choice("kind", keys::DEVICE_KINDS, |s| match s {
        "gpu" => Some(DeviceKind::Gpu),
        "fpga" => Some(DeviceKind::Fpga),
        "cpu" => Some(DeviceKind::Cpu),
        _ => None,
    })? {
        d.kind = k;
    }
    if let Some(v) = o.choice("vendor", &Vendor::NAMES, Vendor::parse)? {
        d.vendor = v;
    }
    if o.has("dsp_count") || o.has("clock_hz") {
        let fabric = FpgaFabric {
            dsp_count: o.req("dsp_count", Obj::positive)?,
            clock_hz: o.req("clock_hz", Obj::positive)?,
            ops_per_dsp_per_cycle: o.positive("ops_per_dsp_per_cycle")?.unwrap_or(1.0),
            sram_bytes: o.non_negative("sram_bytes")?.unwrap_or(0.0),
        };
        let p = fabric.peak_flops();
        d.kind = DeviceKind::Fpga;
        d.peak_flops = PeakFlops { fp32: Some(0.4 * p), fp16: Some(p), bf16: Some(p), fp8: Some(2.0 * p) };
        d.fpga = Some(fabric);
    }
    match o.get("peak_flops") {
        None => {}
        Some(Value::Number(_)) => {
            let p = o.positive("peak_flops")?.unwrap_or(0.0);
            d.peak_flops = PeakFlops { fp32: Some(p), fp16: Some(p), bf16: Some(p), fp8: Some(p) };
        }
        Some(_) => {
            let po = o.req("peak_flops", Obj::obj)?;
            po.only(keys::PEAK_FLOPS)?;
            d.peak_flops = PeakFlops {
                fp32: po.positive("fp32")?,
                fp16: po.positive("fp16")?,
                bf16: po.positive("bf16")?,
                fp8: po.positive("fp8")?,
            };
        }
    }
    if d.peak_flops.at(Precision::Fp32) <= 0.0 && d.peak_flops.fp16.is_none() && d.peak_flops.bf16.is_none() {
        return Err(invalid(
            &o.key("peak_flops"),
            "required: a number, or an object with fp32/fp16/bf16/fp8 rates in FLOP/s (or dsp_count and clock_hz for an FPGA)",
        ));
    }
    if let Some(x) = o.positive("hbm_bytes")? {
        d.hbm_bytes = x;
    }
    if let Some(x) = o.positive("mem_bandwidth_bytes_per_s")? {
        d.mem_bandwidth_bytes_per_s = x;
    }
    if let Some(x) = o.uint("compute_units")? {
        d.compute_units = x;
    }
    if let Some(x) = o.fraction("gemm_efficiency")? {
        d.gemm_efficiency = x;
    }
    if let Some(x) = o.fraction("fp8_gemm_efficiency")? {
        d.fp8_gemm_efficiency = Some(x);
    }
    if let Some(x) = o.fraction("mem_efficiency")? {
        d.mem_efficiency = x;
    }
    if let Some(x) = o.non_negative("kernel_launch_s")? {
        d.kernel_launch_s = x;
    }
    if let Some(rated) = o.positive("rated_power_w")? {
        d.power = Some(crate::hardware::power::Power::rated(rated, None));
    }
    if d.kind != DeviceKind::Gpu && (o.has("power_limit_w") || o.has("rated_power_w")) {
        let key = if o.has("power_limit_w") { "power_limit_w" } else { "rated_power_w" };
        return Err(invalid(
            &o.key(key),
            format!(
                "board power is modelled for GPUs only; this device is {}",
                if d.kind == DeviceKind::Cpu { "a CPU" } else { "an FPGA" }
            ),
        ));
    }
    if let Some(limit) = o.positive("power_limit_w")? {
        let Some(p) = d.power.as_mut() else {
            return Err(invalid(
                &o.key("power_limit_w"),
                "needs rated_power_w too (the board power this device's compute rates were measured at); \
                 the catalog's GPU presets carry theirs",
            ));
        };
        if limit <= p.idle_w {
            return Err(invalid(
                &o.key("power_limit_w"),
                format!(
                    "{limit} W is not above the device's idle draw ({:.0} W): nothing would be left to compute",
                    p.idle_w
                ),
            ));
        }
        p.limit_w = limit;
    }
    if let Some(n) = o.string("name")? {
        // The kernel model and NCCL's tables read a GPU's generation from its name
        // (`kernels::generation_in_name`): a name without a model number keeps the preset's
        // in brackets, so a renamed H100 still runs as one.
        let kept = crate::hardware::kernels::generation_in_name(&d.name);
        d.name = if kept.is_some() && crate::hardware::kernels::generation_in_name(n).is_none() {
            format!("{n} ({})", d.name)
        } else {
            n.into()
        };
    }
    if let Some(eff) = o.obj("op_efficiency")? {
        let mut v = Vec::new();
        for name in eff.map.keys() {
            v.push((name.clone(), eff.fraction(name)?.unwrap_or(1.0)));
        }
        d.op_efficiency = v;
    }
    Ok(d)
}

pub(super) fn parse_node(v: &Value, path: &str) -> Result<NodeSpec> {
    if let Value::String(name) = v {
        return catalog::node_preset(name).ok_or_else(|| {
            let names: Vec<String> = catalog::nodes().into_iter().map(|n| n.name).collect();
            let hint = did_you_mean(name, names.iter().map(String::as_str));
            invalid(path, format!("\"{name}\" is not a node preset{hint}; presets: {}", names.join(", ")))
        });
    }
    let o = Obj::new(v, path)?;
    o.only(keys::NODE)?;
    let mut n = match o.string("preset")? {
        Some(p) => parse_node(&Value::String(p.into()), &o.key("preset"))?,
        None => NodeSpec {
            name: "custom node".into(),
            device: parse_device(
                o.get("device").ok_or_else(|| invalid(&o.key("device"), "required key is missing"))?,
                &o.key("device"),
            )?,
            devices: o.req("devices", Obj::uint)?,
            intra_node: None,
            intra_topology: IntraTopology::Switch,
            nics: 1,
            nic: catalog::link_preset("ib-hdr").expect("preset"),
            host: crate::hardware::HostSpec {
                dram_bytes: 512.0 * 1024f64.powi(3),
                pcie: catalog::link_preset("pcie4").expect("preset"),
                cpu: Some(catalog::host_cpu()),
                nvme_bytes: 15e12,
                nvme_bandwidth_bytes_per_s: 25e9,
            },
        },
    };
    if let Some(d) = o.get("device") {
        n.device = parse_device(d, &o.key("device"))?;
    }
    if let Some(d) = o.uint("devices")? {
        n.devices = d;
    }
    if o.has("intra_node") {
        n.intra_node = o.get("intra_node").map(|l| parse_link(l, &o.key("intra_node"))).transpose()?;
    }
    if let Some(t) = o.choice("intra_topology", &IntraTopology::NAMES, IntraTopology::parse)? {
        n.intra_topology = t;
    }
    if n.devices > 1 && n.intra_node.is_none() {
        return Err(invalid(
            &o.key("intra_node"),
            format!(
                "a node of {} devices needs a link between them (a link preset or {{\"bandwidth_bytes_per_s\", \"latency_s\"}})",
                n.devices
            ),
        ));
    }
    if let Some(k) = o.uint("nics")? {
        n.nics = k;
    }
    if let Some(l) = o.get("nic") {
        n.nic = parse_link(l, &o.key("nic"))?;
    }
    if let Some(l) = o.get("pcie") {
        n.host.pcie = parse_link(l, &o.key("pcie"))?;
    }
    if let Some(b) = o.positive("host_dram_bytes")? {
        n.host.dram_bytes = b;
    }
    if let Some(s) = o.string("name")? {
        n.name = s.into();
    }
    Ok(n)
}

/// `cluster.fabric`: a preset's name, or an object (a preset's values overridden, or all
/// given).
fn parse_fabric(v: &Value, path: &str) -> Result<Fabric> {
    let preset = |name: &str, at: &str| {
        Fabric::preset(name).ok_or_else(|| {
            let hint = did_you_mean(name, fabric::PRESETS.iter().copied());
            invalid(at, format!("\"{name}\" is not a fabric preset{hint}; presets: {}", fabric::PRESETS.join(", ")))
        })
    };
    if let Value::String(name) = v {
        return preset(name, path);
    }
    let o = Obj::new(v, path)?;
    o.only(keys::FABRIC)?;
    let mut f = match o.string("preset")? {
        Some(name) => preset(name, &o.key("preset"))?,
        None => Fabric {
            name: "custom".into(),
            pod_nodes: o.req("pod_nodes", Obj::uint)?,
            oversubscription: 1.0,
            rail_optimized: false,
            extra_latency_s: 0.0,
        },
    };
    if let Some(n) = o.uint("pod_nodes")? {
        f.pod_nodes = n;
    }
    if f.pod_nodes == 0 {
        return Err(invalid(&o.key("pod_nodes"), "0; allowed: an integer >= 1 (nodes in one pod)"));
    }
    if let Some(r) = o.positive("oversubscription")? {
        if !(1.0..=1024.0).contains(&r) {
            return Err(invalid(
                &o.key("oversubscription"),
                format!("{r}; allowed: 1 (non-blocking) to 1024 (a pod's NIC bandwidth over its uplinks)"),
            ));
        }
        f.oversubscription = r;
    }
    if let Some(b) = o.boolean("rail_optimized")? {
        f.rail_optimized = b;
    }
    if let Some(l) = o.non_negative("extra_latency_s")? {
        if l > 1e-3 {
            return Err(invalid(&o.key("extra_latency_s"), format!("{l} s; allowed: 0 to 1e-3 s")));
        }
        f.extra_latency_s = l;
    }
    Ok(f)
}

pub(super) fn parse_cluster(o: &Obj) -> Result<ClusterSpec> {
    o.only(keys::CLUSTER)?;
    let node_v = o
        .get("node")
        .ok_or_else(|| invalid(&o.key("node"), "required key is missing (a node preset or a node description)"))?;
    let mut node = parse_node(node_v, &o.key("node"))?;
    let nodes = o.req("nodes", Obj::uint)?;
    limits::device_count(nodes, node.devices, &o.key("nodes"))?;
    if let Some(l) = o.get("inter_node") {
        node.nic = parse_link(l, &o.key("inter_node"))?;
        if let Some(k) =
            Obj::new(l, &o.key("inter_node")).ok().and_then(|lo| lo.map.get("nics").and_then(Value::as_u64))
        {
            node.nics = u32::try_from(k).ok().filter(|k| (1..=limits::MAX_NICS).contains(k)).ok_or_else(|| {
                invalid(&format!("{}.nics", o.key("inter_node")), format!("{k}; allowed: 1 to {}", limits::MAX_NICS))
            })?;
        }
    }
    let mut cluster = ClusterSpec::new(node, nodes);
    if let Some(v) = o.get("fabric") {
        cluster.fabric = Some(parse_fabric(v, &o.key("fabric"))?);
    }
    if let Some(no) = o.obj("nccl")? {
        no.only(keys::NCCL)?;
        let (algo, proto) = (no.string("algo")?, no.string("proto")?);
        NcclEnv::parse(algo, None).map_err(|e| invalid(&no.key("algo"), e))?;
        let env = NcclEnv::parse(algo, proto).map_err(|e| invalid(&no.key("proto"), e))?;
        let (version, connect) = (no.string("version")?, no.boolean("runtime_connect")?);
        cluster.nccl = env
            .with_release(version, None)
            .map_err(|e| invalid(&no.key("version"), e))?
            .with_release(None, connect)
            .map_err(|e| invalid(&no.key("runtime_connect"), e))?;
    }
    if let Some(v) = o.get("device_overrides") {
        let key = o.key("device_overrides");
        let items = v.as_array().ok_or_else(|| {
            invalid(
                &key,
                format!("expected a list of {{\"devices\": [first, last], \"device\": ...}}, got {}", show(v)),
            )
        })?;
        for (i, it) in items.iter().enumerate() {
            let io = Obj::new(it, &format!("{key}[{i}]"))?;
            io.only(keys::DEVICE_OVERRIDE)?;
            let range = io
                .get("devices")
                .and_then(Value::as_array)
                .filter(|a| a.len() == 2)
                .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)));
            let (first, last) =
                range.filter(|(a, b)| a <= b && *b < cluster.device_count() as u64).ok_or_else(|| {
                    invalid(
                        &io.key("devices"),
                        format!("expected [first, last] device ids within 0..{}", cluster.device_count()),
                    )
                })?;
            let dv = io.get("device").ok_or_else(|| invalid(&io.key("device"), "required key is missing"))?;
            let device = parse_device(dv, &io.key("device"))?;
            cluster.overrides.push(crate::hardware::DeviceOverride {
                first: first as u32,
                count: (last - first + 1) as u32,
                device,
            });
        }
    }
    Ok(cluster)
}
