//! The engine's sparse adjacency lists (task dependencies and gates).

/// Adjacency of `n` nodes of which few have targets, from (from, to) pairs: a bit per node
/// says whether it has any, then a binary search over the nodes that do finds them, in the
/// pairs' order. (Dense offsets would cost 4 bytes a task for the few tasks with explicit
/// dependencies.)
pub(super) struct Sparse {
    bits: Vec<u64>,
    /// Nodes with targets, ascending; the targets of `nodes[i]` are
    /// `targets[start[i]..start[i + 1]]`.
    nodes: Vec<u32>,
    start: Vec<u32>,
    pub(super) targets: Vec<u32>,
}

impl Sparse {
    pub(super) fn new(n: usize, pairs: impl Iterator<Item = (u32, u32)>) -> Sparse {
        let mut pairs: Vec<(u32, u32)> = pairs.collect();
        // Stable: a node's targets keep the pairs' order.
        pairs.sort_by_key(|&(a, _)| a);
        let mut bits = vec![0u64; n.div_ceil(64)];
        let (mut nodes, mut start) = (Vec::new(), Vec::new());
        for (i, &(a, _)) in pairs.iter().enumerate() {
            if nodes.last() != Some(&a) {
                nodes.push(a);
                start.push(i as u32);
                bits[a as usize / 64] |= 1 << (a % 64);
            }
        }
        start.push(pairs.len() as u32);
        Sparse { bits, nodes, start, targets: pairs.into_iter().map(|(_, b)| b).collect() }
    }

    /// The targets of node `a`.
    #[inline(always)]
    pub(super) fn get(&self, a: u32) -> &[u32] {
        &self.targets[self.range(a)]
    }

    /// Whether node `a` has targets.
    #[inline(always)]
    pub(super) fn has(&self, a: u32) -> bool {
        self.bits[a as usize / 64] & (1 << (a % 64)) != 0
    }

    /// Where the targets of node `a` are in `targets`.
    #[inline(always)]
    pub(super) fn range(&self, a: u32) -> std::ops::Range<usize> {
        if !self.has(a) {
            return 0..0;
        }
        self.listed(a)
    }

    fn listed(&self, a: u32) -> std::ops::Range<usize> {
        let i = self.nodes.binary_search(&a).expect("a node with targets is listed");
        self.start[i] as usize..self.start[i + 1] as usize
    }
}
