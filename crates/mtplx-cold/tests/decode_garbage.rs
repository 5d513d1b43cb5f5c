//! Decoders take any bytes without panicking (the fuzz targets in `fuzz/` run the same
//! calls for longer).

use mtplx_cold::codec::{BlobHeader, EntryBody, EntryHead, StateBundle};
use mtplx_cold::{F32Buffer, NamedBytes};
use proptest::prelude::*;

fn valid_encodings() -> Vec<Vec<u8>> {
    let state = StateBundle {
        buffers: vec![F32Buffer {
            name: "a".into(),
            shape: vec![2, 2],
            data: vec![1.0; 4],
        }],
        bytes: vec![NamedBytes {
            name: "b".into(),
            bytes: vec![1, 2],
        }],
    };
    let body = EntryBody {
        tokens: (0..300).collect(),
        blocks: vec![mtplx_cold::BlockKey([1; 32]); 2],
    };
    vec![state.encode(), body.encode()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        // Whatever decodes is canonical: it re-encodes to the same bytes.
        if let Ok((h, _)) = BlobHeader::decode(&bytes) {
            prop_assert_eq!(&h.encode()[..224], &bytes[..224]);
        }
        if let Ok(s) = StateBundle::decode(&bytes) {
            prop_assert_eq!(s.encode(), bytes.clone());
        }
        if let Ok(h) = EntryHead::decode(&bytes) {
            prop_assert_eq!(h.encode(), bytes.clone());
        }
        if let Ok(b) = EntryBody::decode(&bytes) {
            prop_assert_eq!(b.encode(), bytes.clone());
        }
    }

    #[test]
    fn mutated_valid_encodings_never_panic(which in 0usize..2, at in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let mut enc = valid_encodings()[which].clone();
        let i = at.index(enc.len());
        enc[i] = byte;
        let len = cut.index(enc.len() + 1);
        if let Ok(s) = StateBundle::decode(&enc[..len]) {
            prop_assert_eq!(s.encode(), enc[..len].to_vec());
        }
        if let Ok(b) = EntryBody::decode(&enc[..len]) {
            prop_assert_eq!(b.encode(), enc[..len].to_vec());
        }
        let _ = EntryHead::decode(&enc[..len]);
    }
}
