//! Per-layer recurrent state (convolution and SSM) of hybrid models.

use std::sync::Arc;

use crate::{BufferId, KvError};

/// The shapes of one recurrent layer's state, row-major `f32`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecurrentLayerShape {
    /// Convolution state, e.g. `[channels, kernel - 1]`.
    pub conv: Vec<usize>,
    /// SSM (or linear-attention) state, e.g. `[heads, head_dim, state_dim]`.
    pub ssm: Vec<usize>,
}

impl RecurrentLayerShape {
    pub(crate) fn conv_len(&self) -> usize {
        self.conv.iter().product()
    }
    pub(crate) fn ssm_len(&self) -> usize {
        self.ssm.iter().product()
    }
}

/// The recurrent state of a hybrid model: for each recurrent layer (numbered among the
/// recurrent layers only, in model order), a convolution state and an SSM state, plus the
/// number of tokens the state has consumed.
///
/// Unlike K/V rows, a recurrent state cannot be truncated: rolling back means restoring a
/// snapshot taken at the earlier position. Snapshots are therefore cheap: every buffer is
/// reference-counted, [`RecurrentState::snapshot`] clones the references, and the first
/// write to a shared buffer after a snapshot copies that buffer alone (copy-on-write).
///
/// ```
/// use mtplx_kv::{RecurrentLayerShape, RecurrentState};
///
/// let shape = RecurrentLayerShape { conv: vec![4, 3], ssm: vec![2, 4, 8] };
/// let mut state = RecurrentState::new(&[shape]);
/// state.conv_mut(0).unwrap()[0] = 1.0;
/// state.advance(1);
/// let snap = state.snapshot();
/// state.conv_mut(0).unwrap()[0] = 2.0;
/// state.advance(1);
/// assert_eq!(snap.conv(0).unwrap()[0], 1.0);
/// state.restore(&snap).unwrap();
/// assert_eq!((state.conv(0).unwrap()[0], state.tokens()), (1.0, 1));
/// ```
#[derive(Debug, Clone)]
pub struct RecurrentState {
    layers: Vec<LayerState>,
    tokens: usize,
}

/// A frozen copy of a [`RecurrentState`]: it never changes when the state it came from does.
#[derive(Debug, Clone)]
pub struct RecurrentSnapshot(RecurrentState);

#[derive(Debug, Clone)]
struct LayerState {
    shape: RecurrentLayerShape,
    conv: Arc<Vec<f32>>,
    ssm: Arc<Vec<f32>>,
}

impl RecurrentState {
    /// A zeroed state for recurrent layers of the given shapes, at token 0.
    pub fn new(layers: &[RecurrentLayerShape]) -> Self {
        RecurrentState {
            layers: layers
                .iter()
                .map(|shape| LayerState {
                    conv: Arc::new(vec![0.0; shape.conv_len()]),
                    ssm: Arc::new(vec![0.0; shape.ssm_len()]),
                    shape: shape.clone(),
                })
                .collect(),
            tokens: 0,
        }
    }

    /// Number of recurrent layers.
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// The shapes of `layer`'s state.
    pub fn layer_shape(&self, layer: usize) -> Result<&RecurrentLayerShape, KvError> {
        Ok(&self.layer(layer)?.shape)
    }

    /// Tokens consumed since the state was zeroed.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Records that the model folded `n` more tokens into the state.
    pub fn advance(&mut self, n: usize) {
        self.tokens += n;
    }

    pub fn conv(&self, layer: usize) -> Result<&[f32], KvError> {
        Ok(&self.layer(layer)?.conv)
    }

    pub fn ssm(&self, layer: usize) -> Result<&[f32], KvError> {
        Ok(&self.layer(layer)?.ssm)
    }

    /// `layer`'s convolution state, writable (copied first if a snapshot shares it).
    pub fn conv_mut(&mut self, layer: usize) -> Result<&mut [f32], KvError> {
        Ok(Arc::make_mut(&mut self.layer_mut(layer)?.conv).as_mut_slice())
    }

    /// `layer`'s SSM state, writable (copied first if a snapshot shares it).
    pub fn ssm_mut(&mut self, layer: usize) -> Result<&mut [f32], KvError> {
        Ok(Arc::make_mut(&mut self.layer_mut(layer)?.ssm).as_mut_slice())
    }

    /// Both of `layer`'s states, writable at once: `(conv, ssm)`.
    pub fn state_mut(&mut self, layer: usize) -> Result<(&mut [f32], &mut [f32]), KvError> {
        let l = self.layer_mut(layer)?;
        Ok((
            Arc::make_mut(&mut l.conv).as_mut_slice(),
            Arc::make_mut(&mut l.ssm).as_mut_slice(),
        ))
    }

    /// Zeroes every state and the token count.
    pub fn reset(&mut self) {
        for l in &mut self.layers {
            Arc::make_mut(&mut l.conv).fill(0.0);
            Arc::make_mut(&mut l.ssm).fill(0.0);
        }
        self.tokens = 0;
    }

    /// A frozen copy, O(layers): it shares every buffer until one side writes.
    pub fn snapshot(&self) -> RecurrentSnapshot {
        RecurrentSnapshot(self.clone())
    }

    /// Replaces this state by `snap` (sharing its buffers), if the layer shapes match.
    pub fn restore(&mut self, snap: &RecurrentSnapshot) -> Result<(), KvError> {
        let same = self.layers.len() == snap.0.layers.len()
            && self
                .layers
                .iter()
                .zip(&snap.0.layers)
                .all(|(a, b)| a.shape == b.shape);
        if !same {
            return Err(KvError::RecurrentShapeMismatch);
        }
        *self = snap.0.clone();
        Ok(())
    }

    /// Bytes the states would take packed.
    pub fn logical_bytes(&self) -> usize {
        let floats: usize = self
            .layers
            .iter()
            .map(|l| l.shape.conv_len() + l.shape.ssm_len())
            .sum();
        floats * std::mem::size_of::<f32>()
    }

    /// Bytes of every buffer this state references, shared ones included.
    pub fn physical_bytes(&self) -> usize {
        let mut total = 0;
        self.visit_buffers(&mut |_, bytes| total += bytes);
        total
    }

    /// Bytes of the buffers no snapshot or other state references.
    pub fn unique_bytes(&self) -> usize {
        self.buffers()
            .filter(|b| Arc::strong_count(b) == 1)
            .map(|b| bytes_of(b))
            .sum()
    }

    /// Calls `visit(id, bytes)` once per buffer, like [`crate::KvView::visit_buffers`].
    pub fn visit_buffers(&self, visit: &mut dyn FnMut(BufferId, usize)) {
        for b in self.buffers() {
            visit(BufferId::of(&**b), bytes_of(b));
        }
    }

    fn buffers(&self) -> impl Iterator<Item = &Arc<Vec<f32>>> {
        self.layers.iter().flat_map(|l| [&l.conv, &l.ssm])
    }

    fn layer(&self, layer: usize) -> Result<&LayerState, KvError> {
        let layers = self.layers.len();
        self.layers
            .get(layer)
            .ok_or(KvError::LayerOutOfRange { layer, layers })
    }

    fn layer_mut(&mut self, layer: usize) -> Result<&mut LayerState, KvError> {
        let layers = self.layers.len();
        self.layers
            .get_mut(layer)
            .ok_or(KvError::LayerOutOfRange { layer, layers })
    }
}

fn bytes_of(b: &[f32]) -> usize {
    std::mem::size_of_val(b)
}

impl RecurrentSnapshot {
    /// Tokens the state had consumed when the snapshot was taken.
    pub fn tokens(&self) -> usize {
        self.0.tokens
    }

    pub fn layers(&self) -> usize {
        self.0.layers()
    }

    pub fn conv(&self, layer: usize) -> Result<&[f32], KvError> {
        self.0.conv(layer)
    }

    pub fn ssm(&self, layer: usize) -> Result<&[f32], KvError> {
        self.0.ssm(layer)
    }

    pub fn physical_bytes(&self) -> usize {
        self.0.physical_bytes()
    }

    pub fn unique_bytes(&self) -> usize {
        self.0.unique_bytes()
    }

    pub fn visit_buffers(&self, visit: &mut dyn FnMut(BufferId, usize)) {
        self.0.visit_buffers(visit)
    }

    /// A writable state starting from this snapshot (sharing its buffers until written).
    pub fn to_state(&self) -> RecurrentState {
        self.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Vec<RecurrentLayerShape> {
        vec![
            RecurrentLayerShape {
                conv: vec![4, 3],
                ssm: vec![2, 4, 8],
            },
            RecurrentLayerShape {
                conv: vec![2, 3],
                ssm: vec![1, 2, 2],
            },
        ]
    }

    #[test]
    fn snapshot_shares_until_written() {
        let mut s = RecurrentState::new(&shapes());
        let all = (12 + 64 + 6 + 4) * 4;
        assert_eq!(s.logical_bytes(), all);
        assert_eq!(s.physical_bytes(), all);
        assert_eq!(s.unique_bytes(), all);
        let snap = s.snapshot();
        assert_eq!(
            s.unique_bytes(),
            0,
            "everything is shared with the snapshot"
        );
        s.ssm_mut(0).unwrap()[3] = 5.0;
        // Only the written buffer was copied.
        assert_eq!(s.unique_bytes(), 64 * 4);
        assert_eq!(snap.unique_bytes(), 64 * 4);
        assert_eq!(snap.ssm(0).unwrap()[3], 0.0);
        let mut union = std::collections::HashSet::new();
        s.visit_buffers(&mut |id, _| {
            union.insert(id);
        });
        snap.visit_buffers(&mut |id, _| {
            union.insert(id);
        });
        assert_eq!(union.len(), 5, "four buffers shared plus one copy");
        drop(snap);
        assert_eq!(s.unique_bytes(), all);
    }

    #[test]
    fn restore_rolls_back_state_and_tokens() {
        let mut s = RecurrentState::new(&shapes());
        let (conv, ssm) = s.state_mut(1).unwrap();
        conv[0] = 1.0;
        ssm[0] = 2.0;
        s.advance(3);
        let snap = s.snapshot();
        s.state_mut(1).unwrap().0[0] = 9.0;
        s.advance(2);
        s.restore(&snap).unwrap();
        assert_eq!(s.tokens(), 3);
        assert_eq!(s.conv(1).unwrap()[0], 1.0);
        assert_eq!(s.ssm(1).unwrap()[0], 2.0);
        s.reset();
        assert_eq!((s.tokens(), s.conv(1).unwrap()[0]), (0, 0.0));
        assert_eq!(
            snap.conv(1).unwrap()[0],
            1.0,
            "reset copies, the snapshot stays"
        );
        assert_eq!(snap.to_state().ssm(1).unwrap()[0], 2.0);
    }

    #[test]
    fn restore_rejects_other_shapes() {
        let mut s = RecurrentState::new(&shapes());
        let other = RecurrentState::new(&shapes()[..1]).snapshot();
        assert_eq!(s.restore(&other), Err(KvError::RecurrentShapeMismatch));
        assert!(matches!(
            s.conv_mut(2),
            Err(KvError::LayerOutOfRange {
                layer: 2,
                layers: 2
            })
        ));
    }
}
