//! Lower-case hex of bytes: how keys are named on disk and shown in logs.

/// `bytes` as lower-case hex, two digits a byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
