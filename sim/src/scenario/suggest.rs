//! "Did you mean": the closest allowed name to a misspelled key, preset or value.

/// Edit distance between two strings: insertions, deletions, substitutions and swaps of two
/// neighbouring characters each count one (optimal string alignment).
pub fn levenshtein(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // Rows i-2, i-1 and i of the distance table.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            row[j] = (prev[j - 1] + cost).min(prev[j] + 1).min(row[j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(before[j - 2] + 1);
            }
        }
        before = std::mem::replace(&mut prev, row);
    }
    prev[b.len()]
}

/// The candidate closest to a misspelled `word`, if one is close enough to be what was meant:
/// case is ignored, and at most a third of the word's characters (at least one, at most
/// three) may differ. Ties go to the first candidate.
pub fn closest<'c>(word: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    let w = word.to_lowercase();
    let limit = (w.chars().count() / 3).clamp(1, 3);
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = levenshtein(&w, &c.to_lowercase());
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

/// `" (did you mean `x`?)"` when a candidate is close to `word`, else nothing.
pub fn did_you_mean<'c>(word: &str, candidates: impl IntoIterator<Item = &'c str>) -> String {
    closest(word, candidates).map(|c| format!(" (did you mean `{c}`?)")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levenshtein_counts_single_edits() {
        assert_eq!(levenshtein("", ""), 0);
        assert_eq!(levenshtein("abc", ""), 3);
        assert_eq!(levenshtein("micro_bach", "micro_batch"), 1);
        assert_eq!(levenshtein("1f1v", "1f1b"), 1);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("bf61", "bf16"), 1);
        assert_eq!(levenshtein("ab", "ba"), 1);
        // Characters, not bytes.
        assert_eq!(levenshtein("é", "e"), 1);
    }

    #[test]
    fn closest_suggests_only_near_names() {
        let names = ["dp", "tp", "pp", "schedule", "zero_stage", "micro_batch"];
        assert_eq!(closest("shedule", names), Some("schedule"));
        assert_eq!(closest("zero-stage", names), Some("zero_stage"));
        assert_eq!(closest("SCHEDULE", names), Some("schedule"));
        // One edit is allowed even for short words; ties go to the first.
        assert_eq!(closest("xp", names), Some("dp"));
        assert_eq!(closest("optimizer", names), None);
        assert_eq!(closest("", ["a"]), Some("a"));
        assert_eq!(did_you_mean("zzzzzzzz", names), "");
        assert_eq!(did_you_mean("micro_bach", names), " (did you mean `micro_batch`?)");
    }
}
