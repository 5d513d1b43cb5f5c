//! Every way rows reach a sink — read straight into its own rows (`direct_rows`, lent in one
//! piece per layer or in pages of any size), streamed from disk or, when the blobs are in
//! memory, by several threads; staged and handed over through `write_rows`; or read into
//! host buffers the sink lent and handed back (`lend_staging`, `write_staged`) — delivers
//! the same, exact rows at any restore point, in several extents per block; a block that
//! fails its checksum after some of its rows reached the sink ends the restore with a named
//! miss and a `discard`; and lent pieces that don't cover the rows in order fail it. Rows
//! are bytes of any element type, lent or handed over at any alignment.

mod common;

use common::*;
use mtplx_cold::storage::FaultyStorage;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use mtplx_cold::{
    BoxError, ColdIndex, DirectLayer, DirectPiece, KvDtype, KvGeometry, KvRows, KvSink, ReadPath,
    Recurrent, RecurrentCheckpoint, SpillEntry, StagingBuffer, TailState,
};
use proptest::prelude::*;

/// Wide enough that a block is read in several extents (512 KiB per layer of a block, in
/// any float element type: 1 KiB rows; 1,088-byte rows of a quantized one).
fn wide(dtype: KvDtype) -> KvGeometry {
    KvGeometry {
        layers: 4,
        kv_heads: 4,
        head_dim: if dtype.group() > 1 {
            256
        } else {
            256 / dtype.element_bytes() as u32
        },
        dtype,
    }
}

const WIDE: KvDtype = KvDtype::F32;

fn wide_rows(dtype: KvDtype, tokens: &[u32]) -> KvRows {
    if dtype.group() > 1 {
        return rows_of(wide(dtype), tokens);
    }
    KvRows::from_fn(wide(dtype), tokens.len(), |l, p, i, v| {
        tokens[p] as f32 * 0.5 + l as f32 * 1000.0 + i as f32 + if v { 0.25 } else { 0.0 }
    })
}

fn wide_entry(dtype: KvDtype, tokens: &[u32]) -> SpillEntry {
    SpillEntry {
        identity: identity_of(dtype),
        geometry: wide(dtype),
        kv: Box::new(wide_rows(dtype, tokens)),
        recurrent: Recurrent::None,
        ..entry(tokens)
    }
}

/// A sink without direct rows: everything comes through `write_rows`.
#[derive(Default)]
struct Staged {
    rows: KvRows,
    discarded: bool,
}

impl KvSink for Staged {
    fn begin(&mut self, g: KvGeometry, rows: usize) -> Result<(), BoxError> {
        self.rows.begin(g, rows)
    }

    fn write_rows(&mut self, l: usize, start: usize, k: &[u8], v: &[u8]) -> Result<(), BoxError> {
        self.rows.write_rows(l, start, k, v)
    }

    fn recurrent(&mut self, cp: RecurrentCheckpoint) -> Result<(), BoxError> {
        self.rows.recurrent(cp)
    }

    fn tail(&mut self, tail: TailState) -> Result<(), BoxError> {
        self.rows.tail(tail)
    }

    fn discard(&mut self) {
        self.discarded = true;
    }
}

/// Where a [`Lending`] sink's late copies land: per layer, K and V bytes of the restore's rows.
type Landed = Arc<Mutex<Vec<(Vec<u8>, Vec<u8>)>>>;

/// A buffer [`Lending`] lent. A hand-over out of it is only noted; its bytes are copied when
/// the buffer is next filled or dropped, as a device's queued copies read a page-locked
/// buffer after the call that queued them returned.
struct LendBuf {
    bytes: Vec<u8>,
    /// (layer, byte in the layer's rows, K range, V range) not copied yet.
    pending: Vec<(usize, usize, Range<usize>, Range<usize>)>,
    landed: Landed,
}

impl LendBuf {
    fn land(&mut self) {
        let mut landed = self.landed.lock().unwrap();
        for (layer, at, k, v) in self.pending.drain(..) {
            let (lk, lv) = &mut landed[layer];
            lk[at..at + k.len()].copy_from_slice(&self.bytes[k]);
            lv[at..at + v.len()].copy_from_slice(&self.bytes[v]);
        }
    }
}

impl StagingBuffer for LendBuf {
    fn to_fill(&mut self) -> Result<&mut [u8], BoxError> {
        self.land();
        Ok(&mut self.bytes)
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl Drop for LendBuf {
    fn drop(&mut self) {
        self.land();
    }
}

/// A sink that lends host buffers (`short` bytes fewer than asked) and takes rows only
/// through `write_staged`, copying them late (see [`LendBuf`]); the hand-over numbered
/// `fail_at` (from 1) fails.
#[derive(Default)]
struct Lending {
    rest: KvRows,
    landed: Landed,
    /// Per layer, the next position expected.
    next: Vec<usize>,
    short: usize,
    fail_at: Option<usize>,
    calls: usize,
    lent: usize,
    discarded: bool,
}

impl Lending {
    /// The rows received, once the restore's buffers are dropped.
    fn received(&self) -> KvRows {
        let landed = self.landed.lock().unwrap();
        KvRows {
            k: landed.iter().map(|l| l.0.clone()).collect(),
            v: landed.iter().map(|l| l.1.clone()).collect(),
            ..self.rest.clone()
        }
    }
}

impl KvSink for Lending {
    fn begin(&mut self, g: KvGeometry, rows: usize) -> Result<(), BoxError> {
        let n = rows * g.row_bytes();
        *self.landed.lock().unwrap() = (0..g.layers).map(|_| (vec![0; n], vec![0; n])).collect();
        self.next = vec![0; g.layers as usize];
        self.rest.begin(g, 0)
    }

    fn write_rows(&mut self, _: usize, _: usize, _: &[u8], _: &[u8]) -> Result<(), BoxError> {
        Err("rows came through write_rows".into())
    }

    fn lend_staging(&mut self, count: usize, bytes: usize) -> Option<Vec<Box<dyn StagingBuffer>>> {
        self.lent = count;
        let buf = |_| {
            Box::new(LendBuf {
                bytes: vec![0; bytes - self.short],
                pending: Vec::new(),
                landed: self.landed.clone(),
            }) as Box<dyn StagingBuffer>
        };
        Some((0..count).map(buf).collect())
    }

    fn write_staged(
        &mut self,
        layer: usize,
        start: usize,
        buf: &mut dyn StagingBuffer,
        k: Range<usize>,
        v: Range<usize>,
    ) -> Result<(), BoxError> {
        self.calls += 1;
        if self.fail_at == Some(self.calls) {
            return Err("the device is gone".into());
        }
        let row = self.rest.geometry.unwrap().row_bytes();
        if start != self.next[layer] || k.len() != v.len() || !k.len().is_multiple_of(row) {
            return Err(format!("layer {layer}: rows {k:?} from {start}").into());
        }
        self.next[layer] += k.len() / row;
        let buf = buf
            .as_any_mut()
            .downcast_mut::<LendBuf>()
            .expect("one of mine");
        buf.pending.push((layer, start * row, k, v));
        Ok(())
    }

    fn recurrent(&mut self, cp: RecurrentCheckpoint) -> Result<(), BoxError> {
        self.rest.recurrent(cp)
    }

    fn tail(&mut self, tail: TailState) -> Result<(), BoxError> {
        self.rest.tail(tail)
    }

    fn discard(&mut self) {
        self.discarded = true;
    }
}

/// Lends its rows in pieces of `page` positions (0: one piece per layer), as a paged cache
/// does; counts `write_rows` calls, to show the direct path makes none. `odd`: the rows it
/// lends start one byte into its buffers, aligned for no element type.
#[derive(Default)]
struct Direct {
    rows: KvRows,
    page: usize,
    odd: bool,
    /// Per layer, K and V, when `odd`: one byte, then the rows.
    shifted: Vec<(Vec<u8>, Vec<u8>)>,
    calls: usize,
    discarded: bool,
}

impl Direct {
    fn paged(page: usize) -> Direct {
        Direct {
            page,
            ..Direct::default()
        }
    }

    fn odd(page: usize) -> Direct {
        Direct {
            odd: true,
            ..Direct::paged(page)
        }
    }

    /// The rows received, wherever they were lent from.
    fn received(&self, point: usize) -> KvRows {
        let mut rows = self.rows.clone();
        if self.odd {
            rows.k = self.shifted.iter().map(|l| l.0[1..].to_vec()).collect();
            rows.v = self.shifted.iter().map(|l| l.1[1..].to_vec()).collect();
        }
        rows.truncated(point)
    }
}

/// `layer`'s one piece cut into pieces of `page` positions, the last maybe shorter.
fn in_pages(layer: DirectLayer<'_>, page: usize, row: usize) -> DirectLayer<'_> {
    let [whole] = <[_; 1]>::try_from(layer.pieces).expect("KvRows lends one piece");
    let pieces = whole
        .k
        .chunks_mut(page * row)
        .zip(whole.v.chunks_mut(page * row))
        .enumerate()
        .map(|(i, (k, v))| DirectPiece {
            positions: i * page..i * page + k.len() / row,
            k,
            v,
        })
        .collect();
    DirectLayer { pieces }
}

impl KvSink for Direct {
    fn begin(&mut self, g: KvGeometry, rows: usize) -> Result<(), BoxError> {
        self.rows.begin(g, rows)
    }

    fn direct_rows(&mut self) -> Option<Vec<DirectLayer<'_>>> {
        let (page, row) = (self.page, self.rows.geometry?.row_bytes());
        let layers = match self.odd {
            false => self.rows.direct_rows()?,
            true => {
                let n = self.rows.k.first()?.capacity();
                let rows = n / row;
                self.shifted = (0..self.rows.k.len())
                    .map(|_| (vec![0xa5; n + 1], vec![0x5a; n + 1]))
                    .collect();
                self.shifted
                    .iter_mut()
                    .map(|(k, v)| DirectLayer::whole(rows, &mut k[1..], &mut v[1..]))
                    .collect()
            }
        };
        match page {
            0 => Some(layers),
            _ => Some(layers.into_iter().map(|l| in_pages(l, page, row)).collect()),
        }
    }

    fn write_rows(&mut self, l: usize, start: usize, k: &[u8], v: &[u8]) -> Result<(), BoxError> {
        self.calls += 1;
        self.rows.write_rows(l, start, k, v)
    }

    fn tail(&mut self, tail: TailState) -> Result<(), BoxError> {
        self.rows.tail(tail)
    }

    fn discard(&mut self) {
        self.discarded = true;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// `page` 0 lends one piece per layer; 16 and 64 divide a block, 1, 7, 100 and 300 don't
    /// (300 spans blocks).
    /// Rows of every element type; lent pieces aligned or not (`odd`).
    #[test]
    fn direct_and_staged_restores_deliver_the_same_exact_rows(
        len in 1usize..800,
        cut in 0.0f64..1.0,
        page in prop::sample::select(vec![0usize, 1, 7, 16, 64, 100, 300]),
        dtype in prop::sample::select(KvDtype::ALL.to_vec()),
        odd in any::<bool>(),
    ) {
        let st = FaultyStorage::new();
        let store = open(&st, config());
        let t = tokens(len, 3);
        store.put(&wide_entry(dtype, &t)).unwrap();
        // A block prefix of a longer prompt restores mid-entry when it is partial.
        let point = ((len as f64 * cut) as usize).max(1);
        let full = lookup_as(&store, &identity_of(dtype), &t).exact.unwrap();
        let hit = mtplx_cold::ColdCandidate { restore_point: point, tail: point == len, ..full };
        let want = wide_rows(dtype, &t).truncated(point);
        let sink = |page| if odd { Direct::odd(page) } else { Direct::paged(page) };

        let mut direct = sink(page);
        let report = store.restore(&hit, &mut direct).unwrap();
        prop_assert_eq!(direct.calls, 0);
        prop_assert_eq!(direct.received(point), want.clone());
        prop_assert_eq!(report.rows, point);
        prop_assert_eq!(report.blocks_read, point.div_ceil(256));
        prop_assert_eq!(report.read_path, ReadPath::Streamed);

        let mut staged = Staged::default();
        let r = store.restore(&hit, &mut staged).unwrap();
        prop_assert_eq!(r.read_path, ReadPath::Staged);
        prop_assert_eq!(staged.rows.truncated(point), want.clone());
        prop_assert_eq!(direct.rows.tail.is_some(), point == len);
        prop_assert!(!direct.discarded && !staged.discarded);

        let mut lending = Lending::default();
        let r = store.restore(&hit, &mut lending).unwrap();
        let lent_path = matches!(r.read_path, ReadPath::Lent { hashers } if hashers >= 1);
        prop_assert!(lent_path, "{:?}", r.read_path);
        prop_assert_eq!(lending.received().truncated(point), want.clone());
        prop_assert_eq!(lending.rest.tail.is_some(), point == len);
        prop_assert_eq!((r.rows, r.blocks_read, r.bytes_read), (report.rows, report.blocks_read, report.bytes_read));
        // One buffer an extent at most (the wide rows' four layers are one extent a block).
        prop_assert_eq!(lending.lent, point.div_ceil(256).min(16));
        prop_assert!(!lending.discarded);

        // The blobs in memory: a direct sink's blocks are read by several threads; a
        // staged sink still streams.
        st.set_resident(true);
        let mut resident = sink(page);
        let r = store.restore(&hit, &mut resident).unwrap();
        let resident_path = matches!(r.read_path, ReadPath::Resident { threads } if threads >= 1);
        prop_assert!(resident_path, "{:?}", r.read_path);
        prop_assert_eq!(resident.calls, 0);
        prop_assert_eq!(resident.received(point), want.clone());
        prop_assert_eq!(resident.rows.tail.is_some(), point == len);
        prop_assert_eq!((r.rows, r.blocks_read, r.bytes_read), (report.rows, report.blocks_read, report.bytes_read));
        let mut staged = Staged::default();
        let r = store.restore(&hit, &mut staged).unwrap();
        prop_assert_eq!(r.read_path, ReadPath::Staged);
        prop_assert_eq!(staged.rows.truncated(point), want);
        prop_assert!(!resident.discarded && !staged.discarded);
    }
}

/// Flips one bit in the last extent of the second block: rows of that block (and all of
/// the first) reached the sink before its checksum failed. `direct`: the sink lends its
/// rows in pages of that many positions (0: one piece per layer).
#[test]
fn a_checksum_failure_after_rows_arrived_is_a_miss_and_discards_the_sink() {
    #[derive(Debug, Clone, Copy)]
    enum Sink {
        Direct(usize),
        Staged,
        Lending,
    }
    let cases = [
        (Sink::Direct(0), false),
        (Sink::Staged, false),
        (Sink::Lending, false),
        (Sink::Direct(0), true),
        (Sink::Direct(7), false),
        (Sink::Direct(7), true),
        (Sink::Lending, true),
    ];
    for (kind, resident) in cases {
        let st = FaultyStorage::new();
        st.set_resident(resident);
        let store = open(&st, config());
        let t = tokens(700, 5);
        store.put(&wide_entry(WIDE, &t)).unwrap();
        let hit = lookup(&store, &t).exact.unwrap();
        let keys = mtplx_cold::block_keys(&identity().digest(), &t);
        let path = std::path::Path::new("blobs").join(format!("{}.kv", keys[1]));
        let len = mtplx_cold::storage::Storage::open(&st, &path)
            .unwrap()
            .size()
            .unwrap();
        st.flip_bit(&path, (len - 3) * 8).unwrap();

        let (err, discarded) = match kind {
            Sink::Direct(page) => {
                let mut sink = Direct::paged(page);
                (store.restore(&hit, &mut sink).unwrap_err(), sink.discarded)
            }
            Sink::Staged => {
                let mut sink = Staged::default();
                let e = store.restore(&hit, &mut sink).unwrap_err();
                // Rows of the first block, and of the bad one, had arrived.
                assert!(sink.rows.positions() > 256);
                (e, sink.discarded)
            }
            Sink::Lending => {
                let mut sink = Lending::default();
                let e = store.restore(&hit, &mut sink).unwrap_err();
                // Every block's rows had been handed over: the checksums lag behind.
                assert_eq!(sink.next, vec![700; 4]);
                (e, sink.discarded)
            }
        };
        let case = format!("{kind:?}, resident: {resident}");
        assert_eq!(
            err.miss_reason().to_string(),
            "ssd_restore_error:checksum",
            "{case}"
        );
        assert!(discarded, "{case}");
    }
}

/// A sink that lends buffers too small for an extent, or whose hand-over fails on its first,
/// a middle or its last call, ends the restore with an error and a `discard`: no hang (the
/// reader, the hashers and the calling thread each stop when another does), no panic.
#[test]
fn a_lending_sink_that_fails_ends_the_restore() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(700, 5);
    store.put(&wide_entry(WIDE, &t)).unwrap();
    let hit = lookup(&store, &t).exact.unwrap();
    // 3 blocks of 4 layers; an extent of whole layers (at least 4 MiB): a hand-over a layer.
    let calls = 3 * 4;
    let short = Lending {
        short: 1,
        ..Lending::default()
    };
    let failing = |at| Lending {
        fail_at: Some(at),
        ..Lending::default()
    };
    for mut sink in [short, failing(1), failing(calls / 2), failing(calls)] {
        let case = format!("short {}, failing at {:?}", sink.short, sink.fail_at);
        let err = store.restore(&hit, &mut sink).unwrap_err();
        assert!(sink.discarded, "{case}");
        assert!(
            err.miss_reason()
                .to_string()
                .starts_with("ssd_restore_error"),
            "{case}: {err}"
        );
        if let Some(at) = sink.fail_at {
            assert_eq!(sink.calls, at, "{case}: no hand-over after the failed one");
        }
    }
    // The same store still restores into a sink that doesn't fail.
    let mut ok = Lending::default();
    store.restore(&hit, &mut ok).unwrap();
    assert_eq!(ok.received().truncated(700), wide_rows(WIDE, &t));
}

/// A sink whose pieces leave a gap, overlap, or hold the wrong number of values fails the
/// restore (a sink error, then `discard`) instead of leaving rows unwritten or misplaced.
#[test]
fn pieces_that_dont_cover_the_rows_in_order_fail_the_restore() {
    struct Bad {
        rows: KvRows,
        how: usize,
        discarded: bool,
    }
    impl KvSink for Bad {
        fn begin(&mut self, g: KvGeometry, rows: usize) -> Result<(), BoxError> {
            self.rows.begin(g, rows)
        }
        fn direct_rows(&mut self) -> Option<Vec<DirectLayer<'_>>> {
            let row = self.rows.geometry?.row_bytes();
            let how = self.how;
            let mut layers: Vec<_> = self
                .rows
                .direct_rows()?
                .into_iter()
                .map(|l| in_pages(l, 10, row))
                .collect();
            let last = layers.last_mut()?;
            match how {
                // A gap: the second piece is missing.
                0 => drop(last.pieces.remove(1)),
                // Out of order.
                1 => last.pieces.swap(0, 1),
                // A piece whose V holds one row fewer than its positions.
                2 => {
                    let p = &mut last.pieces[1];
                    let v = std::mem::take(&mut p.v);
                    p.v = &mut v[row..];
                }
                // A layer missing.
                _ => drop(layers.pop()),
            }
            Some(layers)
        }
        fn write_rows(&mut self, _: usize, _: usize, _: &[u8], _: &[u8]) -> Result<(), BoxError> {
            Err("no write_rows after direct rows".into())
        }
        fn discard(&mut self) {
            self.discarded = true;
        }
    }
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(300, 2);
    store.put(&wide_entry(WIDE, &t)).unwrap();
    let hit = lookup(&store, &t).exact.unwrap();
    for how in 0..4 {
        let mut sink = Bad {
            rows: KvRows::default(),
            how,
            discarded: false,
        };
        let err = store.restore(&hit, &mut sink).unwrap_err();
        assert_eq!(
            err.miss_reason().to_string(),
            "ssd_restore_error:sink",
            "{how}"
        );
        assert!(sink.discarded, "{how}");
    }
}

#[test]
fn kv_rows_discards_itself() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(300, 1);
    store.put(&wide_entry(WIDE, &t)).unwrap();
    let hit = lookup(&store, &t).exact.unwrap();
    let keys = mtplx_cold::block_keys(&identity().digest(), &t);
    st.flip_bit(
        &std::path::Path::new("blobs").join(format!("{}.kv", keys[0])),
        300 * 8,
    )
    .unwrap();
    let mut sink = KvRows::default();
    assert!(store.restore(&hit, &mut sink).is_err());
    assert_eq!(sink, KvRows::default());
}
