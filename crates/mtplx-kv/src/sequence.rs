//! [`Sequence`]: what a model runs on: K/V rows in the caller's layout, the recurrent state
//! of a hybrid model's recurrent layers, and checkpoints of that state to rewind to.
//!
//! An attention-only model's sequence has no recurrent layers: its recurrent state is
//! absent, it records no checkpoints, and it rewinds to any position (K/V rows truncate).
//! A hybrid model's rewinds to the newest checkpoint at or below the position asked for;
//! the caller runs the tokens from there again. Both go through the same calls, so no
//! caller has a second path per model family.

use std::num::NonZeroUsize;

use crate::{BufferId, RecurrentState};
use crate::{
    CacheFactory, KvCache, KvDtype, KvError, KvShape, RecurrentLayerShape, RecurrentSnapshot,
};

/// Most checkpoints a sequence keeps once thinned ([`Sequence::thin`]) and a stored state
/// keeps: the tail, the oldest and one per doubling of the distance from the tail.
pub const MAX_CHECKPOINTS: usize = 8;

/// The shape of a model's per-sequence state: its attention layers' K/V and its recurrent
/// layers' state (none for an attention-only model).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateShape {
    pub kv: KvShape,
    /// One per recurrent layer, in model order; empty for an attention-only model.
    pub recurrent: Vec<RecurrentLayerShape>,
}

impl StateShape {
    /// An attention-only model's shape.
    pub fn attention_only(kv: KvShape) -> Self {
        StateShape {
            kv,
            recurrent: Vec::new(),
        }
    }

    /// Bytes of one recurrent state (one checkpoint), `f32`; 0 for attention only.
    pub fn recurrent_bytes(&self) -> usize {
        let floats: usize = self
            .recurrent
            .iter()
            .map(|l| l.conv_len() + l.ssm_len())
            .sum();
        floats * std::mem::size_of::<f32>()
    }

    /// Bytes a sequence of `tokens` positions may hold at most with K/V stored as `dtype`:
    /// its K/V rows, its live recurrent state and up to [`MAX_CHECKPOINTS`] checkpoints of it.
    pub fn bytes_for(&self, tokens: usize, dtype: KvDtype) -> u64 {
        let kv = (tokens as u64).saturating_mul(self.kv.bytes_per_token(dtype) as u64);
        kv.saturating_add((1 + MAX_CHECKPOINTS as u64) * self.recurrent_bytes() as u64)
    }
}

/// The recurrent state after `position` tokens.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Tokens folded into the state (at least 1).
    pub position: usize,
    pub state: RecurrentSnapshot,
}

/// When a sequence records a checkpoint by itself, besides [`Sequence::checkpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointPolicy {
    /// Only when asked.
    #[default]
    OnDemand,
    /// Whenever the position reaches a multiple of this many tokens. A model splits its
    /// forward passes at these positions, which changes no bit of the result.
    Every(NonZeroUsize),
}

/// A model's state for one sequence. See the [module docs](self).
///
/// ```
/// use mtplx_kv::{CacheFactory, KvShape, RecurrentLayerShape, Sequence, StateShape};
///
/// let kv = KvShape { layers: 1, kv_heads: 1, head_dim: 4 };
/// let dense = StateShape::attention_only(kv);
/// let mut seq = Sequence::new(&CacheFactory::paged(), &dense);
/// assert!(seq.checkpoints().is_none());
/// assert!(!seq.checkpoint(), "an attention-only sequence has nothing to checkpoint");
///
/// let layer = RecurrentLayerShape { conv: vec![4, 3], ssm: vec![2, 4, 8] };
/// let hybrid = StateShape { kv, recurrent: vec![layer] };
/// let seq = Sequence::new(&CacheFactory::paged(), &hybrid);
/// assert_eq!(seq.checkpoints().map(<[_]>::len), Some(0));
/// ```
pub struct Sequence {
    kv: Box<dyn KvCache>,
    /// `None` for an attention-only model.
    recurrent: Option<RecurrentState>,
    /// Ascending by position, all at or below the current length.
    checkpoints: Vec<Checkpoint>,
    policy: CheckpointPolicy,
}

impl Sequence {
    /// An empty sequence of `shape`, its K/V in `factory`'s layout.
    pub fn new(factory: &CacheFactory, shape: &StateShape) -> Self {
        Sequence {
            kv: factory.new_cache(shape.kv),
            recurrent: (!shape.recurrent.is_empty()).then(|| RecurrentState::new(&shape.recurrent)),
            checkpoints: Vec::new(),
            policy: CheckpointPolicy::OnDemand,
        }
    }

    /// A sequence resuming from restored parts: `kv` and, for a hybrid model, the recurrent
    /// state after exactly as many tokens as `kv` holds (recorded as the first checkpoint).
    /// Refused when the parts do not fit `shape` or each other.
    pub fn from_parts(
        shape: &StateShape,
        kv: Box<dyn KvCache>,
        recurrent: Option<RecurrentState>,
    ) -> Result<Self, KvError> {
        if kv.shape() != shape.kv {
            return Err(KvError::ShapeMismatch {
                cache: shape.kv,
                source_shape: kv.shape(),
            });
        }
        match &recurrent {
            None if shape.recurrent.is_empty() => {}
            Some(r) if same_layers(r, &shape.recurrent) => {
                if r.tokens() != kv.len() {
                    return Err(KvError::StateLengthMismatch {
                        kv: kv.len(),
                        recurrent: r.tokens(),
                    });
                }
            }
            _ => return Err(KvError::RecurrentShapeMismatch),
        }
        let mut seq = Sequence {
            kv,
            recurrent,
            checkpoints: Vec::new(),
            policy: CheckpointPolicy::OnDemand,
        };
        seq.checkpoint();
        Ok(seq)
    }

    /// An independent copy (the K/V forked, the recurrent state and checkpoints shared
    /// copy-on-write), e.g. to try a branch and keep the original.
    pub fn fork(&self) -> Sequence {
        Sequence {
            kv: self.kv.fork(),
            recurrent: self.recurrent.clone(),
            checkpoints: self.checkpoints.clone(),
            policy: self.policy,
        }
    }

    /// This sequence with `policy` for recording checkpoints by itself.
    pub fn with_policy(mut self, policy: CheckpointPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Tokens the sequence holds.
    pub fn len(&self) -> usize {
        self.kv.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether this sequence holds state of `shape` (what a model checks before it runs on
    /// it), without building the sequence's own shape.
    pub fn fits(&self, shape: &StateShape) -> bool {
        self.kv.shape() == shape.kv
            && match &self.recurrent {
                None => shape.recurrent.is_empty(),
                Some(r) => same_layers(r, &shape.recurrent),
            }
    }

    pub fn kv(&self) -> &dyn KvCache {
        self.kv.as_ref()
    }

    pub fn kv_mut(&mut self) -> &mut dyn KvCache {
        self.kv.as_mut()
    }

    /// The recurrent state; `None` for an attention-only model.
    pub fn recurrent(&self) -> Option<&RecurrentState> {
        self.recurrent.as_ref()
    }

    /// The K/V and the recurrent state, writable at once (for a model's forward pass).
    pub fn parts_mut(&mut self) -> (&mut dyn KvCache, Option<&mut RecurrentState>) {
        (self.kv.as_mut(), self.recurrent.as_mut())
    }

    pub fn policy(&self) -> CheckpointPolicy {
        self.policy
    }

    /// The recorded checkpoints, ascending; `None` for an attention-only model.
    pub fn checkpoints(&self) -> Option<&[Checkpoint]> {
        self.recurrent.as_ref().map(|_| self.checkpoints.as_slice())
    }

    /// Records a checkpoint at the current position (none at 0, one per position) and says
    /// whether it recorded one. An attention-only sequence records none.
    pub fn checkpoint(&mut self) -> bool {
        let position = self.len();
        let Some(r) = &self.recurrent else {
            return false;
        };
        if position == 0 || self.checkpoints.last().map(|c| c.position) == Some(position) {
            return false;
        }
        self.checkpoints.push(Checkpoint {
            position,
            state: r.snapshot(),
        });
        true
    }

    /// Drops the checkpoint at `position`, if there is one (a speculative step's own).
    pub fn forget(&mut self, position: usize) {
        self.checkpoints.retain(|c| c.position != position);
    }

    /// Keeps at most `max` checkpoints: the newest, the oldest, then one per doubling of the
    /// distance from the newest ([`thin`]).
    pub fn thin(&mut self, max: usize) {
        retain_thinned(&mut self.checkpoints, max);
    }

    /// Rewinds to at most `len` tokens and returns the length reached: `len` itself when
    /// the sequence can trim there (always for attention only), else the newest checkpoint
    /// below it (0 when there is none: the sequence empties). The tokens from the length
    /// reached to `len` must be run again. Checkpoints above the length reached are dropped.
    pub fn rewind(&mut self, len: usize) -> Result<usize, KvError> {
        let len = len.min(self.len());
        let Some(r) = &mut self.recurrent else {
            self.kv.truncate(len);
            return Ok(len);
        };
        if len == r.tokens() {
            return Ok(len);
        }
        let reached = match self.checkpoints.iter().rposition(|c| c.position <= len) {
            Some(i) => {
                self.checkpoints.truncate(i + 1);
                let cp = &self.checkpoints[i];
                r.restore(&cp.state)?;
                cp.position
            }
            None => {
                self.checkpoints.clear();
                r.reset();
                0
            }
        };
        self.kv.truncate(reached);
        Ok(reached)
    }

    /// The next position above `position` at which the policy records a checkpoint
    /// (`None` for an attention-only sequence).
    pub fn next_boundary(&self, position: usize) -> Option<usize> {
        match (self.policy, &self.recurrent) {
            (CheckpointPolicy::Every(n), Some(_)) => Some((position / n.get() + 1) * n.get()),
            _ => None,
        }
    }

    /// Records a checkpoint if the policy asks for one at the current position.
    pub fn checkpoint_if_due(&mut self) {
        if let CheckpointPolicy::Every(n) = self.policy {
            if self.len().is_multiple_of(n.get()) {
                self.checkpoint();
            }
        }
    }

    /// Bytes of the checkpoints' buffers, each counted once (a buffer two checkpoints
    /// share, or that the live state still shares, counts once).
    pub fn checkpoint_bytes(&self) -> usize {
        let mut seen = std::collections::HashSet::<BufferId>::new();
        let mut total = 0;
        for cp in &self.checkpoints {
            cp.state.visit_buffers(&mut |id, bytes| {
                if seen.insert(id) {
                    total += bytes;
                }
            });
        }
        total
    }
}

/// An attention-only sequence is its K/V.
impl From<Box<dyn KvCache>> for Sequence {
    fn from(kv: Box<dyn KvCache>) -> Self {
        Sequence {
            kv,
            recurrent: None,
            checkpoints: Vec::new(),
            policy: CheckpointPolicy::OnDemand,
        }
    }
}

impl std::fmt::Debug for Sequence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequence")
            .field("len", &self.len())
            .field("layout", &self.kv.layout())
            .field("recurrent", &self.recurrent.is_some())
            .field(
                "checkpoints",
                &self
                    .checkpoints
                    .iter()
                    .map(|c| c.position)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

fn same_layers(r: &RecurrentState, shapes: &[RecurrentLayerShape]) -> bool {
    r.layers() == shapes.len()
        && shapes
            .iter()
            .enumerate()
            .all(|(l, s)| r.layer_shape(l).ok() == Some(s))
}

/// Keeps of the ascending `checkpoints` the at most `max` that [`thin`] picks.
pub fn retain_thinned(checkpoints: &mut Vec<Checkpoint>, max: usize) {
    let positions: Vec<usize> = checkpoints.iter().map(|c| c.position).collect();
    let keep = thin(&positions, max);
    let mut i = 0;
    checkpoints.retain(|_| {
        let kept = keep.binary_search(&i).is_ok();
        i += 1;
        kept
    });
}

/// Which of the ascending `positions` to keep, at most `max` of them: the newest and the
/// oldest, then one per doubling of the distance from the newest (in each band
/// `[2^k, 2^(k+1))` the one nearest the tail), the nearest bands first. Returns indices
/// into `positions`, ascending.
///
/// A hybrid state restores only at a checkpoint, so the checkpoints kept are the restore
/// points offered to a prompt that leaves the conversation part way. Near the tail (the
/// next turn, a retry, an edit of the last message) they are dense; farther back one per
/// doubling of the distance suffices (a prompt that diverges `d` tokens back re-prefills at
/// most about `d` more), and the oldest stays, the shared system prompt's.
pub fn thin(positions: &[usize], max: usize) -> Vec<usize> {
    let n = positions.len();
    if n <= max {
        return (0..n).collect();
    }
    if max == 0 {
        return Vec::new();
    }
    let tail = positions[n - 1];
    let mut keep = vec![n - 1];
    if max > 1 {
        keep.push(0);
    }
    // Newest first, so the first one met in a band is the band's nearest to the tail.
    let mut last_band = None;
    for i in (1..n - 1).rev() {
        if keep.len() >= max {
            break;
        }
        let band = (tail - positions[i]).max(1).ilog2();
        if last_band != Some(band) {
            keep.push(i);
            last_band = Some(band);
        }
    }
    keep.sort_unstable();
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> StateShape {
        StateShape {
            kv: KvShape {
                layers: 1,
                kv_heads: 1,
                head_dim: 2,
            },
            recurrent: vec![RecurrentLayerShape {
                conv: vec![2, 1],
                ssm: vec![1, 2, 2],
            }],
        }
    }

    /// Appends `n` positions to the K/V and folds them into the recurrent state (marking
    /// the state with its length, so a restore shows which one came back).
    fn advance(seq: &mut Sequence, n: usize) {
        for _ in 0..n {
            let (kv, r) = seq.parts_mut();
            kv.append(0, &[0.0; 2], &[0.0; 2]).unwrap();
            let r = r.unwrap();
            r.advance(1);
            let t = r.tokens() as f32;
            r.conv_mut(0).unwrap()[0] = t;
        }
    }

    #[test]
    fn a_hybrid_rewind_lands_on_the_newest_checkpoint_below() {
        let mut seq = Sequence::new(&CacheFactory::contiguous(), &shape());
        assert!(!seq.checkpoint(), "none at position 0");
        advance(&mut seq, 4);
        assert!(seq.checkpoint());
        assert!(!seq.checkpoint(), "one per position");
        advance(&mut seq, 4);
        seq.checkpoint();
        advance(&mut seq, 3);
        assert_eq!(seq.rewind(7).unwrap(), 4);
        assert_eq!(seq.len(), 4);
        assert_eq!(seq.recurrent().unwrap().conv(0).unwrap()[0], 4.0);
        let at: Vec<_> = seq
            .checkpoints()
            .unwrap()
            .iter()
            .map(|c| c.position)
            .collect();
        assert_eq!(at, [4]);
        assert_eq!(seq.rewind(4).unwrap(), 4, "rewinding to the length is free");
        assert_eq!(seq.rewind(2).unwrap(), 0, "nothing below: it empties");
        assert_eq!((seq.len(), seq.recurrent().unwrap().tokens()), (0, 0));
        assert_eq!(seq.recurrent().unwrap().conv(0).unwrap()[0], 0.0);
    }

    #[test]
    fn an_attention_only_rewind_trims_anywhere() {
        let s = StateShape::attention_only(shape().kv);
        let mut seq = Sequence::new(&CacheFactory::paged(), &s);
        for _ in 0..5 {
            seq.kv_mut().append(0, &[0.0; 2], &[0.0; 2]).unwrap();
        }
        assert!(!seq.checkpoint());
        assert_eq!(seq.rewind(3).unwrap(), 3);
        assert_eq!(seq.len(), 3);
        assert_eq!(seq.next_boundary(0), None);
    }

    #[test]
    fn parts_that_do_not_fit_are_refused() {
        let s = shape();
        let kv = CacheFactory::contiguous().new_cache(s.kv);
        assert_eq!(
            Sequence::from_parts(&s, kv.fork(), None).unwrap_err(),
            KvError::RecurrentShapeMismatch
        );
        let mut r = RecurrentState::new(&s.recurrent);
        r.advance(2);
        assert!(matches!(
            Sequence::from_parts(&s, kv.fork(), Some(r)),
            Err(KvError::StateLengthMismatch {
                kv: 0,
                recurrent: 2
            })
        ));
        let dense = StateShape::attention_only(s.kv);
        let r = RecurrentState::new(&s.recurrent);
        assert!(Sequence::from_parts(&dense, kv.fork(), Some(r)).is_err());
        let seq = Sequence::from_parts(&dense, kv, None).unwrap();
        assert!(seq.checkpoints().is_none());
    }

    #[test]
    fn thinning_keeps_the_tail_and_the_oldest() {
        let mut seq = Sequence::new(&CacheFactory::contiguous(), &shape());
        for _ in 0..20 {
            advance(&mut seq, 16);
            seq.checkpoint();
        }
        seq.thin(MAX_CHECKPOINTS);
        let at: Vec<_> = seq
            .checkpoints()
            .unwrap()
            .iter()
            .map(|c| c.position)
            .collect();
        // The tail, the oldest, and one per band of distance: 16, 32, 64, 128, 256.
        assert_eq!(at, [16, 64, 192, 256, 288, 304, 320]);
        assert!(at.len() <= MAX_CHECKPOINTS);
        assert!(seq.checkpoint_bytes() > 0);
    }

    #[test]
    fn the_grid_policy_names_the_next_multiple() {
        let every = CheckpointPolicy::Every(NonZeroUsize::new(16).unwrap());
        let seq = Sequence::new(&CacheFactory::contiguous(), &shape()).with_policy(every);
        assert_eq!(seq.next_boundary(0), Some(16));
        assert_eq!(seq.next_boundary(15), Some(16));
        assert_eq!(seq.next_boundary(16), Some(32));
    }
}
