//! Manifest records (entry heads and bodies) from arbitrary bytes: an error, never a panic,
//! and a record that decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mtplx_cold::codec::{EntryBody, EntryHead};

fuzz_target!(|data: &[u8]| {
    if let Ok(head) = EntryHead::decode(data) {
        assert_eq!(head.encode(), data);
    }
    if let Ok(body) = EntryBody::decode(data) {
        assert_eq!(body.encode(), data);
    }
});
