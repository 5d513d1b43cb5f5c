//! [`DecodeError`]: why stored bytes did not decode.

/// Why bytes did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("input ends early")]
    Short,
    #[error("trailing bytes")]
    Trailing,
    #[error("not an mtplx-cold encoding")]
    Foreign,
    #[error("format version {0}")]
    Version(u32),
    #[error("unknown K/V element type code {0}")]
    KvDtype(u8),
    #[error("bad field: {0}")]
    Field(&'static str),
}
