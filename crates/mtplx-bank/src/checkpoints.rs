//! Which recurrent checkpoints a hybrid entry keeps: what a follow-up turn inherits from the
//! turn it continues, thinned to at most [`MAX_CHECKPOINTS`] by distance from the tail.
//!
//! A hybrid state restores only at a checkpoint, so the checkpoints an entry keeps are the
//! restore points it offers a prompt that leaves the conversation part way. Near the tail
//! (the next turn, a retry, an edit of the last message) they are dense; farther back one
//! per doubling of the distance suffices (a prompt that diverges `d` tokens back re-prefills
//! at most about `d` more), and the oldest stays, the shared system prompt's.

use crate::state::Checkpoint;

pub use mtplx_kv::{thin_checkpoints as thin, MAX_CHECKPOINTS};

/// The checkpoints of a new entry: its own (`own`, ascending) and those of the entry it
/// continues (`parent`, whose tokens are a prefix of the new entry's, so its states hold
/// for the new one too) where it has none at that position; then thinned by [`thin`].
pub fn inherit(own: Vec<Checkpoint>, parent: Option<&[Checkpoint]>) -> Vec<Checkpoint> {
    let mut all = own;
    if let Some(parent) = parent {
        let have: Vec<usize> = all.iter().map(|c| c.position).collect();
        all.extend(
            parent
                .iter()
                .filter(|c| !have.contains(&c.position))
                .cloned(),
        );
        all.sort_by_key(|c| c.position);
    }
    mtplx_kv::retain_thinned(&mut all, MAX_CHECKPOINTS);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keeps_the_tail_the_oldest_and_one_per_doubling() {
        // Every 256 tokens up to 8,192: 32 checkpoints.
        let positions: Vec<usize> = (1..=32).map(|i| i * 256).collect();
        let kept: Vec<usize> = thin(&positions, 8).iter().map(|&i| positions[i]).collect();
        assert_eq!(kept, [256, 4096, 6144, 7168, 7680, 7936, 8192]);
        // Distances from the tail: the oldest, then 4096.. (band 12), 2048.. (11), 1024..
        // (10), 512.. (9), 256 (8), and the tail; no band 13 holds a checkpoint.
        let distances: Vec<usize> = kept.iter().map(|p| 8192 - p).collect();
        assert_eq!(distances, [7936, 4096, 2048, 1024, 512, 256, 0]);
    }

    proptest! {
        #[test]
        fn thinning_keeps_at_most_max_with_the_ends_and_every_band_it_can(
            mut positions in prop::collection::btree_set(1usize..100_000, 0..60),
            max in 0usize..12,
        ) {
            let positions: Vec<usize> = std::mem::take(&mut positions).into_iter().collect();
            let keep = thin(&positions, max);
            prop_assert!(keep.len() <= max);
            prop_assert!(keep.windows(2).all(|w| w[0] < w[1]));
            if positions.len() <= max {
                prop_assert_eq!(keep.len(), positions.len());
                return Ok(());
            }
            if max >= 1 {
                prop_assert_eq!(*keep.last().unwrap(), positions.len() - 1);
            }
            if max >= 2 {
                prop_assert_eq!(keep[0], 0);
            }
            // No two kept (but the oldest) share a band of distance from the tail, and a
            // band left out is farther than every kept one: the nearest bands win.
            let tail = positions[positions.len() - 1];
            let band = |i: usize| (tail - positions[i]).max(1).ilog2();
            let inner: Vec<usize> = keep
                .iter()
                .copied()
                .filter(|&i| i != 0 && i != positions.len() - 1)
                .collect();
            let bands: Vec<u32> = inner.iter().map(|&i| band(i)).collect();
            let mut dedup = bands.clone();
            dedup.dedup();
            prop_assert_eq!(&dedup, &bands);
            if keep.len() == max {
                let farthest_kept = bands.iter().copied().max();
                for i in 1..positions.len() - 1 {
                    if !keep.contains(&i) {
                        if let Some(f) = farthest_kept {
                            prop_assert!(band(i) >= f || bands.contains(&band(i)));
                        }
                    }
                }
            } else {
                // Fewer than max: every band is represented.
                for i in 1..positions.len() - 1 {
                    prop_assert!(bands.contains(&band(i)) || keep.contains(&i));
                }
            }
        }
    }
}
