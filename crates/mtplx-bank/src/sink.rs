//! Building the caller's cache from an SSD restore, through the caller's factory.

use mtplx_cold::{BoxError, KvGeometry, KvSink, RecurrentCheckpoint, TailState};
use mtplx_kv::{CacheFactory, KvCache, KvShape};

use crate::convert::geometry;

/// A [`KvSink`] that appends the restored rows straight into a cache built by the caller's
/// factory: nothing is staged, so nothing of the SSD entry outlives the restore except the
/// cache itself (and the recurrent and tail state handed over with it).
pub(crate) struct CacheSink<'a> {
    factory: &'a CacheFactory,
    shape: KvShape,
    pub(crate) cache: Option<Box<dyn KvCache>>,
    pub(crate) recurrent: Option<RecurrentCheckpoint>,
    pub(crate) tail: Option<TailState>,
}

impl<'a> CacheSink<'a> {
    pub(crate) fn new(factory: &'a CacheFactory, shape: KvShape) -> Self {
        CacheSink {
            factory,
            shape,
            cache: None,
            recurrent: None,
            tail: None,
        }
    }
}

impl KvSink for CacheSink<'_> {
    fn begin(&mut self, g: KvGeometry, _rows: usize) -> Result<(), BoxError> {
        if g != geometry(self.shape) {
            return Err(format!(
                "stored geometry {g:?} differs from the caller's shape {:?}",
                self.shape
            )
            .into());
        }
        self.cache = Some(self.factory.new_cache(self.shape));
        Ok(())
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
