//! The hardware the simulator runs on: devices (GPU, FPGA, CPU), links, nodes and clusters.
//!
//! A [`ClusterSpec`] is `nodes` identical [`NodeSpec`]s. Inside a node every device has one
//! full-duplex port to a non-blocking switch (NVSwitch, or a PCIe switch for PCIe-only rigs);
//! between nodes each node has `nics` full-duplex NICs into a non-blocking fabric. The
//! [`Topology`] turns this into numbered links and routes a transfer between two devices onto
//! them:
//!
//! ```text
//!   node 0                                   node 1
//!   dev0 ─port─┐                       ┌─port─ dev8
//!   dev1 ─port─┤ switch     fabric     ├─port─ dev9
//!   ...        ┘   nic0 ════════════ nic0  └ ...
//! ```
//!
//! A node whose devices are wired point to point instead ([`IntraTopology::Mesh`]: AMD Infinity
//! Fabric, every pair of GPUs joined by its own link) keeps that picture with each port the sum
//! of the device's links to its n - 1 peers, and each flow between two devices of the node no
//! faster than the links it can really use: one link for a transfer between a pair, k - 1 links
//! for a collective step among k of the node's devices (each sends to all its peers at once, as
//! RCCL's channels spread over the mesh) ([`Topology::pair_cap`], [`Topology::group_cap`]).
//!
//! Presets live in [`catalog`]; a scenario may also describe its own devices, nodes and links.

pub mod catalog;
pub mod fabric;
pub mod kernels;
pub mod nccl;
pub mod nccl_env;
pub mod nccl_memory;
pub mod nccl_p2p;
pub mod power;
#[cfg(test)]
mod tests;

use serde::Serialize;

/// Numeric precision of the training math.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Fp16,
    Bf16,
    Fp8,
}

impl Precision {
    pub const NAMES: [&'static str; 4] = ["fp32", "fp16", "bf16", "fp8"];

    pub fn parse(name: &str) -> Option<Precision> {
        Some(match name {
            "fp32" => Precision::Fp32,
            "fp16" => Precision::Fp16,
            "bf16" => Precision::Bf16,
            "fp8" => Precision::Fp8,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
        }
    }

    /// Bytes of one activation or low-precision weight element. FP8 training keeps
    /// activations and weights in 16 bits outside the GEMMs (as Transformer Engine does).
    pub fn activation_bytes(self) -> f64 {
        match self {
            Precision::Fp32 => 4.0,
            _ => 2.0,
        }
    }
}

/// What kind of silicon a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Gpu,
    Fpga,
    Cpu,
}

/// Who makes a device, which decides its software stack: collectives run as NCCL runs them on
/// NVIDIA GPUs only ([`nccl::Arch::of`]); an AMD GPU (RCCL, whose tuning differs from NCCL's)
/// and any other device use the generic ring and hierarchical collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Nvidia,
    Amd,
    Other,
}

impl Vendor {
    /// Values of a device's `vendor`.
    pub const NAMES: [&'static str; 3] = ["nvidia", "amd", "other"];

    pub fn parse(name: &str) -> Option<Vendor> {
        Some(match name {
            "nvidia" => Vendor::Nvidia,
            "amd" => Vendor::Amd,
            "other" => Vendor::Other,
            _ => return None,
        })
    }
}

/// How a node's devices are wired to each other over `NodeSpec::intra_node`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IntraTopology {
    /// `intra_node` is each device's port into a non-blocking switch (NVSwitch, a PCIe switch).
    #[default]
    Switch,
    /// `intra_node` is one direct link between each pair of devices (a full mesh: AMD
    /// Infinity Fabric on an 8 x MI300X platform); each device has n - 1 of them.
    Mesh,
}

impl IntraTopology {
    /// Values of a node's `intra_topology`.
    pub const NAMES: [&'static str; 2] = ["switch", "mesh"];

    pub fn parse(name: &str) -> Option<IntraTopology> {
        Some(match name {
            "switch" => IntraTopology::Switch,
            "mesh" => IntraTopology::Mesh,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            IntraTopology::Switch => "switch",
            IntraTopology::Mesh => "mesh",
        }
    }
}

/// Dense peak rates per precision, in FLOP/s. `None` where the device has no such unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PeakFlops {
    pub fp32: Option<f64>,
    pub fp16: Option<f64>,
    pub bf16: Option<f64>,
    pub fp8: Option<f64>,
}

impl PeakFlops {
    /// The rate used for matrix math at `p`, falling back to the next wider format the
    /// device supports (a V100 runs bf16 workloads at its fp16 tensor rate would be wrong:
    /// it has no bf16, so it falls back to fp32).
    /// Set the rate at `p`.
    pub fn set(&mut self, p: Precision, flops_per_s: f64) {
        let slot = match p {
            Precision::Fp8 => &mut self.fp8,
            Precision::Bf16 => &mut self.bf16,
            Precision::Fp16 => &mut self.fp16,
            Precision::Fp32 => &mut self.fp32,
        };
        *slot = Some(flops_per_s);
    }

    pub fn at(&self, p: Precision) -> f64 {
        let chain: &[Option<f64>] = match p {
            Precision::Fp8 => &[self.fp8, self.bf16, self.fp16, self.fp32],
            Precision::Bf16 => &[self.bf16, self.fp32],
            Precision::Fp16 => &[self.fp16, self.fp32],
            Precision::Fp32 => &[self.fp32],
        };
        chain.iter().flatten().copied().next().unwrap_or(0.0)
    }
}

/// FPGA compute described by its fabric: peak = dsp_count x clock x ops per DSP per cycle.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FpgaFabric {
    pub dsp_count: f64,
    pub clock_hz: f64,
    /// Multiply-accumulates count as 2 operations.
    pub ops_per_dsp_per_cycle: f64,
    pub sram_bytes: f64,
}

impl FpgaFabric {
    pub fn peak_flops(&self) -> f64 {
        self.dsp_count * self.clock_hz * self.ops_per_dsp_per_cycle
    }
}

/// One compute device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceSpec {
    pub name: String,
    pub kind: DeviceKind,
    pub vendor: Vendor,
    pub peak_flops: PeakFlops,
    /// Capacity of the device's own (first-tier) memory.
    pub hbm_bytes: f64,
    pub mem_bandwidth_bytes_per_s: f64,
    /// Parallel compute units (SMs); drives wave quantization of GEMMs.
    pub compute_units: u32,
    /// Fraction of peak a large, well-shaped GEMM reaches (cuBLAS-class kernels), at 16 bits.
    pub gemm_efficiency: f64,
    /// The same fraction of the fp8 peak for fp8 GEMMs, where it differs (none: `gemm_efficiency`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fp8_gemm_efficiency: Option<f64>,
    /// Fraction of memory bandwidth a streaming kernel reaches.
    pub mem_efficiency: f64,
    /// Fixed cost of starting one kernel.
    pub kernel_launch_s: f64,
    pub fpga: Option<FpgaFabric>,
    /// Efficiency factors per op name (`conv`, `fc`, `lstm_step`, `qkv`, ...) applied on top of
    /// the GEMM efficiency: how well the device's datapath suits each kind of op (an FPGA's
    /// systolic array maps convolutions better than batch-limited fully connected layers).
    pub op_efficiency: Vec<(String, f64)>,
    /// Board power: rated, idle, and the limit it runs at (GPUs of the catalog; none: the
    /// compute rates hold as given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power: Option<power::Power>,
    /// Where the numbers come from.
    pub source: String,
}

impl DeviceSpec {
    /// Fraction of the `precision` peak a large GEMM at that precision reaches.
    pub fn gemm_efficiency_at(&self, precision: Precision) -> f64 {
        match precision {
            Precision::Fp8 => self.fp8_gemm_efficiency.unwrap_or(self.gemm_efficiency),
            _ => self.gemm_efficiency,
        }
    }
}

/// One direction of a full-duplex link (each direction has this bandwidth).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinkSpec {
    pub name: String,
    /// Line rate per direction.
    pub bandwidth_bytes_per_s: f64,
    pub latency_s: f64,
    /// Fraction of the line rate a large transfer achieves (protocol overhead).
    pub efficiency: f64,
    pub source: String,
}

impl LinkSpec {
    pub fn effective_bytes_per_s(&self) -> f64 {
        self.bandwidth_bytes_per_s * self.efficiency
    }
}

/// The host side of a node: DRAM and the PCIe link of each device to it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostSpec {
    pub dram_bytes: f64,
    pub pcie: LinkSpec,
    pub cpu: Option<DeviceSpec>,
    pub nvme_bytes: f64,
    pub nvme_bandwidth_bytes_per_s: f64,
}

/// A node: `devices` identical devices on one switch, `nics` NICs to the fabric.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeSpec {
    pub name: String,
    pub device: DeviceSpec,
    pub devices: u32,
    /// Each device's port to the node's switch, or with [`IntraTopology::Mesh`] the link
    /// between each pair of devices; `None` when devices cannot talk inside the node except
    /// through the NIC (one device per node).
    pub intra_node: Option<LinkSpec>,
    pub intra_topology: IntraTopology,
    pub nics: u32,
    pub nic: LinkSpec,
    pub host: HostSpec,
}

impl NodeSpec {
    /// Links behind each device's port: its n - 1 links to its peers in a mesh, one port to
    /// the switch otherwise.
    pub fn links_per_port(&self) -> f64 {
        match self.intra_topology {
            IntraTopology::Switch => 1.0,
            IntraTopology::Mesh => self.devices.saturating_sub(1).max(1) as f64,
        }
    }

    /// Line rate of a device's whole port inside the node, per direction (all its mesh links).
    pub fn intra_port_bytes_per_s(&self) -> Option<f64> {
        self.intra_node.as_ref().map(|l| l.bandwidth_bytes_per_s * self.links_per_port())
    }

    /// The effective rate (per direction) each of `members` devices of this node reaches in a
    /// collective among them: the port, or in a mesh the members - 1 links to the others.
    pub fn intra_group_bytes_per_s(&self, members: u32) -> Option<f64> {
        let l = self.intra_node.as_ref()?;
        let links = match self.intra_topology {
            IntraTopology::Switch => 1.0,
            IntraTopology::Mesh => members.clamp(2, self.devices.max(2)).saturating_sub(1) as f64,
        };
        Some(l.effective_bytes_per_s() * links)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClusterSpec {
    pub node: NodeSpec,
    pub nodes: u32,
    /// Devices that differ from the node's (a heterogeneous cluster): ranges of device ids.
    pub overrides: Vec<DeviceOverride>,
    /// The network above the nodes; `None`: one non-blocking switch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fabric: Option<fabric::Fabric>,
    /// The algorithms and protocols NCCL may use (`NCCL_ALGO`, `NCCL_PROTO`; all by default).
    #[serde(skip_serializing_if = "nccl_env::NcclEnv::is_default")]
    pub nccl: nccl_env::NcclEnv,
}

/// Devices `first..first + count` are `device` instead of the node's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceOverride {
    pub first: u32,
    pub count: u32,
    pub device: DeviceSpec,
}

impl ClusterSpec {
    pub fn new(node: NodeSpec, nodes: u32) -> ClusterSpec {
        ClusterSpec { node, nodes, overrides: Vec::new(), fabric: None, nccl: nccl_env::NcclEnv::default() }
    }

    /// Devices in the cluster; bounded when the scenario is read
    /// (`scenario::limits::MAX_DEVICES`), so it fits a u32.
    pub fn device_count(&self) -> u32 {
        u32::try_from(self.node.devices as u64 * self.nodes as u64).expect("device count bounded at read time")
    }

    /// Device class of a device: 0 for the node's device, i + 1 for override i.
    pub fn class_of(&self, device: u32) -> u16 {
        self.overrides.iter().position(|o| device >= o.first && device < o.first + o.count).map_or(0, |i| i as u16 + 1)
    }

    /// The spec of a device class.
    pub fn class(&self, class: u16) -> &DeviceSpec {
        if class == 0 { &self.node.device } else { &self.overrides[class as usize - 1].device }
    }

    pub fn device_of(&self, device: u32) -> &DeviceSpec {
        self.class(self.class_of(device))
    }

    /// Every device class: the node's device, then each override's.
    pub fn classes(&self) -> impl Iterator<Item = &DeviceSpec> {
        std::iter::once(&self.node.device).chain(self.overrides.iter().map(|o| &o.device))
    }

    pub fn has_kind(&self, kind: DeviceKind) -> bool {
        self.classes().any(|d| d.kind == kind)
    }
}

pub type LinkId = u32;

/// Numbered links of a cluster and routes between devices.
///
/// Link numbering: per device `2*d` (port out) and `2*d+1` (port in); then per node and NIC
/// `base + 2*(node*nics + k)` (NIC out) and `+1` (NIC in); then per device its PCIe link to
/// the host, down (`pcie_base + 2*d`) and up (`+1`); then per node its NVMe drives, read
/// (`nvme_base + 2*node`) and write (`+1`).
#[derive(Clone, Debug)]
pub struct Topology {
    pub devices_per_node: u32,
    pub nodes: u32,
    pub nics: u32,
    nic_base: u32,
    pcie_base: u32,
    nvme_base: u32,
    capacity_bytes_per_s: Vec<f64>,
    latency_s: Vec<f64>,
    has_intra: bool,
    /// Effective rate of one mesh link between two devices of a node (a mesh node only).
    mesh_link_bytes_per_s: Option<f64>,
    /// SMs of each GPU (0 for other devices): what communication kernels take from compute.
    sms: Vec<u32>,
    /// Each device's GPU architecture (`kernels::arch_of`; none for other devices).
    arch: Vec<Option<kernels::GpuArch>>,
    /// Memory bandwidth a streaming kernel reaches on each GPU (bytes/s; 0 for other
    /// devices): what communication kernels' copies take from memory-bound compute.
    hbm_bytes_per_s: Vec<f64>,
    /// How NCCL sees the cluster (GPU clusters only): collectives run as NCCL runs them.
    nccl: Option<nccl::NcclSystem>,
    /// The pods of `cluster.fabric`, if any.
    pods: Option<Pods>,
}

/// `cluster.fabric` as the topology uses it (see [`fabric`]).
#[derive(Clone, Debug)]
struct Pods {
    pod_nodes: u32,
    rail: bool,
    extra_latency_s: f64,
    oversubscription: f64,
}

/// A route: at most two links, plus the summed latency.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Route {
    pub links: [LinkId; 2],
    pub len: u8,
    pub latency_s: f64,
}

impl Route {
    pub fn links(&self) -> &[LinkId] {
        &self.links[..self.len as usize]
    }
}

impl Topology {
    pub fn new(cluster: &ClusterSpec) -> Topology {
        let n = cluster.node.devices;
        let devices = cluster.device_count();
        let nics = cluster.node.nics.max(1);
        let nic_base = 2 * devices;
        let pcie_base = nic_base + 2 * cluster.nodes * nics;
        let nvme_base = pcie_base + 2 * devices;
        let total = nvme_base + 2 * cluster.nodes;
        let mut capacity = vec![0.0; total as usize];
        let mut latency = vec![0.0; total as usize];
        let intra = cluster.node.intra_node.as_ref();
        // A mesh device's port carries all its links to its peers.
        let port_links = cluster.node.links_per_port();
        for d in 0..2 * devices {
            if let Some(l) = intra {
                capacity[d as usize] = l.effective_bytes_per_s() * port_links;
                latency[d as usize] = l.latency_s;
            }
        }
        let mesh = cluster.node.intra_topology == IntraTopology::Mesh;
        for i in nic_base..pcie_base {
            capacity[i as usize] = cluster.node.nic.effective_bytes_per_s();
            latency[i as usize] = cluster.node.nic.latency_s;
        }
        for i in pcie_base..nvme_base {
            capacity[i as usize] = cluster.node.host.pcie.effective_bytes_per_s();
            latency[i as usize] = cluster.node.host.pcie.latency_s;
        }
        for i in nvme_base..total {
            capacity[i as usize] = cluster.node.host.nvme_bandwidth_bytes_per_s;
            latency[i as usize] = 20e-6;
        }
        Topology {
            devices_per_node: n,
            nodes: cluster.nodes,
            nics,
            nic_base,
            pcie_base,
            nvme_base,
            capacity_bytes_per_s: capacity,
            latency_s: latency,
            has_intra: intra.is_some(),
            mesh_link_bytes_per_s: intra.filter(|_| mesh).map(LinkSpec::effective_bytes_per_s),
            sms: (0..devices)
                .map(|d| {
                    let dev = cluster.device_of(d);
                    if dev.kind == DeviceKind::Gpu { dev.compute_units } else { 0 }
                })
                .collect(),
            arch: (0..devices).map(|d| kernels::arch_of(cluster.device_of(d))).collect(),
            hbm_bytes_per_s: (0..devices)
                .map(|d| {
                    let dev = cluster.device_of(d);
                    if dev.kind == DeviceKind::Gpu { dev.mem_bandwidth_bytes_per_s * dev.mem_efficiency } else { 0.0 }
                })
                .collect(),
            nccl: nccl::NcclSystem::new(cluster),
            pods: cluster.fabric.as_ref().map(|f| Pods {
                pod_nodes: f.pod_nodes.max(1),
                rail: f.rail_optimized,
                extra_latency_s: f.extra_latency_s,
                oversubscription: f.oversubscription.max(1.0),
            }),
        }
    }

    /// Whether the cluster has a fabric of pods (`cluster.fabric`).
    pub fn has_pods(&self) -> bool {
        self.pods.is_some()
    }

    /// Whether a flow from `a` to `b` goes through the level above the pods: they sit in
    /// different pods, or (rail-optimised) on different rails of two nodes, unless the
    /// flow keeps to one rail whatever the devices' NICs (`rail_matched`: NCCL's rings).
    pub fn crosses_pods(&self, a: u32, b: u32, rail_matched: bool) -> bool {
        let Some(p) = &self.pods else { return false };
        let (na, nb) = (self.node_of(a), self.node_of(b));
        na != nb
            && (na / p.pod_nodes != nb / p.pod_nodes || (p.rail && !rail_matched && self.nic_of(a) != self.nic_of(b)))
    }

    /// The uplinks a device's flows leave its pod by (rail-optimised: its rail's leaf's),
    /// as (pod, rail), and their bandwidth to the level above: the NICs below them over the
    /// oversubscription.
    pub fn uplink(&self, device: u32) -> Option<((u32, u32), f64)> {
        let p = self.pods.as_ref()?;
        let node = self.node_of(device);
        let pod = node / p.pod_nodes;
        let nodes_in_pod = p.pod_nodes.min(self.nodes - pod * p.pod_nodes);
        let (rail, nics) = if p.rail { (self.nic_of(device), 1) } else { (0, self.nics) };
        let bytes_per_s = f64::from(nodes_in_pod * nics) * self.nic_bytes_per_s() / p.oversubscription;
        Some(((pod, rail), bytes_per_s))
    }

    /// Latency the level above the pods adds to a flow that crosses it.
    pub fn pod_latency_s(&self) -> f64 {
        self.pods.as_ref().map_or(0.0, |p| p.extra_latency_s)
    }

    /// The topology as one of `share` devices that share each node's NVMe drives with
    /// identical flows sees it: the drives' bandwidth over `share` (symmetry's mirrors; see
    /// `lower::nvme_mirrors`).
    pub fn with_nvme_share(mut self, share: u32) -> Topology {
        for c in &mut self.capacity_bytes_per_s[self.nvme_base as usize..] {
            *c /= f64::from(share.max(1));
        }
        self
    }

    pub fn link_count(&self) -> usize {
        self.capacity_bytes_per_s.len()
    }

    pub fn capacities(&self) -> &[f64] {
        &self.capacity_bytes_per_s
    }

    /// SMs of `device` when it is a GPU, else 0.
    pub fn sms(&self, device: u32) -> u32 {
        self.sms[device as usize]
    }

    /// `device`'s GPU architecture, if it is an NVIDIA GPU the catalog knows.
    pub fn arch(&self, device: u32) -> Option<kernels::GpuArch> {
        self.arch[device as usize]
    }

    /// Which of `device`'s compute kernels hold every SM until they end
    /// ([`kernels::persistent_kernels`]): what a communication kernel waits for.
    pub fn persistent(&self, device: u32) -> kernels::Persistent {
        kernels::persistent_kernels(self.arch(device))
    }

    /// Memory bandwidth a streaming kernel reaches on `device` when it is a GPU, else 0.
    pub fn hbm_bytes_per_s(&self, device: u32) -> f64 {
        self.hbm_bytes_per_s[device as usize]
    }

    pub fn nccl(&self) -> Option<&nccl::NcclSystem> {
        self.nccl.as_ref()
    }

    /// Effective bandwidth of one NIC, per direction.
    pub fn nic_bytes_per_s(&self) -> f64 {
        self.capacity_bytes_per_s[self.nic_base as usize]
    }

    pub fn node_of(&self, device: u32) -> u32 {
        device / self.devices_per_node
    }

    /// The NIC a device uses: devices are spread evenly over the node's NICs.
    pub fn nic_of(&self, device: u32) -> u32 {
        let local = device % self.devices_per_node;
        local * self.nics / self.devices_per_node
    }

    pub fn nic_out(&self, node: u32, nic: u32) -> LinkId {
        self.nic_base + 2 * (node * self.nics + nic)
    }

    pub fn pcie_down(&self, device: u32) -> LinkId {
        self.pcie_base + 2 * device
    }

    pub fn pcie_up(&self, device: u32) -> LinkId {
        self.pcie_base + 2 * device + 1
    }

    /// The node's NVMe drives: reading (`write == false`) or writing.
    pub fn nvme(&self, node: u32, write: bool) -> LinkId {
        self.nvme_base + 2 * node + u32::from(write)
    }

    /// Route of a copy between a device and its host's DRAM (or NVMe behind it).
    pub fn host_route(&self, device: u32, to_device: bool, nvme: bool) -> Route {
        let pcie = if to_device { self.pcie_down(device) } else { self.pcie_up(device) };
        let lat = self.latency_s[pcie as usize];
        if nvme {
            let n = self.nvme(self.node_of(device), !to_device);
            Route { links: [pcie, n], len: 2, latency_s: lat + self.latency_s[n as usize] }
        } else {
            Route { links: [pcie, pcie], len: 1, latency_s: lat }
        }
    }

    /// Route of a transfer from `source` to `target` (distinct devices).
    pub fn route(&self, source: u32, target: u32) -> Route {
        debug_assert_ne!(source, target);
        let (a, b) = if self.node_of(source) == self.node_of(target) && self.has_intra {
            (2 * source, 2 * target + 1)
        } else {
            let out = self.nic_out(self.node_of(source), self.nic_of(source));
            let inn = self.nic_out(self.node_of(target), self.nic_of(target)) + 1;
            (out, inn)
        };
        let above = if self.crosses_pods(source, target, false) { self.pod_latency_s() } else { 0.0 };
        Route { links: [a, b], len: 2, latency_s: self.latency_s[a as usize].max(self.latency_s[b as usize]) + above }
    }

    /// The link that plays `link`'s part for the device that `map` sends each device to
    /// (used to fold a symmetric replica's traffic onto the simulated one).
    pub fn map_link(&self, link: LinkId, map: &dyn Fn(u32) -> u32) -> LinkId {
        let parity = link % 2;
        if link < self.nic_base {
            2 * map(link / 2) + parity
        } else if link < self.pcie_base {
            let idx = (link - self.nic_base) / 2;
            let (node, nic) = (idx / self.nics, idx % self.nics);
            let local = (nic * self.devices_per_node).div_ceil(self.nics);
            let m = map(node * self.devices_per_node + local);
            self.nic_out(self.node_of(m), self.nic_of(m)) + parity
        } else if link < self.nvme_base {
            self.pcie_base + 2 * map((link - self.pcie_base) / 2) + parity
        } else {
            let node = (link - self.nvme_base) / 2;
            self.nvme(self.node_of(map(node * self.devices_per_node)), parity == 1)
        }
    }

    /// A readable name for a link ("dev3 port out", "node1 nic0 in", "dev3 pcie down").
    pub fn link_name(&self, link: LinkId) -> String {
        let dir = if link.is_multiple_of(2) { "out" } else { "in" };
        if link < self.nic_base {
            format!("dev{} port {dir}", link / 2)
        } else if link < self.pcie_base {
            let idx = (link - self.nic_base) / 2;
            format!("node{} nic{} {dir}", idx / self.nics, idx % self.nics)
        } else if link < self.nvme_base {
            let dir = if link.is_multiple_of(2) { "down" } else { "up" };
            format!("dev{} pcie {dir}", (link - self.pcie_base) / 2)
        } else {
            let dir = if link.is_multiple_of(2) { "read" } else { "write" };
            format!("node{} nvme {dir}", (link - self.nvme_base) / 2)
        }
    }

    /// Whether two devices share a node-internal switch (or mesh).
    pub fn same_switch(&self, a: u32, b: u32) -> bool {
        self.has_intra && self.node_of(a) == self.node_of(b)
    }

    /// Whether the node's devices are wired as a mesh ([`IntraTopology::Mesh`]).
    pub fn is_mesh(&self) -> bool {
        self.mesh_link_bytes_per_s.is_some()
    }

    /// The fastest a transfer between two distinct devices can run on its own: in a mesh, one
    /// link when they share a node; unbounded otherwise (the route's links decide).
    pub fn pair_cap(&self, a: u32, b: u32) -> f64 {
        match self.mesh_link_bytes_per_s {
            Some(link) if a != b && self.same_switch(a, b) => link,
            _ => f64::INFINITY,
        }
    }

    /// The fastest one device's flow in a collective step among `members` devices of one
    /// mesh node can run: each member spreads its data over its links to the other
    /// members - 1 (RCCL runs a channel per link); unbounded off a mesh.
    pub fn group_cap(&self, members: usize) -> f64 {
        match self.mesh_link_bytes_per_s {
            Some(link) => link * members.clamp(2, self.devices_per_node.max(2) as usize).saturating_sub(1) as f64,
            None => f64::INFINITY,
        }
    }
}
