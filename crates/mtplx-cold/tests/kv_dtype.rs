//! Rows of every element type are stored as their own bytes: restored byte for byte by
//! both restore paths, and an f16 block's payload is half an f32 one's.

mod common;

use std::path::Path;

use common::*;
use mtplx_cold::codec::{blob::KV_DTYPE_AT, HEADER_LEN};
use mtplx_cold::storage::{FaultyStorage, Storage};
use mtplx_cold::{BoxError, ColdIndex, KvDtype, KvGeometry, KvRows, KvSink, ReadPath, TailState};

/// A sink without direct rows: every row comes through `write_rows`.
#[derive(Default)]
struct Staged(KvRows);

impl KvSink for Staged {
    fn begin(&mut self, g: KvGeometry, rows: usize) -> Result<(), BoxError> {
        self.0.begin(g, rows)
    }

    fn write_rows(&mut self, l: usize, start: usize, k: &[u8], v: &[u8]) -> Result<(), BoxError> {
        self.0.write_rows(l, start, k, v)
    }

    fn tail(&mut self, tail: TailState) -> Result<(), BoxError> {
        self.0.tail(tail)
    }
}

#[test]
fn every_element_type_round_trips_byte_for_byte_through_both_restore_paths() {
    for dtype in KvDtype::ALL {
        let st = FaultyStorage::new();
        let store = open(&st, config());
        let t = tokens(600, 7);
        let geometry = geometry_of(dtype);
        store.put(&entry_of(dtype, &t)).unwrap();
        let written = rows_of(geometry, &t);
        assert_eq!(written.k[0].len(), 600 * geometry.row_bytes());

        let mut prompt = t.clone();
        prompt.push(9);
        let hit = lookup_as(&store, &identity_of(dtype), &prompt)
            .exact
            .unwrap();
        let mut direct = KvRows::default();
        let report = store.restore(&hit, &mut direct).unwrap();
        assert_eq!(report.read_path, ReadPath::Streamed, "{dtype}");
        let mut staged = Staged::default();
        let report = store.restore(&hit, &mut staged).unwrap();
        assert_eq!(report.read_path, ReadPath::Staged, "{dtype}");
        for got in [direct, staged.0] {
            // The sink is told the rows' type, and gets the bytes that were written.
            assert_eq!(got.geometry, Some(geometry), "{dtype}");
            assert_eq!(got.k, written.k, "{dtype}");
            assert_eq!(got.v, written.v, "{dtype}");
            assert_eq!(got.tail, Some(tail(600)), "{dtype}");
        }
        // A restore point inside a block delivers the first rows of it, as stored.
        let part = mtplx_cold::ColdCandidate {
            restore_point: 300,
            tail: false,
            ..hit
        };
        let got = restore(&store, &part).unwrap();
        assert_eq!(got.truncated(300), written.truncated(300), "{dtype}");
    }
}

#[test]
fn values_are_encoded_in_the_geometrys_type() {
    // 1/3 is exact in none of them: each type rounds it its own way.
    let third = 1.0f32 / 3.0;
    for (dtype, want) in [
        (KvDtype::F32, third.to_le_bytes().to_vec()),
        (
            KvDtype::F16,
            half::f16::from_f32(third).to_le_bytes().to_vec(),
        ),
        (
            KvDtype::Bf16,
            half::bf16::from_f32(third).to_le_bytes().to_vec(),
        ),
    ] {
        let g = KvGeometry { dtype, ..GEOMETRY };
        let rows = KvRows::from_fn(g, 2, |_, _, _, _| third);
        assert_eq!(rows.positions(), 2);
        assert_eq!(rows.k[0][..dtype.element_bytes()], want[..], "{dtype}");
        assert_eq!(rows.k[0].len(), 2 * g.row_bytes());
        let back = rows.values(0, true);
        assert_eq!(back.len(), 2 * g.row_len());
        assert!(back.iter().all(|&x| (x - third).abs() < 2e-3), "{dtype}");
        assert_eq!(back[0] == third, dtype == KvDtype::F32);
    }
}

/// The KV blobs' payload bytes (file length less the header), and their headers' element
/// type codes.
fn kv_payloads(st: &FaultyStorage) -> (u64, Vec<u8>) {
    let blobs = st.files(Path::new("blobs"));
    let kv: Vec<_> = blobs
        .iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "kv"))
        .collect();
    let codes = kv
        .iter()
        .map(|(p, _)| {
            let mut h = [0u8; HEADER_LEN];
            st.open(p).unwrap().read_at(0, &mut h).unwrap();
            h[KV_DTYPE_AT]
        })
        .collect();
    (
        kv.iter().map(|(_, len)| len - HEADER_LEN as u64).sum(),
        codes,
    )
}

#[test]
fn an_f16_entrys_blocks_take_half_the_bytes_of_an_f32_ones() {
    let t = tokens(700, 3); // blocks of 256, 256 and 188 tokens
    let payload = |dtype: KvDtype| {
        let st = FaultyStorage::new();
        let store = open(&st, config());
        store.put(&entry_of(dtype, &t)).unwrap();
        let (bytes, codes) = kv_payloads(&st);
        assert_eq!(codes, [dtype.code(); 3], "{dtype}");
        bytes
    };
    let f32_bytes = payload(KvDtype::F32);
    assert_eq!(f32_bytes, 700 * GEOMETRY.bytes_per_token());
    assert_eq!(f32_bytes, 700 * 2 * 3 * 2 * 4 * 4);
    assert_eq!(payload(KvDtype::F16) * 2, f32_bytes);
    assert_eq!(payload(KvDtype::Bf16) * 2, f32_bytes);
}
