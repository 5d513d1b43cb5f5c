//! The payload of a state blob: named f32 buffers and named byte strings.

use super::{put_str, put_u32, put_u64, DecodeError, Reader};
use crate::payload::{F32Buffer, NamedBytes};

/// A recurrent checkpoint's buffers, or an entry's tail (last-position buffers and extra
/// state), as stored.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StateBundle {
    pub buffers: Vec<F32Buffer>,
    pub bytes: Vec<NamedBytes>,
}

/// Most dimensions a buffer may have.
const MAX_DIMS: usize = 8;

impl StateBundle {
    pub fn encode(&self) -> Vec<u8> {
        let data: usize = self
            .buffers
            .iter()
            .map(|b| b.data.len() * 4 + 64)
            .sum::<usize>()
            + self.bytes.iter().map(|b| b.bytes.len() + 64).sum::<usize>();
        let mut out = Vec::with_capacity(data + 8);
        put_u32(&mut out, self.buffers.len() as u32);
        for b in &self.buffers {
            put_str(&mut out, &b.name);
            put_u32(&mut out, b.shape.len() as u32);
            for &d in &b.shape {
                put_u32(&mut out, d);
            }
            put_u64(&mut out, b.data.len() as u64);
            for x in &b.data {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        put_u32(&mut out, self.bytes.len() as u32);
        for b in &self.bytes {
            put_str(&mut out, &b.name);
            put_u64(&mut out, b.bytes.len() as u64);
            out.extend_from_slice(&b.bytes);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<StateBundle, DecodeError> {
        let mut r = Reader::new(bytes);
        let n = r.count(4 + 4 + 8)?;
        let mut buffers = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.string()?;
            let ndim = r.count(4)?;
            if ndim > MAX_DIMS {
                return Err(DecodeError::Field("buffer rank"));
            }
            let shape = (0..ndim).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
            let len = r.u64()?;
            let expected = shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
                .ok_or(DecodeError::Field("buffer shape"))?;
            if len != expected {
                return Err(DecodeError::Field("buffer shape"));
            }
            let raw = r.take(
                usize::try_from(len)
                    .map_err(|_| DecodeError::Short)?
                    .checked_mul(4)
                    .ok_or(DecodeError::Short)?,
            )?;
            let data = raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            buffers.push(F32Buffer { name, shape, data });
        }
        let n = r.count(4 + 8)?;
        let mut named = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.string()?;
            let len = usize::try_from(r.u64()?).map_err(|_| DecodeError::Short)?;
            let bytes = r.take(len)?.to_vec();
            named.push(NamedBytes { name, bytes });
        }
        r.finish()?;
        Ok(StateBundle {
            buffers,
            bytes: named,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_a_bad_shape() {
        let s = StateBundle {
            buffers: vec![F32Buffer {
                name: "ssm.0".into(),
                shape: vec![2, 3],
                data: (0..6).map(|i| i as f32 * 0.5).collect(),
            }],
            bytes: vec![NamedBytes {
                name: "mtp".into(),
                bytes: vec![1, 2, 3],
            }],
        };
        let enc = s.encode();
        assert_eq!(StateBundle::decode(&enc), Ok(s.clone()));
        let mut bad = s;
        bad.buffers[0].shape = vec![7];
        assert_eq!(
            StateBundle::decode(&bad.encode()),
            Err(DecodeError::Field("buffer shape"))
        );
        assert_eq!(
            StateBundle::decode(&enc[..enc.len() - 1]),
            Err(DecodeError::Short)
        );
    }
}
