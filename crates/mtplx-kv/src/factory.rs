//! [`CacheFactory`]: how a caller names the layout it wants; new caches and restores are
//! built through it, never in a default layout.

use std::sync::Arc;

use crate::{
    BlockPool, Contiguous, KvCache, KvDtype, KvElem, KvError, KvShape, KvView, LayoutKind, Paged,
    Segmented, ShareTarget,
};

/// The caller's choice of cache: a [`Layout`] and the element type rows are stored in
/// ([`KvDtype`]). New caches, restores and conversions are built through it, never in a
/// default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheFactory {
    layout: Layout,
    dtype: KvDtype,
}

/// A layout and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// [`Contiguous`] buffers that grow by `chunk_tokens` positions at a time.
    Contiguous { chunk_tokens: usize },
    /// [`Paged`] blocks of `block_tokens` positions from `pool`, which every cache built by
    /// this factory (and its clones) shares.
    Paged {
        block_tokens: usize,
        pool: BlockPool,
    },
    /// [`Segmented`] caches whose segments hold `segment_tokens` positions.
    Segmented { segment_tokens: usize },
    /// Caches in an accelerator's memory, built by a model backend ([`LayoutKind::Device`]).
    Device(DeviceCaches),
}

/// `f32` caches in `layout`.
impl From<Layout> for CacheFactory {
    fn from(layout: Layout) -> Self {
        CacheFactory {
            layout,
            dtype: KvDtype::F32,
        }
    }
}

/// What a model backend that keeps K/V in an accelerator's memory builds its caches with.
pub trait MakeDeviceCache: Send + Sync {
    /// Whether the device's caches can store rows as `dtype`.
    fn stores(&self, dtype: KvDtype) -> bool;
    /// An empty cache on the device storing rows as `dtype` (one [`Self::stores`] takes).
    fn new_cache(&self, shape: KvShape, dtype: KvDtype) -> Box<dyn KvCache>;
    /// The device, in words (`cuda:0`).
    fn name(&self) -> String;
}

/// A shared [`MakeDeviceCache`]; two are equal when they are the same maker.
#[derive(Clone)]
pub struct DeviceCaches(pub Arc<dyn MakeDeviceCache>);

impl PartialEq for DeviceCaches {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for DeviceCaches {}

impl std::fmt::Debug for DeviceCaches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceCaches({})", self.0.name())
    }
}

impl CacheFactory {
    /// The contiguous layout with its default growth step (256 positions), `f32` rows.
    pub fn contiguous() -> Self {
        Layout::Contiguous { chunk_tokens: 256 }.into()
    }

    /// The paged layout with 16-position blocks and a new, empty pool, `f32` rows.
    pub fn paged() -> Self {
        Layout::Paged {
            block_tokens: 16,
            pool: BlockPool::new(),
        }
        .into()
    }

    /// The segmented layout with 256-position segments, `f32` rows.
    pub fn segmented() -> Self {
        Layout::Segmented {
            segment_tokens: 256,
        }
        .into()
    }

    /// Caches a model backend builds in an accelerator's memory, `f32` rows until
    /// [`CacheFactory::with_dtype`] names another type the device stores.
    pub fn device(caches: DeviceCaches) -> Self {
        Layout::Device(caches).into()
    }

    /// The same layout storing rows as `dtype`.
    ///
    /// # Errors
    /// [`KvError::DeviceDtype`]: a device layout whose maker does not store `dtype`
    /// ([`MakeDeviceCache::stores`]).
    pub fn with_dtype(self, dtype: KvDtype) -> Result<Self, KvError> {
        if let Layout::Device(d) = &self.layout {
            if !d.0.stores(dtype) {
                return Err(KvError::DeviceDtype(dtype));
            }
        }
        Ok(CacheFactory { dtype, ..self })
    }

    /// The layout this factory builds.
    pub fn layout(&self) -> LayoutKind {
        match &self.layout {
            Layout::Contiguous { .. } => LayoutKind::Contiguous,
            Layout::Paged { .. } => LayoutKind::Paged,
            Layout::Segmented { .. } => LayoutKind::Segmented,
            Layout::Device(_) => LayoutKind::Device,
        }
    }

    /// The element type this factory's caches store.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Whether this factory can hold K/V of `shape`: a quantized element type needs heads
    /// of whole groups ([`KvDtype::group`]) so that no group straddles two heads.
    ///
    /// # Errors
    /// [`KvError::HeadNotWholeGroups`].
    pub fn check_shape(&self, shape: KvShape) -> Result<(), KvError> {
        let group = self.dtype.group();
        if !shape.head_dim.is_multiple_of(group) {
            return Err(KvError::HeadNotWholeGroups {
                dtype: self.dtype,
                head_dim: shape.head_dim,
                group,
            });
        }
        Ok(())
    }

    /// An empty cache in this layout.
    ///
    /// # Panics
    /// If [`CacheFactory::check_shape`] refuses `shape` (callers check a model's shape once,
    /// when they choose the factory).
    pub fn new_cache(&self, shape: KvShape) -> Box<dyn KvCache> {
        if let Err(e) = self.check_shape(shape) {
            panic!("{e}");
        }
        match self.dtype {
            KvDtype::F32 => self.build::<f32>(shape),
            KvDtype::F16 => self.build::<half::f16>(shape),
            KvDtype::Bf16 => self.build::<half::bf16>(shape),
            KvDtype::Q8 => self.build::<mtplx_kernels::elem::Q8Group>(shape),
            KvDtype::Q4 => self.build::<mtplx_kernels::elem::Q4Group>(shape),
        }
    }

    fn build<E: KvElem>(&self, shape: KvShape) -> Box<dyn KvCache> {
        match &self.layout {
            Layout::Contiguous { chunk_tokens } => {
                Box::new(Contiguous::<E>::empty(shape, *chunk_tokens))
            }
            Layout::Paged { block_tokens, pool } => {
                Box::new(Paged::<E>::empty(shape, *block_tokens, pool.clone()))
            }
            Layout::Segmented { segment_tokens } => {
                Box::new(Segmented::<E>::empty(shape, *segment_tokens))
            }
            // `with_dtype` keeps device factories at a type their maker stores.
            Layout::Device(d) => d.0.new_cache(shape, E::DTYPE),
        }
    }

    /// What a view may share its storage with when restored into this layout.
    fn share_target(&self) -> Option<ShareTarget<'_>> {
        match &self.layout {
            Layout::Paged { block_tokens, pool } => Some(ShareTarget::Paged {
                block_tokens: *block_tokens,
                pool,
            }),
            Layout::Segmented { segment_tokens } => Some(ShareTarget::Segmented {
                segment_tokens: *segment_tokens,
            }),
            Layout::Contiguous { .. } | Layout::Device(_) => None,
        }
    }

    /// A cache in this layout and element type holding the first `len` positions of
    /// `source`, whatever layout `source` has: this is also how a cache converts between
    /// layouts.
    ///
    /// When the source stores this factory's element type and can share its storage with
    /// this layout ([`KvView::share_into`]: a paged view into the same pool, a segmented
    /// view into any segmented factory) the restore copies no rows; otherwise it copies
    /// them, one layer at a time: as stored bytes when the element types match (the rows
    /// stay exactly what they were), else widened and rounded to this factory's type.
    pub fn restore<V: KvView + ?Sized>(
        &self,
        source: &V,
        len: usize,
    ) -> Result<Box<dyn KvCache>, KvError> {
        let have = source.len();
        if len > have {
            return Err(KvError::RowsOutOfRange {
                start: 0,
                end: len,
                len: have,
            });
        }
        let same_type = source.dtype() == self.dtype;
        if same_type {
            if let Some(mut cache) = self.share_target().and_then(|t| source.share_into(t)) {
                cache.truncate(len);
                return Ok(cache);
            }
        }
        let shape = source.shape();
        let mut cache = self.new_cache(shape);
        if same_type && len > 0 {
            if let Some(lent) = cache.append_in_place(len) {
                for (layer, lent) in lent.into_iter().enumerate() {
                    for p in lent.pieces {
                        source.read_raw(layer, p.positions, p.k, p.v)?;
                    }
                }
                return Ok(cache);
            }
            // A layout that can't lend host memory (a device's): the stored bytes, a layer
            // at a time, never widened and rounded again.
            let bytes = self.dtype.bytes(len * shape.row_len());
            let (mut k, mut v) = (vec![0u8; bytes], vec![0u8; bytes]);
            for layer in 0..shape.layers {
                source.read_raw(layer, 0..len, &mut k, &mut v)?;
                cache.append_stored(layer, &k, &v)?;
            }
            return Ok(cache);
        }
        let row = shape.row_len();
        let mut k = vec![0f32; len * row];
        let mut v = vec![0f32; len * row];
        for layer in 0..shape.layers {
            source.read_rows(layer, 0..len, &mut k, &mut v)?;
            cache.append(layer, &k, &v)?;
        }
        Ok(cache)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A stand-in device: host caches (`f32` or `f16` rows) that remember they were made
    /// here, and that, like a device's, lend no host memory; it counts the `f32` rows given
    /// to them.
    struct Counting(AtomicUsize, Arc<AtomicUsize>);

    impl Counting {
        fn new() -> Self {
            Counting(AtomicUsize::new(0), Arc::new(AtomicUsize::new(0)))
        }
    }

    impl MakeDeviceCache for Counting {
        fn stores(&self, dtype: KvDtype) -> bool {
            matches!(dtype, KvDtype::F32 | KvDtype::F16)
        }

        fn new_cache(&self, shape: KvShape, dtype: KvDtype) -> Box<dyn KvCache> {
            self.0.fetch_add(1, Ordering::SeqCst);
            let host = CacheFactory::contiguous().with_dtype(dtype).unwrap();
            Box::new(NoLending(host.new_cache(shape), self.1.clone()))
        }

        fn name(&self) -> String {
            "test:0".into()
        }
    }

    /// A host cache that does not lend its storage and counts [`KvCache::append`] calls.
    struct NoLending(Box<dyn KvCache>, Arc<AtomicUsize>);

    impl KvView for NoLending {
        fn shape(&self) -> KvShape {
            self.0.shape()
        }
        fn layout(&self) -> LayoutKind {
            LayoutKind::Device
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
        ) -> Result<(), KvError> {
            self.0.read_rows(layer, range, k, v)
        }
        fn read_raw(
            &self,
            layer: usize,
            range: std::ops::Range<usize>,
            k: &mut [u8],
            v: &mut [u8],
        ) -> Result<(), KvError> {
            self.0.read_raw(layer, range, k, v)
        }
        fn physical_bytes(&self) -> usize {
            self.0.physical_bytes()
        }
    }

    impl KvCache for NoLending {
        fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.append(layer, k, v)
        }
        fn append_stored(&mut self, layer: usize, k: &[u8], v: &[u8]) -> Result<(), KvError> {
            self.0.append_stored(layer, k, v)
        }
        fn attend(
            &self,
            layer: usize,
            q: &[f32],
            q_heads: usize,
            scale: f32,
            out: &mut [f32],
        ) -> Result<(), KvError> {
            self.0.attend(layer, q, q_heads, scale, out)
        }
        fn truncate(&mut self, len: usize) {
            self.0.truncate(len)
        }
        fn snapshot(&self) -> Arc<dyn KvView> {
            self.0.snapshot()
        }
        fn fork(&self) -> Box<dyn KvCache> {
            Box::new(NoLending(self.0.fork(), self.1.clone()))
        }
    }

    #[test]
    fn a_device_factory_builds_and_restores_through_its_maker() {
        let maker = Arc::new(Counting::new());
        let factory = CacheFactory::device(DeviceCaches(maker.clone()));
        assert_eq!(factory.layout(), LayoutKind::Device);
        assert!(format!("{factory:?}").contains("Device(DeviceCaches(test:0))"));
        // The types the maker stores, and no other.
        assert_eq!(
            factory.clone().with_dtype(KvDtype::Q8),
            Err(KvError::DeviceDtype(KvDtype::Q8))
        );
        let halves = factory.clone().with_dtype(KvDtype::F16).unwrap();
        let shape = KvShape {
            layers: 2,
            kv_heads: 1,
            head_dim: 4,
        };
        let mut host = CacheFactory::contiguous().new_cache(shape);
        for layer in 0..2 {
            let rows: Vec<f32> = (0..12).map(|i| (i + 100 * layer) as f32 + 0.1).collect();
            host.append(layer, &rows, &rows).unwrap();
        }
        let restored = factory.restore(host.as_ref(), 2).unwrap();
        assert_eq!(
            maker.0.load(Ordering::SeqCst),
            1,
            "restored through the maker"
        );
        let (mut k, mut v) = (vec![0f32; 8], vec![0f32; 8]);
        restored.read_rows(1, 0..2, &mut k, &mut v).unwrap();
        let expected: Vec<f32> = (100..108).map(|i| i as f32 + 0.1).collect();
        assert_eq!(k, expected);
        // Rows of the device's own type come back as their stored bytes: no widening, no
        // second rounding (no f32 append), one layer at a time.
        let appends = maker.1.load(Ordering::SeqCst);
        let narrow = CacheFactory::paged().with_dtype(KvDtype::F16).unwrap();
        let narrow = narrow.restore(host.as_ref(), 2).unwrap();
        let on_device = halves.restore(narrow.as_ref(), 2).unwrap();
        assert_eq!(on_device.dtype(), KvDtype::F16);
        assert_eq!(
            maker.1.load(Ordering::SeqCst),
            appends,
            "widened and appended"
        );
        let raw = |c: &dyn KvView| {
            let (mut a, mut b) = (vec![0u8; 16], vec![0u8; 16]);
            c.read_raw(1, 0..2, &mut a, &mut b).unwrap();
            (a, b)
        };
        assert_eq!(raw(on_device.as_ref()), raw(narrow.as_ref()));
        // Rows of another type are widened and rounded to the device's.
        let rounded = halves.restore(host.as_ref(), 2).unwrap();
        assert_eq!(raw(rounded.as_ref()), raw(narrow.as_ref()));
        factory.new_cache(shape);
        assert_eq!(maker.0.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn a_restore_stores_the_factorys_element_type_whatever_the_source_holds() {
        let shape = KvShape {
            layers: 2,
            kv_heads: 1,
            head_dim: 4,
        };
        let rows: Vec<f32> = (0..12).map(|i| 0.1 + i as f32 / 3.0).collect();
        let half = |x: f32| half::f16::from_f32(x).to_f32();
        for layout in [
            CacheFactory::contiguous(),
            CacheFactory::paged(),
            CacheFactory::segmented(),
        ] {
            let f16s = layout.clone().with_dtype(KvDtype::F16).unwrap();
            let mut wide = CacheFactory::segmented().new_cache(shape);
            for layer in 0..2 {
                wide.append(layer, &rows, &rows).unwrap();
            }
            // f32 rows into an f16 factory: rounded once.
            let narrow = f16s.restore(wide.as_ref(), 3).unwrap();
            assert_eq!(
                (narrow.dtype(), narrow.layout()),
                (KvDtype::F16, layout.layout())
            );
            let (mut k, mut v) = (vec![0f32; 12], vec![0f32; 12]);
            narrow.read_rows(1, 0..3, &mut k, &mut v).unwrap();
            assert_eq!(k, rows.iter().map(|&x| half(x)).collect::<Vec<_>>());
            // f16 rows into an f16 factory of any layout: the same bytes (shared or copied).
            for into in [
                CacheFactory::contiguous(),
                CacheFactory::paged(),
                CacheFactory::segmented(),
            ] {
                let into = into.with_dtype(KvDtype::F16).unwrap();
                let again = into.restore(narrow.as_ref(), 2).unwrap();
                let (mut a, mut b) = (vec![0u8; 16], vec![0u8; 16]);
                let (mut c, mut d) = (vec![0u8; 16], vec![0u8; 16]);
                again.read_raw(0, 0..2, &mut a, &mut b).unwrap();
                narrow.read_raw(0, 0..2, &mut c, &mut d).unwrap();
                assert_eq!((a, b), (c, d));
                assert_eq!(again.dtype(), KvDtype::F16);
            }
            // And back to f32: widened exactly, never shared across types.
            let back = layout.restore(narrow.as_ref(), 3).unwrap();
            assert_eq!(back.dtype(), KvDtype::F32);
            back.read_rows(1, 0..3, &mut k, &mut v).unwrap();
            assert_eq!(k, rows.iter().map(|&x| half(x)).collect::<Vec<_>>());
        }
    }

    #[test]
    fn quantized_factories_take_heads_of_whole_groups_and_restore_across_types() {
        let narrow = KvShape {
            layers: 1,
            kv_heads: 2,
            head_dim: 16,
        };
        for dtype in [KvDtype::Q8, KvDtype::Q4] {
            let f = CacheFactory::paged().with_dtype(dtype).unwrap();
            assert_eq!(
                f.check_shape(narrow),
                Err(KvError::HeadNotWholeGroups {
                    dtype,
                    head_dim: 16,
                    group: 32
                })
            );
            let shape = KvShape {
                head_dim: 64,
                ..narrow
            };
            f.check_shape(shape).unwrap();
            let rows: Vec<f32> = (0..3 * 128).map(|i| (i as f32 * 0.7).sin()).collect();
            let mut wide = CacheFactory::contiguous().new_cache(shape);
            wide.append(0, &rows, &rows).unwrap();
            // f32 rows into the quantized factory: quantized once, group by group.
            let q = f.restore(wide.as_ref(), 3).unwrap();
            assert_eq!(
                (q.dtype(), q.logical_bytes()),
                (dtype, 3 * 2 * dtype.bytes(128))
            );
            let (mut k, mut v) = (vec![0f32; 3 * 128], vec![0f32; 3 * 128]);
            q.read_rows(0, 0..3, &mut k, &mut v).unwrap();
            assert_eq!(k, dtype.decode(&dtype.encode(&rows)).unwrap());
            // Into the same type in another layout: the same bytes.
            let again = CacheFactory::segmented()
                .with_dtype(dtype)
                .unwrap()
                .restore(q.as_ref(), 3)
                .unwrap();
            let bytes = |c: &dyn KvCache| {
                let (mut a, mut b) = (
                    vec![0u8; dtype.bytes(3 * 128)],
                    vec![0u8; dtype.bytes(3 * 128)],
                );
                c.read_raw(0, 0..3, &mut a, &mut b).unwrap();
                (a, b)
            };
            assert_eq!(bytes(again.as_ref()), bytes(q.as_ref()));
        }
    }

    #[test]
    fn device_factories_are_equal_only_when_they_share_a_maker() {
        let a = DeviceCaches(Arc::new(Counting::new()));
        let b = DeviceCaches(Arc::new(Counting::new()));
        assert_eq!(a, a.clone());
        assert_ne!(a, b);
        assert_ne!(CacheFactory::device(a), CacheFactory::contiguous());
    }
}
