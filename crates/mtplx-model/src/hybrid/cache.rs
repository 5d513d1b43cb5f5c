//! What a hybrid model carries between forward passes: the attention layers' K/V, the
//! recurrent layers' state, and recurrent checkpoints to roll back to.

use std::num::NonZeroUsize;

use mtplx_kv::{CacheFactory, KvCache, RecurrentSnapshot, RecurrentState};

use crate::error::{ModelError, Result};
use crate::hybrid::config::HybridConfig;

/// When the cache records a recurrent checkpoint by itself (besides
/// [`HybridCache::checkpoint`], which records one on demand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointPolicy {
    /// Only on demand.
    OnDemand,
    /// Whenever the position reaches a multiple of this many tokens. The model splits its
    /// forward passes at these positions, which changes no bit of the result.
    Every(NonZeroUsize),
}

/// The recurrent state after `position` tokens.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub position: usize,
    pub state: RecurrentSnapshot,
}

/// A hybrid model's cache: K/V rows for the attention layers (in the layout the caller
/// chose), the gated delta nets' [`RecurrentState`], and checkpoints of that state.
///
/// K/V rows can be truncated, recurrent state cannot: rolling back to an earlier position
/// ([`HybridCache::rollback`]) restores the newest checkpoint at or below it and truncates
/// the K/V to the checkpoint's position; the tokens after it must be run again.
pub struct HybridCache {
    kv: Box<dyn KvCache>,
    recurrent: RecurrentState,
    checkpoints: Vec<Checkpoint>,
    policy: CheckpointPolicy,
}

impl HybridCache {
    /// An empty cache for `config`, its K/V in `factory`'s layout.
    pub fn new(config: &HybridConfig, factory: &CacheFactory, policy: CheckpointPolicy) -> Self {
        HybridCache {
            kv: factory.new_cache(config.kv_shape()),
            recurrent: RecurrentState::new(&config.recurrent_shapes()),
            checkpoints: Vec::new(),
            policy,
        }
    }

    /// A cache resuming from restored parts (a checkpoint read back from storage): `kv` must
    /// hold exactly the positions `recurrent` has consumed. The restored state is recorded
    /// as the first checkpoint.
    pub fn from_parts(
        kv: Box<dyn KvCache>,
        recurrent: RecurrentState,
        policy: CheckpointPolicy,
    ) -> Result<Self> {
        if kv.len() != recurrent.tokens() {
            return Err(ModelError::Hybrid {
                reason: format!(
                    "{} K/V positions but a recurrent state after {} tokens",
                    kv.len(),
                    recurrent.tokens()
                ),
            });
        }
        let mut cache = HybridCache {
            kv,
            recurrent,
            checkpoints: Vec::new(),
            policy,
        };
        cache.checkpoint();
        Ok(cache)
    }

    /// Tokens the cache holds.
    pub fn len(&self) -> usize {
        self.recurrent.tokens()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn kv(&self) -> &dyn KvCache {
        self.kv.as_ref()
    }

    pub fn recurrent(&self) -> &RecurrentState {
        &self.recurrent
    }

    pub fn policy(&self) -> CheckpointPolicy {
        self.policy
    }

    /// The recorded checkpoints, by ascending position.
    pub fn checkpoints(&self) -> &[Checkpoint] {
        &self.checkpoints
    }

    /// Records a checkpoint at the current position (once per position; none at 0).
    pub fn checkpoint(&mut self) {
        let position = self.len();
        if position == 0 || self.checkpoints.last().map(|c| c.position) == Some(position) {
            return;
        }
        self.checkpoints.push(Checkpoint {
            position,
            state: self.recurrent.snapshot(),
        });
    }

    /// Rolls back to the newest checkpoint at or below `position` (position 0 needs none:
    /// the cache empties) and returns the position it rolled back to. Checkpoints above it
    /// are dropped.
    pub fn rollback(&mut self, position: usize) -> Result<usize> {
        let position = position.min(self.len());
        let Some(i) = self
            .checkpoints
            .iter()
            .rposition(|c| c.position <= position)
        else {
            if position == 0 {
                self.recurrent.reset();
                self.kv.truncate(0);
                self.checkpoints.clear();
                return Ok(0);
            }
            return Err(ModelError::NoCheckpoint { position });
        };
        self.checkpoints.truncate(i + 1);
        let cp = &self.checkpoints[i];
        self.recurrent.restore(&cp.state)?;
        self.kv.truncate(cp.position);
        Ok(cp.position)
    }

    /// The next position above `position` at which the policy records a checkpoint.
    pub(crate) fn next_boundary(&self, position: usize) -> Option<usize> {
        match self.policy {
            CheckpointPolicy::OnDemand => None,
            CheckpointPolicy::Every(n) => Some((position / n.get() + 1) * n.get()),
        }
    }

    /// Records a checkpoint if the policy asks for one at the current position.
    pub(crate) fn checkpoint_if_due(&mut self) {
        if let CheckpointPolicy::Every(n) = self.policy {
            if self.len().is_multiple_of(n.get()) {
                self.checkpoint();
            }
        }
    }

    pub(crate) fn parts_mut(&mut self) -> (&mut dyn KvCache, &mut RecurrentState) {
        (self.kv.as_mut(), &mut self.recurrent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(policy: CheckpointPolicy) -> HybridCache {
        HybridCache::new(&HybridConfig::tiny(), &CacheFactory::contiguous(), policy)
    }

    #[test]
    fn rollback_without_a_checkpoint_below_is_refused() {
        let mut c = cache(CheckpointPolicy::OnDemand);
        c.recurrent.advance(5);
        assert!(matches!(
            c.rollback(3),
            Err(ModelError::NoCheckpoint { position: 3 })
        ));
        assert_eq!(c.rollback(0).unwrap(), 0);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn checkpoints_are_recorded_once_per_position_and_dropped_on_rollback() {
        let mut c = cache(CheckpointPolicy::OnDemand);
        c.checkpoint();
        assert!(c.checkpoints().is_empty(), "none at position 0");
        for _ in 0..3 {
            c.recurrent.advance(4);
            c.checkpoint();
            c.checkpoint();
        }
        let at: Vec<_> = c.checkpoints().iter().map(|c| c.position).collect();
        assert_eq!(at, [4, 8, 12]);
        assert_eq!(c.rollback(11).unwrap(), 8);
        assert_eq!(c.len(), 8);
        let at: Vec<_> = c.checkpoints().iter().map(|c| c.position).collect();
        assert_eq!(at, [4, 8]);
    }

    #[test]
    fn the_grid_policy_names_the_next_multiple() {
        let c = cache(CheckpointPolicy::Every(NonZeroUsize::new(16).unwrap()));
        assert_eq!(c.next_boundary(0), Some(16));
        assert_eq!(c.next_boundary(15), Some(16));
        assert_eq!(c.next_boundary(16), Some(32));
        assert_eq!(cache(CheckpointPolicy::OnDemand).next_boundary(3), None);
    }
}
