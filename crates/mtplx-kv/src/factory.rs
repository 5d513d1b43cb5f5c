//! [`CacheFactory`]: how a caller names the layout it wants; new caches and restores are
//! built through it, never in a default layout.

use std::sync::Arc;

use crate::{
    BlockPool, Contiguous, KvCache, KvError, KvShape, KvView, LayoutKind, Paged, Segmented,
    ShareTarget,
};

/// The caller's choice of layout: new caches, restores and conversions are built through
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheFactory {
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

/// What a model backend that keeps K/V in an accelerator's memory builds its caches with.
pub trait MakeDeviceCache: Send + Sync {
    /// An empty cache on the device.
    fn new_cache(&self, shape: KvShape) -> Box<dyn KvCache>;
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
    /// The contiguous layout with its default growth step (256 positions).
    pub fn contiguous() -> Self {
        CacheFactory::Contiguous { chunk_tokens: 256 }
    }

    /// The paged layout with 16-position blocks and a new, empty pool.
    pub fn paged() -> Self {
        CacheFactory::Paged {
            block_tokens: 16,
            pool: BlockPool::new(),
        }
    }

    /// The segmented layout with 256-position segments.
    pub fn segmented() -> Self {
        CacheFactory::Segmented {
            segment_tokens: 256,
        }
    }

    /// The layout this factory builds.
    pub fn layout(&self) -> LayoutKind {
        match self {
            CacheFactory::Contiguous { .. } => LayoutKind::Contiguous,
            CacheFactory::Paged { .. } => LayoutKind::Paged,
            CacheFactory::Segmented { .. } => LayoutKind::Segmented,
            CacheFactory::Device(_) => LayoutKind::Device,
        }
    }

    /// An empty cache in this layout.
    pub fn new_cache(&self, shape: KvShape) -> Box<dyn KvCache> {
        match self {
            CacheFactory::Contiguous { chunk_tokens } => {
                Box::new(Contiguous::new(shape, *chunk_tokens))
            }
            CacheFactory::Paged { block_tokens, pool } => {
                Box::new(Paged::new(shape, *block_tokens, pool.clone()))
            }
            CacheFactory::Segmented { segment_tokens } => {
                Box::new(Segmented::new(shape, *segment_tokens))
            }
            CacheFactory::Device(d) => d.0.new_cache(shape),
        }
    }

    /// What a view may share its storage with when restored into this layout.
    fn share_target(&self) -> Option<ShareTarget<'_>> {
        match self {
            CacheFactory::Paged { block_tokens, pool } => Some(ShareTarget::Paged {
                block_tokens: *block_tokens,
                pool,
            }),
            CacheFactory::Segmented { segment_tokens } => Some(ShareTarget::Segmented {
                segment_tokens: *segment_tokens,
            }),
            CacheFactory::Contiguous { .. } | CacheFactory::Device(_) => None,
        }
    }

    /// A cache in this layout holding the first `len` positions of `source`, whatever
    /// layout `source` has: this is also how a cache converts between layouts.
    ///
    /// When the source can share its storage with this layout ([`KvView::share_into`]: a
    /// paged view into the same pool, a segmented view into any segmented factory) the
    /// restore copies no rows; otherwise it copies them, one layer at a time.
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
        if let Some(mut cache) = self.share_target().and_then(|t| source.share_into(t)) {
            cache.truncate(len);
            return Ok(cache);
        }
        let shape = source.shape();
        let mut cache = self.new_cache(shape);
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

    /// A stand-in device: host caches that remember they were made here.
    struct Counting(AtomicUsize);

    impl MakeDeviceCache for Counting {
        fn new_cache(&self, shape: KvShape) -> Box<dyn KvCache> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::new(Contiguous::new(shape, 16))
        }

        fn name(&self) -> String {
            "test:0".into()
        }
    }

    #[test]
    fn a_device_factory_builds_and_restores_through_its_maker() {
        let maker = Arc::new(Counting(AtomicUsize::new(0)));
        let factory = CacheFactory::Device(DeviceCaches(maker.clone()));
        assert_eq!(factory.layout(), LayoutKind::Device);
        assert_eq!(format!("{factory:?}"), "Device(DeviceCaches(test:0))");
        let shape = KvShape {
            layers: 2,
            kv_heads: 1,
            head_dim: 4,
        };
        let mut host = CacheFactory::contiguous().new_cache(shape);
        for layer in 0..2 {
            let rows: Vec<f32> = (0..12).map(|i| (i + 100 * layer) as f32).collect();
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
        assert_eq!(k, (100..108).map(|i| i as f32).collect::<Vec<_>>());
        factory.new_cache(shape);
        assert_eq!(maker.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn device_factories_are_equal_only_when_they_share_a_maker() {
        let a = DeviceCaches(Arc::new(Counting(AtomicUsize::new(0))));
        let b = DeviceCaches(Arc::new(Counting(AtomicUsize::new(0))));
        assert_eq!(a, a.clone());
        assert_ne!(a, b);
        assert_ne!(CacheFactory::Device(a), CacheFactory::contiguous());
    }
}
