//! Manifest records: an entry's head (small: what lookups rank by) and its body (the token
//! ids and block keys).

use super::{put_u32, put_u64, DecodeError, Reader};
use crate::dtype::KvDtype;
use crate::identity::IdentityDigest;
use crate::key::{BlockKey, StateKey, TokenHash, FORMAT_VERSION};
use crate::payload::KvGeometry;

/// A state blob an entry references.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateRef {
    pub key: StateKey,
    /// Blob file length, header included.
    pub file_len: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointRef {
    pub position: u32,
    pub state: StateRef,
}

/// Everything a lookup needs about an entry, without its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryHead {
    pub identity: IdentityDigest,
    pub geometry: KvGeometry,
    pub n_tokens: u32,
    pub token_hash: TokenHash,
    /// `None` for an attention-only entry.
    pub checkpoints: Option<Vec<CheckpointRef>>,
    pub tail: Option<StateRef>,
    /// Sum of the entry's KV block file lengths.
    pub kv_bytes: u64,
    pub created_s: u64,
}

/// An entry's token ids and block keys (one per 256 tokens, the last maybe partial).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryBody {
    pub tokens: Vec<u32>,
    pub blocks: Vec<BlockKey>,
}

/// A record decoded from another format version: it is kept only to be reported as
/// `ssd_format_mismatch`.
pub fn record_version(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?))
}

impl EntryHead {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(160);
        put_u32(&mut out, FORMAT_VERSION);
        out.extend_from_slice(&self.identity.0);
        put_u32(&mut out, self.geometry.layers);
        put_u32(&mut out, self.geometry.kv_heads);
        put_u32(&mut out, self.geometry.head_dim);
        out.push(self.geometry.dtype.code());
        put_u32(&mut out, self.n_tokens);
        out.extend_from_slice(&self.token_hash.0);
        match &self.checkpoints {
            None => out.push(0),
            Some(cps) => {
                out.push(1);
                put_u32(&mut out, cps.len() as u32);
                for c in cps {
                    put_u32(&mut out, c.position);
                    out.extend_from_slice(&c.state.key.0);
                    put_u64(&mut out, c.state.file_len);
                }
            }
        }
        match &self.tail {
            None => out.push(0),
            Some(t) => {
                out.push(1);
                out.extend_from_slice(&t.key.0);
                put_u64(&mut out, t.file_len);
            }
        }
        put_u64(&mut out, self.kv_bytes);
        put_u64(&mut out, self.created_s);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<EntryHead, DecodeError> {
        let mut r = Reader::new(bytes);
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(DecodeError::Version(version));
        }
        let identity = IdentityDigest(r.array()?);
        let geometry = KvGeometry {
            layers: r.u32()?,
            kv_heads: r.u32()?,
            head_dim: r.u32()?,
            dtype: {
                let code = r.u8()?;
                KvDtype::from_code(code).ok_or(DecodeError::KvDtype(code))?
            },
        };
        if !geometry.is_valid() {
            return Err(DecodeError::Field("geometry"));
        }
        let n_tokens = r.u32()?;
        let token_hash = TokenHash(r.array()?);
        let checkpoints = match r.u8()? {
            0 => None,
            1 => {
                let n = r.count(4 + 32 + 8)?;
                let mut cps: Vec<CheckpointRef> = Vec::with_capacity(n);
                for _ in 0..n {
                    let position = r.u32()?;
                    if position > n_tokens || cps.last().is_some_and(|c| c.position >= position) {
                        return Err(DecodeError::Field("checkpoint positions"));
                    }
                    let state = StateRef {
                        key: StateKey(r.array()?),
                        file_len: r.u64()?,
                    };
                    cps.push(CheckpointRef { position, state });
                }
                Some(cps)
            }
            _ => return Err(DecodeError::Field("recurrent tag")),
        };
        let tail = match r.u8()? {
            0 => None,
            1 => Some(StateRef {
                key: StateKey(r.array()?),
                file_len: r.u64()?,
            }),
            _ => return Err(DecodeError::Field("tail tag")),
        };
        let kv_bytes = r.u64()?;
        let created_s = r.u64()?;
        r.finish()?;
        Ok(EntryHead {
            identity,
            geometry,
            n_tokens,
            token_hash,
            checkpoints,
            tail,
            kv_bytes,
            created_s,
        })
    }

    /// Every state blob the entry references, checkpoints first.
    pub fn states(&self) -> impl Iterator<Item = &StateRef> {
        self.checkpoints
            .iter()
            .flatten()
            .map(|c| &c.state)
            .chain(self.tail.iter())
    }
}

impl EntryBody {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(12 + 4 * self.tokens.len() + 32 * self.blocks.len());
        put_u32(&mut out, FORMAT_VERSION);
        put_u32(&mut out, self.tokens.len() as u32);
        for t in &self.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        put_u32(&mut out, self.blocks.len() as u32);
        for b in &self.blocks {
            out.extend_from_slice(&b.0);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<EntryBody, DecodeError> {
        let mut r = Reader::new(bytes);
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(DecodeError::Version(version));
        }
        let n = r.count(4)?;
        let tokens: Vec<u32> = r
            .take(n * 4)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let n = r.count(32)?;
        if n != crate::key::blocks_for(tokens.len()) {
            return Err(DecodeError::Field("block count"));
        }
        let blocks = (0..n)
            .map(|_| r.array().map(BlockKey))
            .collect::<Result<_, _>>()?;
        r.finish()?;
        Ok(EntryBody { tokens, blocks })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_and_body_round_trip() {
        let head = EntryHead {
            identity: IdentityDigest([1; 32]),
            geometry: KvGeometry {
                layers: 2,
                kv_heads: 1,
                head_dim: 8,
                dtype: KvDtype::F16,
            },
            n_tokens: 300,
            token_hash: TokenHash([2; 32]),
            checkpoints: Some(vec![CheckpointRef {
                position: 256,
                state: StateRef {
                    key: StateKey([3; 32]),
                    file_len: 999,
                },
            }]),
            tail: Some(StateRef {
                key: StateKey([4; 32]),
                file_len: 77,
            }),
            kv_bytes: 12345,
            created_s: 1_700_000_000,
        };
        // The element type follows the geometry's three u32 (docs/cold-format.md).
        let mut bytes = head.encode();
        assert_eq!(bytes[4 + 32 + 12], KvDtype::F16.code());
        assert_eq!(EntryHead::decode(&bytes), Ok(head));
        bytes[4 + 32 + 12] = 9;
        assert_eq!(EntryHead::decode(&bytes), Err(DecodeError::KvDtype(9)));
        let body = EntryBody {
            tokens: (0..300).collect(),
            blocks: vec![BlockKey([5; 32]), BlockKey([6; 32])],
        };
        assert_eq!(EntryBody::decode(&body.encode()), Ok(body));
    }
}
