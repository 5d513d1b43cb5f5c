//! One blob file on the read path: its name, opening it, and checking its header against
//! the manifest.

use std::io;

use super::inner::{blob_path, Inner};
use crate::codec::blob::HEADER_LEN;
use crate::codec::{BlobHeader, BlobKind, DecodeError, Descriptor};
use crate::error::ReadError;
use crate::hex::hex;
use crate::storage::StorageFile;

pub(super) fn blob_name(kind: BlobKind, key: &[u8; 32]) -> String {
    format!("{}.{}", hex(key), kind.extension())
}

pub(super) fn open_blob(
    inner: &Inner,
    kind: BlobKind,
    key: &[u8; 32],
) -> Result<Box<dyn StorageFile>, ReadError> {
    inner
        .storage
        .open(&blob_path(kind, key))
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ReadError::Missing {
                blob: blob_name(kind, key),
            },
            _ => ReadError::Io {
                blob: blob_name(kind, key),
                source: e,
            },
        })
}

/// Checks a blob whose payload should be `payload_len` bytes: its length, and its header
/// against what the manifest expects. Returns the header's bytes and the stored checksum
/// (which covers `header[..CHECKSUM_AT]` and the payload, still to be read).
pub(super) fn check_header(
    file: &dyn StorageFile,
    key: &[u8; 32],
    expect: Descriptor,
    payload_len: usize,
) -> Result<([u8; HEADER_LEN], [u8; 32]), ReadError> {
    let kind = match expect {
        Descriptor::Kv { .. } => BlobKind::KvBlock,
        Descriptor::State { .. } => BlobKind::State,
    };
    let blob = || blob_name(kind, key);
    let ioe = |source| ReadError::Io {
        blob: blob(),
        source,
    };
    let expected = (HEADER_LEN + payload_len) as u64;
    let actual = file.size().map_err(ioe)?;
    let mut head = [0u8; HEADER_LEN];
    if actual >= HEADER_LEN as u64 {
        file.read_at(0, &mut head).map_err(ioe)?;
    }
    // The element type first: rows of another type are refused by name (such a header
    // doesn't decode, its payload length being that of its own type).
    if let (Descriptor::Kv { geometry, .. }, Some(found)) =
        (expect, BlobHeader::raw_kv_dtype(&head))
    {
        if found != geometry.dtype.code() {
            return Err(ReadError::KvDtype {
                blob: blob(),
                found,
                expected: geometry.dtype,
            });
        }
    }
    let header = match BlobHeader::decode(&head) {
        Ok(h) => Some(h),
        Err(DecodeError::Foreign) if actual >= HEADER_LEN as u64 => {
            return Err(ReadError::Foreign { blob: blob() })
        }
        Err(DecodeError::Version(found)) => {
            return Err(ReadError::FormatMismatch {
                blob: blob(),
                found,
                expected: crate::FORMAT_VERSION,
            })
        }
        Err(_) if actual != expected => None,
        Err(_) => {
            return Err(ReadError::Header {
                blob: blob(),
                what: "fields",
            })
        }
    };
    if actual != expected {
        return Err(ReadError::Truncated {
            blob: blob(),
            expected,
            actual,
        });
    }
    let (header, sum) = header.expect("decoded above when the length is right");
    if header.key != *key {
        return Err(ReadError::Header {
            blob: blob(),
            what: "key",
        });
    }
    if header.descriptor != expect || header.payload_len != payload_len as u64 {
        let what = match (header.descriptor, expect) {
            (Descriptor::Kv { geometry: a, .. }, Descriptor::Kv { geometry: b, .. }) if a != b => {
                return Err(ReadError::FormatMismatch {
                    blob: blob(),
                    found: crate::FORMAT_VERSION,
                    expected: crate::FORMAT_VERSION,
                })
            }
            _ => "descriptor",
        };
        return Err(ReadError::Header { blob: blob(), what });
    }
    Ok((head, sum))
}
