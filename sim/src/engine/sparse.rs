//! The engine's sparse adjacency lists (task dependencies and gates).

/// Adjacency of `n` nodes of which few have targets, from (from, to) pairs: a bit per node
/// says whether it has any, and the node's rank among those that do (the set bits before it:
/// a count per 64-bit word plus a popcount inside it) finds them, in the pairs' order. (Dense
/// offsets would cost 4 bytes a task for the few tasks with explicit dependencies; the counts
/// cost 4 bytes per 64 tasks.)
pub(super) struct Sparse {
    bits: Vec<u64>,
    /// Set bits in the words before each word of `bits`.
    before: Vec<u32>,
    /// The targets of the node of rank `r` are `targets[start[r]..start[r + 1]]`.
    start: Vec<u32>,
    pub(super) targets: Vec<u32>,
}

impl Sparse {
    pub(super) fn new(n: usize, pairs: impl Iterator<Item = (u32, u32)>) -> Sparse {
        let mut pairs: Vec<(u32, u32)> = pairs.collect();
        // Stable: a node's targets keep the pairs' order.
        pairs.sort_by_key(|&(a, _)| a);
        let mut bits = vec![0u64; n.div_ceil(64)];
        let mut start = Vec::new();
        let mut last = None;
        for (i, &(a, _)) in pairs.iter().enumerate() {
            if last != Some(a) {
                last = Some(a);
                start.push(i as u32);
                bits[a as usize / 64] |= 1 << (a % 64);
            }
        }
        start.push(pairs.len() as u32);
        let before = bits
            .iter()
            .scan(0u32, |seen, w| {
                let b = *seen;
                *seen += w.count_ones();
                Some(b)
            })
            .collect();
        Sparse { bits, before, start, targets: pairs.into_iter().map(|(_, b)| b).collect() }
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

    #[inline(always)]
    fn listed(&self, a: u32) -> std::ops::Range<usize> {
        let w = a as usize / 64;
        let below = self.bits[w] & ((1u64 << (a % 64)) - 1);
        let i = (self.before[w] + below.count_ones()) as usize;
        self.start[i] as usize..self.start[i + 1] as usize
    }
}

#[cfg(test)]
mod tests {
    use super::Sparse;

    #[test]
    fn finds_every_nodes_targets_in_the_pairs_order() {
        // Pairs from a fixed linear congruential sequence over 1,000 nodes (some with none,
        // some with several, across word boundaries), against a plain list per node.
        let n = 1_000usize;
        let mut x = 12_345u64;
        let mut next = || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (x >> 33) as u32
        };
        let pairs: Vec<(u32, u32)> = (0..700).map(|_| (next() % n as u32 / 3 * 3, next() % 5_000)).collect();
        let s = Sparse::new(n, pairs.iter().copied());
        for a in 0..n as u32 {
            let want: Vec<u32> = pairs.iter().filter(|p| p.0 == a).map(|p| p.1).collect();
            assert_eq!(s.get(a), &want[..], "node {a}");
            assert_eq!(s.has(a), !want.is_empty(), "node {a}");
        }
        let empty = Sparse::new(130, std::iter::empty());
        assert!((0..130).all(|a| empty.get(a).is_empty()));
    }
}
