//! Building the caller's cache from an SSD restore, through the caller's factory.

use mtplx_cold::{BoxError, KvGeometry, KvSink, RecurrentCheckpoint, TailState};
use mtplx_kv::{CacheFactory, KvCache, KvShape, LayoutKind};

use crate::convert::geometry;

/// A [`KvSink`] that builds the restored rows straight into a cache built by the caller's
/// factory: nothing of the SSD entry outlives the restore except the cache itself (and the
/// recurrent and tail state handed over with it). When the layout lends its storage
/// ([`KvCache::append_in_place`]: a contiguous cache does), blocks are read from disk
/// straight into it ([`KvSink::direct_rows`]); otherwise the cold tier stages them and they
/// are appended.
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
        if g != geometry(self.shape) {
            return Err(format!(
                "stored geometry {g:?} differs from the caller's shape {:?}",
                self.shape
            )
            .into());
        }
        self.cache = Some(self.factory.new_cache(self.shape));
        self.rows = rows;
        Ok(())
    }

    fn direct_rows(&mut self) -> Option<Vec<(&mut [f32], &mut [f32])>> {
        let cache = self.cache.as_mut()?;
        // The cold tier takes one slice per layer: only a contiguous layer lends one.
        if cache.layout() != LayoutKind::Contiguous {
            return None;
        }
        let lent = cache.append_in_place(self.rows)?;
        lent.into_iter()
            .map(|layer| {
                let [piece] = <[_; 1]>::try_from(layer.pieces).ok()?;
                Some((piece.k, piece.v))
            })
            .collect()
    }

    fn write_rows(
        &mut self,
        layer: usize,
        start: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), BoxError> {
        let cache = self.cache.as_mut().ok_or("begin was not called")?;
        let have = cache.layer_len(layer);
        if have != start {
            return Err(format!("layer {layer}: rows from {start} arrive after {have}").into());
        }
        Ok(cache.append(layer, k, v)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: KvShape = KvShape {
        layers: 2,
        kv_heads: 1,
        head_dim: 4,
    };

    #[test]
    fn a_contiguous_cache_lends_its_rows_and_the_other_layouts_append() {
        for (factory, lends) in [
            (CacheFactory::contiguous(), true),
            (CacheFactory::paged(), false),
            (CacheFactory::segmented(), false),
        ] {
            let mut sink = CacheSink::new(&factory, SHAPE);
            sink.begin(geometry(SHAPE), 3).unwrap();
            let Some(rows) = sink.direct_rows() else {
                assert!(!lends, "{:?}", factory.layout());
                assert_eq!(sink.cache.as_ref().unwrap().len(), 0);
                continue;
            };
            assert!(lends, "{:?}", factory.layout());
            assert_eq!(rows.len(), 2);
            for (l, (k, v)) in rows.into_iter().enumerate() {
                assert_eq!((k.len(), v.len()), (12, 12));
                k.fill(l as f32);
                v.fill(-(l as f32));
            }
            let cache = sink.cache.as_ref().unwrap();
            assert_eq!(cache.len(), 3);
            let (mut k, mut v) = ([0.0; 12], [0.0; 12]);
            cache.read_rows(1, 0..3, &mut k, &mut v).unwrap();
            assert_eq!((k, v), ([1.0; 12], [-1.0; 12]));
        }
    }
}
