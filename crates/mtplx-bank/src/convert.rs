//! Conversions between the bank's state types and the cold tier's plain descriptors.

use std::ops::Range;
use std::sync::Arc;

use mtplx_cold::{
    BoxError, F32Buffer, KvGeometry, KvSource, NamedBytes, Recurrent, RecurrentCheckpoint,
    SpillEntry, TailState,
};
use mtplx_kv::{KvDtype, KvShape, KvView, RecurrentLayerShape, RecurrentState};

use crate::entry::Entry;
use crate::{Checkpoint, Continuation};

const LOGITS: &str = "logits";
const HIDDEN: &str = "hidden";
const MTP: &str = "mtp";

/// The cold tier's name for a KV shape whose rows are stored as `dtype`.
pub(crate) fn geometry(shape: KvShape, dtype: KvDtype) -> KvGeometry {
    KvGeometry {
        layers: shape.layers as u32,
        kv_heads: shape.kv_heads as u32,
        head_dim: shape.head_dim as u32,
        dtype: cold_dtype(dtype),
    }
}

/// The cold tier's name for an element type. The cold tier has its own enum (it depends on
/// no tensor crate); the two are mapped here, and the mapping is tested to be one to one and
/// to keep names and sizes.
pub fn cold_dtype(dtype: KvDtype) -> mtplx_cold::KvDtype {
    match dtype {
        KvDtype::F32 => mtplx_cold::KvDtype::F32,
        KvDtype::F16 => mtplx_cold::KvDtype::F16,
        KvDtype::Bf16 => mtplx_cold::KvDtype::Bf16,
        KvDtype::Q8 => mtplx_cold::KvDtype::Q8,
        KvDtype::Q4 => mtplx_cold::KvDtype::Q4,
    }
}

/// A KV view read by the cold tier's writer (it keeps the view alive until written).
struct ViewSource(Arc<dyn KvView>);

impl KvSource for ViewSource {
    fn read_rows(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<(), BoxError> {
        Ok(self.0.read_raw(layer, range, k, v)?)
    }
}

/// What the cold tier stores for `entry`.
pub(crate) fn spill_entry(entry: &Entry) -> SpillEntry {
    SpillEntry {
        identity: entry.identity.clone(),
        tokens: entry.tokens.clone(),
        geometry: geometry(entry.kv.shape(), entry.kv.dtype()),
        kv: Box::new(ViewSource(entry.kv.clone())),
        recurrent: match &entry.checkpoints {
            None => Recurrent::None,
            Some(cps) => Recurrent::Checkpoints(cps.iter().map(checkpoint_to_cold).collect()),
        },
        tail: entry.continuation.as_ref().map(continuation_to_tail),
    }
}

fn buffer(name: String, shape: &[usize], data: &[f32]) -> F32Buffer {
    F32Buffer {
        name,
        shape: shape.iter().map(|&d| d as u32).collect(),
        data: data.to_vec(),
    }
}

/// A checkpoint as named buffers: `conv.{l}` and `ssm.{l}` for each recurrent layer.
pub(crate) fn checkpoint_to_cold(cp: &Checkpoint) -> RecurrentCheckpoint {
    let state = cp.state.to_state();
    let mut buffers = Vec::with_capacity(2 * state.layers());
    for l in 0..state.layers() {
        // `l` is in range, so these cannot fail.
        if let (Ok(shape), Ok(conv), Ok(ssm)) = (state.layer_shape(l), state.conv(l), state.ssm(l))
        {
            buffers.push(buffer(format!("conv.{l}"), &shape.conv, conv));
            buffers.push(buffer(format!("ssm.{l}"), &shape.ssm, ssm));
        }
    }
    RecurrentCheckpoint {
        position: cp.position as u32,
        buffers,
    }
}

/// The recurrent state a checkpoint read from the SSD tier describes, or `None` if its
/// buffers are not the `conv.{l}`/`ssm.{l}` pairs [`checkpoint_to_cold`] writes.
pub(crate) fn recurrent_from_cold(cp: &RecurrentCheckpoint) -> Option<RecurrentState> {
    if !cp.buffers.len().is_multiple_of(2) {
        return None;
    }
    let pairs: Vec<(&F32Buffer, &F32Buffer)> =
        cp.buffers.chunks_exact(2).map(|p| (&p[0], &p[1])).collect();
    let dims = |b: &F32Buffer| b.shape.iter().map(|&d| d as usize).collect::<Vec<_>>();
    let mut shapes = Vec::with_capacity(pairs.len());
    for (l, (conv, ssm)) in pairs.iter().enumerate() {
        if conv.name != format!("conv.{l}") || ssm.name != format!("ssm.{l}") {
            return None;
        }
        shapes.push(RecurrentLayerShape {
            conv: dims(conv),
            ssm: dims(ssm),
        });
    }
    let mut state = RecurrentState::new(&shapes);
    for (l, (conv, ssm)) in pairs.iter().enumerate() {
        let (c, s) = state.state_mut(l).ok()?;
        if c.len() != conv.data.len() || s.len() != ssm.data.len() {
            return None;
        }
        c.copy_from_slice(&conv.data);
        s.copy_from_slice(&ssm.data);
    }
    state.advance(cp.position as usize);
    Some(state)
}

pub(crate) fn continuation_to_tail(c: &Continuation) -> TailState {
    let mut last = vec![buffer(LOGITS.into(), &[c.logits.len()], &c.logits)];
    if !c.hidden.is_empty() {
        last.push(buffer(HIDDEN.into(), &[c.hidden.len()], &c.hidden));
    }
    TailState {
        last,
        extra: c
            .mtp
            .iter()
            .map(|b| NamedBytes {
                name: MTP.into(),
                bytes: b.clone(),
            })
            .collect(),
    }
}

pub(crate) fn continuation_from_tail(t: TailState) -> Continuation {
    let mut c = Continuation::default();
    for b in t.last {
        match b.name.as_str() {
            LOGITS => c.logits = b.data,
            HIDDEN => c.hidden = b.data,
            _ => {}
        }
    }
    c.mtp = t.extra.into_iter().find(|e| e.name == MTP).map(|e| e.bytes);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inverse of [`cold_dtype`], written independently.
    fn kv_dtype(dtype: mtplx_cold::KvDtype) -> KvDtype {
        match dtype {
            mtplx_cold::KvDtype::F32 => KvDtype::F32,
            mtplx_cold::KvDtype::F16 => KvDtype::F16,
            mtplx_cold::KvDtype::Bf16 => KvDtype::Bf16,
            mtplx_cold::KvDtype::Q8 => KvDtype::Q8,
            mtplx_cold::KvDtype::Q4 => KvDtype::Q4,
        }
    }

    #[test]
    fn element_types_map_to_the_cold_tiers_names_and_back() {
        for d in KvDtype::ALL {
            let cold = cold_dtype(d);
            assert_eq!(kv_dtype(cold), d);
            assert_eq!(cold.as_str(), d.as_str());
            assert_eq!(cold.group(), d.group());
            assert_eq!(cold.bytes(64), d.bytes(64));
        }
        for c in mtplx_cold::KvDtype::ALL {
            assert_eq!(cold_dtype(kv_dtype(c)), c);
        }
    }

    #[test]
    fn checkpoints_round_trip_through_cold_buffers() {
        let shapes = [
            RecurrentLayerShape {
                conv: vec![2, 3],
                ssm: vec![1, 2, 2],
            },
            RecurrentLayerShape {
                conv: vec![4],
                ssm: vec![3],
            },
        ];
        let mut s = RecurrentState::new(&shapes);
        for l in 0..2 {
            let (c, m) = s.state_mut(l).unwrap();
            c.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = i as f32 + l as f32);
            m.iter_mut().enumerate().for_each(|(i, x)| *x = -(i as f32));
        }
        s.advance(77);
        let cold = checkpoint_to_cold(&Checkpoint {
            position: 77,
            state: s.snapshot(),
        });
        let back = recurrent_from_cold(&cold).unwrap();
        assert_eq!(back.tokens(), 77);
        for (l, shape) in shapes.iter().enumerate() {
            assert_eq!(back.conv(l).unwrap(), s.conv(l).unwrap());
            assert_eq!(back.ssm(l).unwrap(), s.ssm(l).unwrap());
            assert_eq!(back.layer_shape(l).unwrap(), shape);
        }
        let mut foreign = cold.clone();
        foreign.buffers[0].name = "x".into();
        assert!(recurrent_from_cold(&foreign).is_none());
    }

    #[test]
    fn continuations_round_trip_through_tail_state() {
        let c = Continuation {
            logits: vec![1.0, 2.0],
            hidden: vec![3.0],
            mtp: Some(vec![9, 8]),
        };
        assert_eq!(continuation_from_tail(continuation_to_tail(&c)), c);
        let bare = Continuation {
            logits: vec![0.5],
            hidden: vec![],
            mtp: None,
        };
        assert_eq!(continuation_from_tail(continuation_to_tail(&bare)), bare);
    }
}
