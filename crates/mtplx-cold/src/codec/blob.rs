//! The 256-byte header every blob file starts with.

use super::{DecodeError, Reader};
use crate::dtype::KvDtype;
use crate::key::FORMAT_VERSION;
use crate::payload::KvGeometry;

pub const MAGIC: [u8; 8] = *b"MTPXCOLD";
pub const HEADER_LEN: usize = 256;
/// Where the checksum sits: it covers `header[..CHECKSUM_AT]` and then the payload.
pub const CHECKSUM_AT: usize = 224;
/// Where a KV block header holds its rows' element type ([`KvDtype::code`], one byte; zero
/// in a state header).
pub const KV_DTYPE_AT: usize = 84;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlobKind {
    /// K/V rows of up to 256 positions, all layers. File extension `kv`.
    KvBlock,
    /// A recurrent checkpoint or an entry's tail state. File extension `st`.
    State,
}

impl BlobKind {
    pub fn extension(self) -> &'static str {
        match self {
            BlobKind::KvBlock => "kv",
            BlobKind::State => "st",
        }
    }

    pub(crate) fn code(self) -> u32 {
        match self {
            BlobKind::KvBlock => 1,
            BlobKind::State => 2,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<BlobKind> {
        match code {
            1 => Some(BlobKind::KvBlock),
            2 => Some(BlobKind::State),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateRole {
    Checkpoint,
    Tail,
}

/// The kind-specific part of a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Descriptor {
    Kv {
        geometry: KvGeometry,
        n_tokens: u32,
        first_position: u32,
    },
    State {
        role: StateRole,
        /// The checkpoint's position, or the entry length for a tail.
        position: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobHeader {
    pub key: [u8; 32],
    pub payload_len: u64,
    pub descriptor: Descriptor,
}

impl BlobHeader {
    pub fn kind(&self) -> BlobKind {
        match self.descriptor {
            Descriptor::Kv { .. } => BlobKind::KvBlock,
            Descriptor::State { .. } => BlobKind::State,
        }
    }

    /// The header bytes with a zero checksum; see [`seal`].
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&self.kind().code().to_le_bytes());
        h[16..48].copy_from_slice(&self.key);
        h[48..56].copy_from_slice(&self.payload_len.to_le_bytes());
        let words: [u32; 5] = match self.descriptor {
            Descriptor::Kv {
                geometry,
                n_tokens,
                first_position,
            } => [
                geometry.layers,
                geometry.kv_heads,
                geometry.head_dim,
                n_tokens,
                first_position,
            ],
            Descriptor::State { role, position } => {
                let role = match role {
                    StateRole::Checkpoint => 1,
                    StateRole::Tail => 2,
                };
                [role, position, 0, 0, 0]
            }
        };
        for (i, w) in words.iter().enumerate() {
            h[64 + 4 * i..68 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        if let Descriptor::Kv { geometry, .. } = self.descriptor {
            h[KV_DTYPE_AT] = geometry.dtype.code();
        }
        h
    }

    /// The element type code of a KV block header of this format version, read without
    /// decoding the rest (a header whose type was changed no longer decodes: its payload
    /// length is that of another type). `None` for bytes that are not such a header.
    pub fn raw_kv_dtype(bytes: &[u8]) -> Option<u8> {
        let word = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
        let kv = bytes.get(..8)? == MAGIC
            && word(8)? == FORMAT_VERSION
            && word(12)? == BlobKind::KvBlock.code();
        kv.then(|| bytes.get(KV_DTYPE_AT).copied())?
    }

    /// Decodes a header, checking everything but the checksum (which needs the payload).
    /// Returns the header and the stored checksum.
    pub fn decode(bytes: &[u8]) -> Result<(BlobHeader, [u8; 32]), DecodeError> {
        let mut r = Reader::new(bytes);
        if r.array::<8>()? != MAGIC {
            return Err(DecodeError::Foreign);
        }
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(DecodeError::Version(version));
        }
        let kind = BlobKind::from_code(r.u32()?).ok_or(DecodeError::Field("kind"))?;
        let key = r.array::<32>()?;
        let payload_len = r.u64()?;
        if r.u64()? != 0 {
            return Err(DecodeError::Field("reserved"));
        }
        let mut w = [0u32; 5];
        for x in &mut w {
            *x = r.u32()?;
        }
        let dtype_code = r.u8()?;
        let descriptor = match kind {
            BlobKind::KvBlock => {
                let geometry = KvGeometry {
                    layers: w[0],
                    kv_heads: w[1],
                    head_dim: w[2],
                    dtype: KvDtype::from_code(dtype_code)
                        .ok_or(DecodeError::KvDtype(dtype_code))?,
                };
                if !geometry.is_valid() || w[3] == 0 || w[3] as usize > crate::BLOCK_TOKENS {
                    return Err(DecodeError::Field("kv descriptor"));
                }
                if payload_len != w[3] as u64 * geometry.bytes_per_token() {
                    return Err(DecodeError::Field("payload length"));
                }
                Descriptor::Kv {
                    geometry,
                    n_tokens: w[3],
                    first_position: w[4],
                }
            }
            BlobKind::State => {
                let role = match w[0] {
                    1 => StateRole::Checkpoint,
                    2 => StateRole::Tail,
                    _ => return Err(DecodeError::Field("state role")),
                };
                if w[2..] != [0, 0, 0] || dtype_code != 0 {
                    return Err(DecodeError::Field("reserved"));
                }
                Descriptor::State {
                    role,
                    position: w[1],
                }
            }
        };
        if r.take(CHECKSUM_AT - KV_DTYPE_AT - 1)?
            .iter()
            .any(|&b| b != 0)
        {
            return Err(DecodeError::Field("reserved"));
        }
        let checksum = r.array::<32>()?;
        r.finish()?;
        Ok((
            BlobHeader {
                key,
                payload_len,
                descriptor,
            },
            checksum,
        ))
    }
}

/// blake3 over `header[..CHECKSUM_AT]` and the payload.
pub fn checksum(header: &[u8; HEADER_LEN], payload: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&header[..CHECKSUM_AT]);
    h.update(payload);
    *h.finalize().as_bytes()
}

/// Writes the checksum of `header` and `payload` into the header.
pub fn seal(header: &mut [u8; HEADER_LEN], payload: &[u8]) {
    let sum = checksum(header, payload);
    header[CHECKSUM_AT..].copy_from_slice(&sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_foreign_and_newer() {
        let g = KvGeometry {
            layers: 2,
            kv_heads: 3,
            head_dim: 4,
            dtype: KvDtype::Bf16,
        };
        let hdr = BlobHeader {
            key: [9; 32],
            payload_len: 5 * g.bytes_per_token(),
            descriptor: Descriptor::Kv {
                geometry: g,
                n_tokens: 5,
                first_position: 512,
            },
        };
        let mut bytes = hdr.encode();
        seal(&mut bytes, b"payload");
        let (back, sum) = BlobHeader::decode(&bytes).unwrap();
        assert_eq!(back, hdr);
        assert_eq!(sum, checksum(&bytes, b"payload"));

        let mut foreign = bytes;
        foreign[0] = b'X';
        assert_eq!(BlobHeader::decode(&foreign), Err(DecodeError::Foreign));
        let mut newer = bytes;
        newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        assert_eq!(
            BlobHeader::decode(&newer),
            Err(DecodeError::Version(FORMAT_VERSION + 1))
        );
        assert_eq!(BlobHeader::decode(&bytes[..100]), Err(DecodeError::Short));
    }

    #[test]
    fn a_kv_header_stores_its_element_type_and_a_payload_of_that_type() {
        for dtype in KvDtype::ALL {
            let geometry = KvGeometry {
                layers: 2,
                kv_heads: 3,
                head_dim: 32,
                dtype,
            };
            let hdr = |payload_len| BlobHeader {
                key: [1; 32],
                payload_len,
                descriptor: Descriptor::Kv {
                    geometry,
                    n_tokens: 5,
                    first_position: 0,
                },
            };
            let bytes = hdr(5 * geometry.bytes_per_token()).encode();
            assert_eq!(bytes[KV_DTYPE_AT], dtype.code());
            assert_eq!(BlobHeader::raw_kv_dtype(&bytes), Some(dtype.code()));
            assert_eq!(
                BlobHeader::decode(&bytes).map(|h| h.0),
                Ok(hdr(5 * geometry.bytes_per_token()))
            );
            // The payload length is that of the header's own type.
            let f32_len = 5 * KvGeometry {
                dtype: KvDtype::F32,
                ..geometry
            }
            .bytes_per_token();
            assert_eq!(
                BlobHeader::decode(&hdr(f32_len).encode()).is_ok(),
                dtype == KvDtype::F32
            );
            let mut unknown = bytes;
            unknown[KV_DTYPE_AT] = 5;
            assert_eq!(BlobHeader::decode(&unknown), Err(DecodeError::KvDtype(5)));
            assert_eq!(BlobHeader::raw_kv_dtype(&unknown), Some(5));
        }
        // A state header has no element type: the byte is reserved.
        let state = BlobHeader {
            key: [2; 32],
            payload_len: 9,
            descriptor: Descriptor::State {
                role: StateRole::Tail,
                position: 3,
            },
        };
        let mut bytes = state.encode();
        assert_eq!(BlobHeader::raw_kv_dtype(&bytes), None);
        bytes[KV_DTYPE_AT] = 1;
        assert_eq!(
            BlobHeader::decode(&bytes),
            Err(DecodeError::Field("reserved"))
        );
    }
}
