//! Building the caller's cache from an SSD restore, through the caller's factory.

use std::any::Any;
use std::ops::Range;

use mtplx_cold::{
    BoxError, DirectLayer, DirectPiece, KvGeometry, KvSink, RecurrentCheckpoint, StagingBuffer,
    TailState,
};
use mtplx_kv::{CacheFactory, KvCache, KvShape, LentLayer};

use crate::convert::geometry;

/// A [`KvSink`] that builds the restored rows straight into a cache built by the caller's
/// factory: nothing of the SSD entry outlives the restore except the cache itself (and the
/// recurrent and tail state handed over with it). When the layout lends its storage
/// ([`KvCache::append_in_place`]: every layout does, a contiguous layer in one piece, a
/// paged one a piece per block, a segmented one a piece per segment), blocks are read from
/// disk straight into it ([`KvSink::direct_rows`]); a device's cache lends page-locked host
/// buffers instead ([`KvCache::lend_staging`]), which the cold tier reads blocks into and
/// hands back ([`KvSink::write_staged`]); otherwise the cold tier stages them and they are
/// appended.
pub(crate) struct CacheSink<'a> {
    factory: &'a CacheFactory,
    shape: KvShape,
    /// Positions the restore delivers (from `begin`).
    rows: usize,
    pub(crate) cache: Option<Box<dyn KvCache>>,
    pub(crate) recurrent: Option<RecurrentCheckpoint>,
    pub(crate) tail: Option<TailState>,
}

impl<'a> CacheSink<'a> {
    pub(crate) fn new(factory: &'a CacheFactory, shape: KvShape) -> Self {
        CacheSink {
            factory,
            shape,
            rows: 0,
            cache: None,
            recurrent: None,
            tail: None,
        }
    }
}

impl KvSink for CacheSink<'_> {
    fn begin(&mut self, g: KvGeometry, rows: usize) -> Result<(), BoxError> {
        if g != geometry(self.shape, self.factory.dtype()) {
            return Err(format!(
                "stored geometry {g:?} differs from the caller's shape {:?} in {}",
                self.shape,
                self.factory.dtype()
            )
            .into());
        }
        let mut cache = self.factory.new_cache(self.shape);
        // A device cache grows by copying: once for the whole restore, not once a block.
        cache.reserve_positions(rows)?;
        self.cache = Some(cache);
        self.rows = rows;
        Ok(())
    }

    /// The cache's lent pieces as they are: the cache is new, so its positions are the
    /// restore's `0..rows`.
    fn direct_rows(&mut self) -> Option<Vec<DirectLayer<'_>>> {
        let lent = self.cache.as_mut()?.append_in_place(self.rows)?;
        Some(lent.into_iter().map(direct_layer).collect())
    }

    fn write_rows(
        &mut self,
        layer: usize,
        start: usize,
        k: &[u8],
        v: &[u8],
    ) -> Result<(), BoxError> {
        let cache = self.appending(layer, start)?;
        // `begin` checked the stored type is the cache's: the bytes are kept as they are.
        Ok(cache.append_stored(layer, k, v)?)
    }

    /// The cache's own buffers, wrapped for the cold tier.
    fn lend_staging(&mut self, count: usize, bytes: usize) -> Option<Vec<Box<dyn StagingBuffer>>> {
        let lent = self.cache.as_mut()?.lend_staging(count, bytes)?;
        let wrap = |b| Box::new(Lent(b)) as Box<dyn StagingBuffer>;
        Some(lent.into_iter().map(wrap).collect())
    }

    fn write_staged(
        &mut self,
        layer: usize,
        start: usize,
        buf: &mut dyn StagingBuffer,
        k: Range<usize>,
        v: Range<usize>,
    ) -> Result<(), BoxError> {
        let cache = self.appending(layer, start)?;
        match buf.as_any_mut().downcast_mut::<Lent>() {
            Some(Lent(lent)) => Ok(cache.append_staged(layer, lent.as_mut(), k, v)?),
            None => {
                let bytes = buf.bytes();
                let part = |r| mtplx_kv::staged_part(bytes, r);
                Ok(cache.append_stored(layer, part(k)?, part(v)?)?)
            }
        }
    }

    fn recurrent(&mut self, checkpoint: RecurrentCheckpoint) -> Result<(), BoxError> {
        self.recurrent = Some(checkpoint);
        Ok(())
    }

    fn tail(&mut self, tail: TailState) -> Result<(), BoxError> {
        self.tail = Some(tail);
        Ok(())
    }

    /// The restore failed: rows received may be unverified, so none is kept.
    fn discard(&mut self) {
        self.cache = None;
        self.recurrent = None;
        self.tail = None;
    }
}

impl CacheSink<'_> {
    /// The cache, when rows from `start` are the next of `layer`.
    fn appending(&mut self, layer: usize, start: usize) -> Result<&mut Box<dyn KvCache>, BoxError> {
        let cache = self.cache.as_mut().ok_or("begin was not called")?;
        let have = cache.layer_len(layer);
        if have != start {
            return Err(format!("layer {layer}: rows from {start} arrive after {have}").into());
        }
        Ok(cache)
    }
}

/// A buffer the cache lent, as the cold tier takes it.
struct Lent(Box<dyn mtplx_kv::StagingBuffer>);

impl StagingBuffer for Lent {
    fn to_fill(&mut self) -> Result<&mut [u8], BoxError> {
        Ok(self.0.to_fill()?)
    }

    fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

fn direct_layer(layer: LentLayer<'_>) -> DirectLayer<'_> {
    let pieces = layer.pieces.into_iter().map(|p| DirectPiece {
        positions: p.positions,
        k: p.k,
        v: p.v,
    });
    DirectLayer {
        pieces: pieces.collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use mtplx_cold::storage::FaultyStorage;
    use mtplx_cold::{
        ColdCandidate, ColdConfig, ColdIndex, ColdQuery, ColdStore, Identity, KvRows, Mtp,
        ReadPath, Recurrent, SpillEntry, GIB,
    };
    use mtplx_kv::{BlockPool, KvDtype, KvView, Layout};
    use proptest::prelude::*;

    use super::*;

    const SHAPE: KvShape = KvShape {
        layers: 2,
        kv_heads: 1,
        head_dim: 4,
    };

    /// [`SHAPE`] for rows of `dtype`: heads of one group of a quantized type.
    fn shape(dtype: KvDtype) -> KvShape {
        KvShape {
            head_dim: SHAPE.head_dim.max(dtype.group()),
            ..SHAPE
        }
    }

    #[test]
    fn every_layout_lends_its_rows_in_pieces_covering_the_restore() {
        for dtype in KvDtype::ALL {
            let paged = Layout::Paged {
                block_tokens: 16,
                pool: BlockPool::new(),
            };
            let segmented = Layout::Segmented { segment_tokens: 16 };
            let contiguous = Layout::Contiguous { chunk_tokens: 64 };
            for (layout, pieces) in [(contiguous, 1), (paged, 3), (segmented, 3)] {
                let factory = CacheFactory::from(layout).with_dtype(dtype).unwrap();
                let case = format!("{:?} {dtype}", factory.layout());
                let shape = shape(dtype);
                let n = shape.row_len();
                let value = |l: usize, pos: usize, is_v: bool| {
                    let x = (l * 100 + pos) as f32;
                    dtype.encode(&vec![if is_v { -x } else { x }; n])
                };
                let mut sink = CacheSink::new(&factory, shape);
                sink.begin(geometry(shape, dtype), 40).unwrap();
                let layers = sink.direct_rows().expect("every layout lends");
                assert_eq!(layers.len(), 2);
                let row = dtype.bytes(n);
                for (l, layer) in layers.into_iter().enumerate() {
                    assert_eq!(layer.pieces.len(), pieces, "{case}");
                    let mut at = 0;
                    for p in layer.pieces {
                        assert_eq!(p.positions.start, at, "{case}");
                        assert_eq!(p.k.len(), p.positions.len() * row, "{case}");
                        for (i, pos) in p.positions.clone().enumerate() {
                            p.k[i * row..(i + 1) * row].copy_from_slice(&value(l, pos, false));
                            p.v[i * row..(i + 1) * row].copy_from_slice(&value(l, pos, true));
                        }
                        at = p.positions.end;
                    }
                    assert_eq!(at, 40, "{case}");
                }
                let cache = sink.cache.as_ref().unwrap();
                assert_eq!(cache.len(), 40);
                assert_eq!(cache.dtype(), dtype);
                let (mut k, mut v) = (vec![0.0; 40 * n], vec![0.0; 40 * n]);
                cache.read_rows(1, 0..40, &mut k, &mut v).unwrap();
                // The values the pieces were given, as the type stores them.
                let stored = |is_v| -> Vec<f32> {
                    (0..40)
                        .flat_map(|pos| dtype.decode(&value(1, pos, is_v)).unwrap())
                        .collect()
                };
                assert_eq!(k, stored(false), "{case}");
                assert_eq!(v, stored(true), "{case}");
            }
        }
    }

    #[test]
    fn rows_of_another_element_type_are_refused_at_begin() {
        let factory = CacheFactory::contiguous().with_dtype(KvDtype::F16).unwrap();
        let mut sink = CacheSink::new(&factory, SHAPE);
        let err = sink.begin(geometry(SHAPE, KvDtype::F32), 4).unwrap_err();
        assert!(err.to_string().contains("f16"), "{err}");
        assert!(sink.cache.is_none());
        sink.begin(geometry(SHAPE, KvDtype::F16), 4).unwrap();
    }

    #[test]
    fn staged_rows_keep_their_bytes_and_refuse_partial_rows() {
        for dtype in KvDtype::ALL {
            let shape = shape(dtype);
            let values: Vec<f32> = (0..3 * shape.row_len())
                .map(|i| (i as f32 * 0.37).sin() * 70_000.0_f32.powf((i % 3) as f32 / 2.0))
                .collect();
            let bytes = dtype.encode(&values);
            let factory = CacheFactory::segmented().with_dtype(dtype).unwrap();
            let mut sink = CacheSink::new(&factory, shape);
            sink.begin(geometry(shape, dtype), 3).unwrap();
            for l in 0..shape.layers {
                sink.write_rows(l, 0, &bytes, &bytes).unwrap();
            }
            let cache = sink.cache.as_ref().unwrap();
            let (mut k, mut v) = (vec![0u8; bytes.len()], vec![0u8; bytes.len()]);
            cache.read_raw(1, 0..3, &mut k, &mut v).unwrap();
            assert!(k == bytes && v == bytes, "{dtype}: the stored bytes");
            let mut sink = CacheSink::new(&factory, shape);
            sink.begin(geometry(shape, dtype), 3).unwrap();
            let cut = &bytes[..bytes.len() - 1];
            assert!(sink.write_rows(0, 0, cut, cut).is_err(), "{dtype}");
        }
    }

    /// A device's cache as far as a restore can tell: host rows that lend no storage but
    /// host buffers to stage them in (whose rows it counts), and a record of the room
    /// reserved for them.
    struct Reserving(
        Box<dyn KvCache>,
        Arc<std::sync::Mutex<Vec<usize>>>,
        Arc<std::sync::atomic::AtomicUsize>,
    );

    /// A buffer [`Reserving`] lends.
    struct HeapBuffer(Vec<u8>);

    impl mtplx_kv::StagingBuffer for HeapBuffer {
        fn to_fill(&mut self) -> Result<&mut [u8], mtplx_kv::KvError> {
            Ok(&mut self.0)
        }
        fn bytes(&self) -> &[u8] {
            &self.0
        }
        fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
            self
        }
    }

    impl KvView for Reserving {
        fn shape(&self) -> KvShape {
            self.0.shape()
        }
        fn layout(&self) -> mtplx_kv::LayoutKind {
            mtplx_kv::LayoutKind::Device
        }
        fn dtype(&self) -> KvDtype {
            self.0.dtype()
        }
        fn layer_len(&self, layer: usize) -> usize {
            self.0.layer_len(layer)
        }
        fn read_rows(
            &self,
            layer: usize,
            range: std::ops::Range<usize>,
            k: &mut [f32],
            v: &mut [f32],
        ) -> Result<(), mtplx_kv::KvError> {
            self.0.read_rows(layer, range, k, v)
        }
        fn read_raw(
            &self,
            layer: usize,
            range: std::ops::Range<usize>,
            k: &mut [u8],
            v: &mut [u8],
        ) -> Result<(), mtplx_kv::KvError> {
            self.0.read_raw(layer, range, k, v)
        }
        fn physical_bytes(&self) -> usize {
            self.0.physical_bytes()
        }
    }

    impl KvCache for Reserving {
        fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), mtplx_kv::KvError> {
            self.0.append(layer, k, v)
        }
        fn append_stored(
            &mut self,
            layer: usize,
            k: &[u8],
            v: &[u8],
        ) -> Result<(), mtplx_kv::KvError> {
            self.0.append_stored(layer, k, v)
        }
        fn reserve_positions(&mut self, n: usize) -> Result<(), mtplx_kv::KvError> {
            self.1.lock().unwrap().push(n);
            Ok(())
        }
        fn lend_staging(
            &mut self,
            count: usize,
            bytes: usize,
        ) -> Option<Vec<Box<dyn mtplx_kv::StagingBuffer>>> {
            let buf = |_| Box::new(HeapBuffer(vec![0; bytes])) as Box<dyn mtplx_kv::StagingBuffer>;
            Some((0..count).map(buf).collect())
        }
        fn append_staged(
            &mut self,
            layer: usize,
            buf: &mut dyn mtplx_kv::StagingBuffer,
            k: std::ops::Range<usize>,
            v: std::ops::Range<usize>,
        ) -> Result<(), mtplx_kv::KvError> {
            let mine = buf
                .as_any_mut()
                .downcast_mut::<HeapBuffer>()
                .expect("lent here");
            self.2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.append_stored(layer, &mine.0[k], &mine.0[v])
        }
        fn attend(
            &self,
            layer: usize,
            q: &[f32],
            q_heads: usize,
            scale: f32,
            out: &mut [f32],
        ) -> Result<(), mtplx_kv::KvError> {
            self.0.attend(layer, q, q_heads, scale, out)
        }
        fn truncate(&mut self, len: usize) {
            self.0.truncate(len)
        }
        fn snapshot(&self) -> Arc<dyn KvView> {
            self.0.snapshot()
        }
        fn fork(&self) -> Box<dyn KvCache> {
            Box::new(Reserving(self.0.fork(), self.1.clone(), self.2.clone()))
        }
    }

    #[derive(Default)]
    struct ReservingMaker(
        Arc<std::sync::Mutex<Vec<usize>>>,
        Arc<std::sync::atomic::AtomicUsize>,
    );

    impl mtplx_kv::MakeDeviceCache for ReservingMaker {
        fn stores(&self, dtype: KvDtype) -> bool {
            matches!(dtype, KvDtype::F32 | KvDtype::F16)
        }
        fn new_cache(&self, shape: KvShape, dtype: KvDtype) -> Box<dyn KvCache> {
            let host = CacheFactory::contiguous().with_dtype(dtype).unwrap();
            Box::new(Reserving(
                host.new_cache(shape),
                self.0.clone(),
                self.1.clone(),
            ))
        }
        fn name(&self) -> String {
            "reserving:0".into()
        }
    }

    /// A restore into a cache that lends no rows and grows by copying (a device's)
    /// reserves the restore's whole length once, before its first row arrives.
    #[test]
    fn a_restore_reserves_its_whole_length_before_its_first_row() {
        let maker = Arc::new(ReservingMaker::default());
        let reserved = maker.0.clone();
        let factory = CacheFactory::device(mtplx_kv::DeviceCaches(maker))
            .with_dtype(KvDtype::F16)
            .unwrap();
        let shape = shape(KvDtype::F16);
        let mut sink = CacheSink::new(&factory, shape);
        sink.begin(geometry(shape, KvDtype::F16), 700).unwrap();
        assert!(
            sink.direct_rows().is_none(),
            "a device-like cache lends nothing"
        );
        assert_eq!(*reserved.lock().unwrap(), [700]);
        let row = KvDtype::F16.bytes(shape.row_len());
        let bytes = vec![0u8; 3 * row];
        sink.write_rows(0, 0, &bytes, &bytes).unwrap();
        assert_eq!(*reserved.lock().unwrap(), [700], "reserved once");
    }

    /// A restore into a cache that lends host buffers (a device's) reads the blocks into
    /// them and hands them back (the cold tier's lent path, no `write_rows`): the stored
    /// bits at every restore point, a partial last block included.
    #[test]
    fn a_restore_into_lent_host_buffers_gives_the_stored_bits() {
        let dtype = KvDtype::F16;
        let maker = Arc::new(ReservingMaker::default());
        let handed = maker.1.clone();
        let factory = CacheFactory::device(mtplx_kv::DeviceCaches(maker))
            .with_dtype(dtype)
            .unwrap();
        let row = dtype.bytes(shape(dtype).row_len());
        let o = original(700, dtype);
        for point in [1, 255, 256, 300, 699, 700] {
            let (_st, store, hit) = stored(700, point, dtype);
            let mut sink = CacheSink::new(&factory, shape(dtype));
            let before = handed.load(std::sync::atomic::Ordering::Relaxed);
            let report = store.restore(&hit, &mut sink).unwrap();
            assert!(
                matches!(report.read_path, ReadPath::Lent { .. }),
                "{point}: {report:?}"
            );
            let calls = handed.load(std::sync::atomic::Ordering::Relaxed) - before;
            assert_eq!(
                calls,
                SHAPE.layers * point.div_ceil(256),
                "{point}: a layer a block"
            );
            let cache = sink.cache.take().unwrap();
            assert_eq!(cache.len(), point);
            let want: Vec<u8> = (0..SHAPE.layers)
                .flat_map(|l| {
                    let (k, v) = (&o.k[l][..point * row], &o.v[l][..point * row]);
                    k.iter().chain(v).copied().collect::<Vec<_>>()
                })
                .collect();
            assert!(bits(&*cache, point) == want, "{point}: rows differ");
        }
    }

    /// A [`CacheSink`] that lends the cache's rows only when `lend`, and counts the
    /// `write_rows` calls that reach it.
    struct Watched<'a> {
        sink: CacheSink<'a>,
        lend: bool,
        writes: usize,
    }

    impl KvSink for Watched<'_> {
        fn begin(&mut self, g: KvGeometry, rows: usize) -> Result<(), BoxError> {
            self.sink.begin(g, rows)
        }
        fn direct_rows(&mut self) -> Option<Vec<DirectLayer<'_>>> {
            match self.lend {
                true => self.sink.direct_rows(),
                false => None,
            }
        }
        fn write_rows(&mut self, l: usize, at: usize, k: &[u8], v: &[u8]) -> Result<(), BoxError> {
            self.writes += 1;
            self.sink.write_rows(l, at, k, v)
        }
        fn discard(&mut self) {
            self.sink.discard()
        }
    }

    fn identity(dtype: KvDtype) -> Identity {
        Identity {
            model: "m".into(),
            chat_template: "t".into(),
            mtp: Mtp::Off,
            policy: "p".into(),
            kv_dtype: crate::convert::cold_dtype(dtype),
        }
    }

    /// The stored rows: distinct for every layer, position, element and K / V, and not
    /// representable with fewer bits (so a misplaced or converted value shows).
    fn original(len: usize, dtype: KvDtype) -> KvRows {
        let shape = shape(dtype);
        let n = shape.row_len();
        let layer = |l: usize, is_v: bool| {
            let values: Vec<f32> = (0..len * n)
                .map(|j| {
                    let (p, i) = (j / n, j % n);
                    let x = (l * 7919 + p * 31 + i) as f32 * 0.001_953_7 + 0.1;
                    if is_v {
                        -x
                    } else {
                        x
                    }
                })
                .collect();
            dtype.encode(&values)
        };
        KvRows {
            geometry: Some(geometry(shape, dtype)),
            k: (0..shape.layers).map(|l| layer(l, false)).collect(),
            v: (0..shape.layers).map(|l| layer(l, true)).collect(),
            recurrent: None,
            tail: None,
        }
    }

    /// A store holding one entry of `len` tokens in `dtype`, and the candidate restoring it
    /// at `point`.
    fn stored(
        len: usize,
        point: usize,
        dtype: KvDtype,
    ) -> (FaultyStorage, ColdStore, ColdCandidate) {
        let st = FaultyStorage::new();
        let config = ColdConfig {
            cap_bytes: 100 * GIB,
            free_disk_floor: 0,
            backlog_cap_bytes: GIB,
            write_budget_per_hour: u64::MAX,
        };
        let store = ColdStore::open(Arc::new(st.clone()), config).unwrap();
        let tokens: Vec<u32> = (0..len as u32).collect();
        store
            .put(&SpillEntry {
                identity: identity(dtype),
                tokens: tokens.clone(),
                geometry: geometry(shape(dtype), dtype),
                kv: Box::new(original(len, dtype)),
                recurrent: Recurrent::None,
                tail: None,
            })
            .unwrap();
        let id = identity(dtype);
        let query = ColdQuery {
            identity: &id,
            prompt: &tokens,
            floor: 0,
        };
        let full = store.lookup(&query).exact.unwrap();
        let hit = ColdCandidate {
            restore_point: point,
            ..full
        };
        (st, store, hit)
    }

    /// The stored bytes of `view`'s first `point` positions, K then V of each layer.
    fn bits(view: &dyn KvView, point: usize) -> Vec<u8> {
        let n = view.dtype().bytes(point * shape(view.dtype()).row_len());
        let mut out = Vec::new();
        for l in 0..SHAPE.layers {
            let (mut k, mut v) = (vec![0; n], vec![0; n]);
            view.read_raw(l, 0..point, &mut k, &mut v).unwrap();
            out.extend(k.iter().chain(&v));
        }
        out
    }

    /// Restores an entry of `len` tokens at `point` into a cache built by `factory`, read
    /// straight into the cache (streamed and, blobs in memory, resident) and staged: the
    /// same bits as the stored rows every way, and no `write_rows` call when lent.
    fn direct_equals_staged_equals_original(
        factory: &CacheFactory,
        len: usize,
        point: usize,
    ) -> Result<(), TestCaseError> {
        let dtype = factory.dtype();
        let (st, store, hit) = stored(len, point, dtype);
        let row = dtype.bytes(shape(dtype).row_len());
        let o = original(len, dtype);
        let want: Vec<u8> = (0..SHAPE.layers)
            .flat_map(|l| {
                let (k, v) = (&o.k[l][..point * row], &o.v[l][..point * row]);
                k.iter().chain(v).copied().collect::<Vec<_>>()
            })
            .collect();
        let layout = factory.layout();
        for (lend, resident) in [(true, false), (true, true), (false, false)] {
            st.set_resident(resident);
            let mut sink = Watched {
                sink: CacheSink::new(factory, shape(dtype)),
                lend,
                writes: 0,
            };
            let report = store.restore(&hit, &mut sink).unwrap();
            let cache = sink.sink.cache.take().unwrap();
            let case = format!(
                "{layout:?} {dtype} len {len} point {point} lend {lend} resident {resident}"
            );
            prop_assert_eq!(cache.layout(), layout);
            prop_assert_eq!(cache.len(), point, "{}", case);
            prop_assert_eq!(cache.dtype(), dtype, "{}", case);
            prop_assert!(bits(&*cache, point) == want, "{}: rows differ", case);
            let path = report.read_path;
            match lend {
                true => {
                    prop_assert_eq!(sink.writes, 0, "{}", case);
                    prop_assert!(path != ReadPath::Staged, "{}: {:?}", case, path);
                }
                false => {
                    prop_assert!(sink.writes > 0, "{}", case);
                    prop_assert_eq!(path, ReadPath::Staged, "{}", case);
                }
            }
        }
        Ok(())
    }

    /// Paged with pages that divide a 256-token block and pages that don't (300 spans two
    /// blocks); segmented likewise (segments are multiples of 16: 48 doesn't divide 256,
    /// 272 spans blocks).
    fn factories(page: usize, segment: usize, dtype: KvDtype) -> [CacheFactory; 3] {
        [
            Layout::Contiguous { chunk_tokens: 64 },
            Layout::Paged {
                block_tokens: page,
                pool: BlockPool::new(),
            },
            Layout::Segmented {
                segment_tokens: segment,
            },
        ]
        .map(|layout| CacheFactory::from(layout).with_dtype(dtype).unwrap())
    }

    /// Restore points inside a page, on page boundaries, on and just past block bounds, and
    /// inside the last block (partly restored, so staged by the cold tier) of a 700-token
    /// entry, whose last block (512..700) is itself partial.
    #[test]
    fn restores_into_every_layout_read_straight_into_it_give_the_stored_bits() {
        let points = [
            1, 7, 16, 48, 100, 200, 255, 256, 257, 300, 511, 512, 600, 699, 700,
        ];
        let cases = [(16, 256), (7, 48), (100, 272), (256, 16), (300, 512)];
        for ((page, segment), dtype) in cases.into_iter().zip(KvDtype::ALL.into_iter().cycle()) {
            for factory in factories(page, segment, dtype) {
                for point in points {
                    direct_equals_staged_equals_original(&factory, 700, point).unwrap();
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        #[test]
        fn any_page_size_and_restore_point_gives_the_stored_bits(
            len in 1usize..900,
            cut in 0.0f64..=1.0,
            page in 1usize..=300,
            segment in 1usize..=300,
            dtype in proptest::sample::select(KvDtype::ALL.to_vec()),
        ) {
            let point = ((len as f64 * cut) as usize).clamp(1, len);
            for factory in factories(page, segment, dtype) {
                direct_equals_staged_equals_original(&factory, len, point)?;
            }
        }
    }

    /// A block that fails its checksum after rows reached a paged cache: a named miss, the
    /// sink drops the cache, and its blocks go back to the pool.
    #[test]
    fn a_corrupt_block_read_into_a_paged_cache_is_a_miss_and_frees_its_blocks() {
        let pool = BlockPool::new();
        let factory = CacheFactory::from(Layout::Paged {
            block_tokens: 7,
            pool: pool.clone(),
        });
        for resident in [false, true] {
            let (st, store, hit) = stored(600, 600, KvDtype::F32);
            st.set_resident(resident);
            let blobs = st.files(std::path::Path::new("blobs"));
            let (path, size) = blobs.iter().max_by_key(|(_, n)| *n).unwrap().clone();
            assert_eq!(blobs.len(), 3);
            // A full block (the last one holds 88 positions): the bit sits in its last
            // layer's V rows, read after the block's other rows reached the cache.
            st.flip_bit(&path, (size - 5) * 8).unwrap();
            let mut sink = Watched {
                sink: CacheSink::new(&factory, SHAPE),
                lend: true,
                writes: 0,
            };
            let err = store.restore(&hit, &mut sink).unwrap_err();
            assert_eq!(
                err.miss_reason().to_string(),
                "ssd_restore_error:checksum",
                "resident {resident}"
            );
            assert!(sink.sink.cache.is_none(), "the rows were discarded");
            assert_eq!(sink.writes, 0);
            assert_eq!(
                pool.stats().live_blocks,
                0,
                "every block went back to the pool"
            );
        }
    }
}
