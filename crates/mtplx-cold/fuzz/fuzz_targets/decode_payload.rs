//! Blob headers and state payloads from arbitrary bytes: an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mtplx_cold::codec::{BlobHeader, StateBundle};

fuzz_target!(|data: &[u8]| {
    if let Ok((header, _)) = BlobHeader::decode(data) {
        assert_eq!(header.encode()[..224], data[..224]);
    }
    if let Ok(state) = StateBundle::decode(data) {
        // f32 NaN payloads compare unequal; compare the bytes instead.
        assert_eq!(state.encode(), data);
    }
});
