//! How a stored token sequence matches a prompt, and where a restore may stop: pure
//! functions of token ids and positions, shared by the RAM and SSD lanes.

use crate::config::Matching;
use crate::explain::RefusalReason;

/// How a RAM entry's tokens relate to the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The entry is a prefix of the prompt.
    Exact,
    /// The prompt is a prefix of the entry, which is at most a few tokens longer.
    Near,
    /// They share a prefix, cut down to a block boundary.
    Block,
}

/// Tokens `a` and `b` share from the start.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The kind of match and the prompt tokens it covers, or `None` when the entry cannot
/// serve the prompt at all.
pub(crate) fn classify(entry: &[u32], prompt: &[u32], m: &Matching) -> Option<(Kind, usize)> {
    let lcp = common_prefix(entry, prompt);
    let (el, pl) = (entry.len(), prompt.len());
    if lcp == el && el <= pl {
        return Some((Kind::Exact, el));
    }
    if lcp == pl && el - pl <= m.near_max_extension && pl >= m.near_min_match {
        return Some((Kind::Near, pl));
    }
    let cut = lcp / m.block_tokens.max(1) * m.block_tokens.max(1);
    (cut >= m.block_min_match && cut > 0).then_some((Kind::Block, cut))
}

/// Where a restore of a state may stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Point {
    /// Positions restored.
    pub(crate) at: usize,
    /// Whether the restore covers the whole prompt and hands back the stored continuation
    /// instead of leaving a token to prefill.
    pub(crate) continuation: bool,
}

/// What is known of a candidate state for choosing its restore point.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape<'a> {
    /// Prompt tokens it matches.
    pub(crate) covered: usize,
    pub(crate) prompt_len: usize,
    pub(crate) entry_len: usize,
    /// Whether it stores a continuation at its own end.
    pub(crate) has_continuation: bool,
    /// Recurrent checkpoint positions; `None` for attention-only.
    pub(crate) checkpoints: Option<&'a [usize]>,
}

/// The furthest restore point of a candidate, or why it has none; then the caller's floor
/// for hybrid candidates.
///
/// A restore point is at or below `covered`, at a checkpoint for a hybrid state, and leaves
/// at least one prompt token to prefill, unless it is the state's own end and that end
/// stores a continuation (the logits for the next token): the model must see logits before
/// it samples, and a restore that covers the whole prompt has no prefill to produce them.
pub(crate) fn restore_point(s: Shape<'_>, floor: usize) -> Result<Point, RefusalReason> {
    let ok = |p: usize| {
        p > 0 && p <= s.covered && (p < s.prompt_len || (p == s.entry_len && s.has_continuation))
    };
    let point = match s.checkpoints {
        None => [s.covered, s.covered.saturating_sub(1)]
            .into_iter()
            .find(|&p| ok(p))
            .ok_or(RefusalReason::NothingToPrefill)?,
        Some(cps) => {
            let p = cps
                .iter()
                .copied()
                .filter(|&p| ok(p))
                .max()
                .ok_or(RefusalReason::NoSnapshotCoverage)?;
            if p < floor {
                return Err(RefusalReason::PrefixBoundaryBelowFloor);
            }
            p
        }
    };
    Ok(Point {
        at: point,
        continuation: point == s.prompt_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m() -> Matching {
        Matching::default()
    }

    fn seq(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 3 + salt).collect()
    }

    #[test]
    fn an_entry_inside_the_prompt_is_exact() {
        let p = seq(100, 0);
        assert_eq!(classify(&p[..40], &p, &m()), Some((Kind::Exact, 40)));
        assert_eq!(classify(&p, &p, &m()), Some((Kind::Exact, 100)));
    }

    #[test]
    fn near_needs_a_short_extension_and_a_long_enough_match() {
        let e = seq(108, 0);
        assert_eq!(classify(&e, &e[..100], &m()), Some((Kind::Near, 100)));
        assert_eq!(classify(&e, &e[..99], &m()), None, "9 extra tokens");
        let short = seq(70, 0);
        assert_eq!(classify(&short, &short[..63], &m()), None, "match of 63");
    }

    #[test]
    fn block_prefix_cuts_to_the_boundary_and_needs_512() {
        let mut prompt = seq(1000, 0);
        let entry = seq(900, 0);
        prompt[700] = u32::MAX;
        assert_eq!(classify(&entry, &prompt, &m()), Some((Kind::Block, 512)));
        prompt[511] = u32::MAX;
        assert_eq!(classify(&entry, &prompt, &m()), None, "cut to 256 < 512");
    }

    #[test]
    fn a_full_cover_needs_a_continuation_or_backs_off_one_token() {
        let s = |has_continuation, checkpoints| Shape {
            covered: 100,
            prompt_len: 100,
            entry_len: 100,
            has_continuation,
            checkpoints,
        };
        let full = restore_point(s(true, None), 0).unwrap();
        assert_eq!((full.at, full.continuation), (100, true));
        let back = restore_point(s(false, None), 0).unwrap();
        assert_eq!((back.at, back.continuation), (99, false));
        let cps = [50, 100];
        assert_eq!(restore_point(s(false, Some(&cps)), 0).unwrap().at, 50);
        assert_eq!(restore_point(s(true, Some(&cps)), 0).unwrap().at, 100);
    }

    #[test]
    fn hybrid_points_respect_checkpoints_and_the_floor() {
        let cps = [64, 256, 300];
        let s = Shape {
            covered: 280,
            prompt_len: 400,
            entry_len: 300,
            has_continuation: true,
            checkpoints: Some(&cps),
        };
        assert_eq!(restore_point(s, 0).unwrap().at, 256);
        assert_eq!(
            restore_point(s, 257),
            Err(RefusalReason::PrefixBoundaryBelowFloor)
        );
        let none = Shape {
            checkpoints: Some(&[300]),
            ..s
        };
        assert_eq!(
            restore_point(none, 0),
            Err(RefusalReason::NoSnapshotCoverage)
        );
    }
}
