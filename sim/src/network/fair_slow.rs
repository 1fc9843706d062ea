//! Max-min fair rates by progressive filling over all flows at once: the slow, obviously
//! correct reference for [`super::fair_fast`].

/// Rates (bytes/s) of `flows` (each a list of link ids) over links of `capacity`.
///
/// Repeatedly find the link whose remaining capacity divided by its unfrozen flows is
/// smallest, give that share to all its unfrozen flows, freeze them, and subtract.
pub fn max_min_rates(capacity: &[f64], flows: &[Vec<u32>]) -> Vec<f64> {
    max_min_rates_capped(capacity, flows, &vec![f64::INFINITY; flows.len()])
}

/// The same with a ceiling per flow: a flow whose ceiling is below the next fair share
/// freezes at its ceiling first.
pub fn max_min_rates_capped(capacity: &[f64], flows: &[Vec<u32>], caps: &[f64]) -> Vec<f64> {
    let mut rate = vec![0.0; flows.len()];
    let mut frozen = vec![false; flows.len()];
    let mut left = capacity.to_vec();
    loop {
        let mut best: Option<(f64, usize)> = None;
        for (k, cap) in left.iter().enumerate() {
            let n = flows.iter().enumerate().filter(|(i, f)| !frozen[*i] && f.contains(&(k as u32))).count();
            if n > 0 {
                let share = cap / n as f64;
                if best.is_none_or(|(s, _)| share < s) {
                    best = Some((share, k));
                }
            }
        }
        let Some((share, k)) = best else { break };
        let lowest = (0..flows.len()).filter(|&i| !frozen[i]).min_by(|&a, &b| caps[a].total_cmp(&caps[b]));
        if let Some(i) = lowest.filter(|&i| caps[i] < share) {
            frozen[i] = true;
            rate[i] = caps[i];
            for &l in &flows[i] {
                left[l as usize] -= caps[i];
            }
            continue;
        }
        for (i, f) in flows.iter().enumerate() {
            if !frozen[i] && f.contains(&(k as u32)) {
                frozen[i] = true;
                rate[i] = share;
                for &l in f {
                    left[l as usize] -= share;
                }
            }
        }
    }
    rate
}
