//! A KV cache whose rows live in the GPU's memory.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use mtplx_kv::{
    staged_part, CacheFactory, KvCache, KvDtype, KvError, KvShape, KvView, Layout, LayoutKind,
    MakeDeviceCache, StagingBuffer,
};

use super::device::CudaDevice;
use super::lent::Lent;

/// Positions a cache grows by.
const GROW: usize = 256;

/// K/V rows in device memory: per layer one buffer of K and one of V, `[capacity, row]`
/// values stored as `f32` or `f16` (rounded once, when the model writes a row), grown
/// (copied into a larger buffer) 256 positions at a time. The CUDA model writes and attends
/// over them in place; [`KvCache::append`], [`KvCache::append_stored`] and the
/// [`KvView`] reads copy rows in and out, so restores, snapshots (host copies in the same
/// type, [`mtplx_kv::Contiguous`]) and conversions work as with any other layout.
pub struct CudaKvCache {
    dev: Arc<CudaDevice>,
    shape: KvShape,
    dtype: KvDtype,
    /// The stored values' bytes.
    k: Vec<CudaSlice<u8>>,
    v: Vec<CudaSlice<u8>>,
    lens: Vec<usize>,
    capacity: usize,
}

fn kv_error(e: crate::ModelError) -> KvError {
    KvError::Device(e.to_string())
}

impl CudaKvCache {
    /// An empty cache storing `dtype` (one [`CudaDevice::stores_kv`] takes).
    pub fn new(dev: Arc<CudaDevice>, shape: KvShape, dtype: KvDtype) -> Self {
        assert!(dev.stores_kv(dtype), "{dtype} K/V on this device");
        CudaKvCache {
            dev,
            k: Vec::new(),
            v: Vec::new(),
            lens: vec![0; shape.layers],
            shape,
            dtype,
            capacity: 0,
        }
    }

    /// Bytes of `positions` rows.
    fn row_bytes(&self, positions: usize) -> usize {
        self.dtype.bytes(positions * self.shape.row_len())
    }

    /// Makes room for `len` positions in every layer.
    pub(crate) fn reserve(&mut self, len: usize) -> Result<(), KvError> {
        if len <= self.capacity && !self.k.is_empty() {
            return Ok(());
        }
        let cap = len.div_ceil(GROW).max(1) * GROW;
        let mut k = Vec::with_capacity(self.shape.layers);
        let mut v = Vec::with_capacity(self.shape.layers);
        for layer in 0..self.shape.layers {
            let mut nk = self
                .dev
                .zeros::<u8>(self.row_bytes(cap))
                .map_err(kv_error)?;
            let mut nv = self
                .dev
                .zeros::<u8>(self.row_bytes(cap))
                .map_err(kv_error)?;
            if let (Some(ok), Some(ov)) = (self.k.get(layer), self.v.get(layer)) {
                let used = self.row_bytes(self.lens[layer]);
                self.dev.copy(ok, &mut nk, used).map_err(kv_error)?;
                self.dev.copy(ov, &mut nv, used).map_err(kv_error)?;
            }
            k.push(nk);
            v.push(nv);
        }
        // The old buffers are freed on the stream: not while a pass is being captured.
        let _host = self.dev.host_ops();
        self.k = k;
        self.v = v;
        self.capacity = cap;
        Ok(())
    }

    /// The device addresses of every layer's K and V buffers (`[capacity, row]` each), in
    /// the order the kernels read them: K of layer 0, V of layer 0, K of layer 1, …
    pub(crate) fn addresses(&self) -> Vec<u64> {
        self.k
            .iter()
            .zip(&self.v)
            .flat_map(|(k, v)| [self.dev.address(k), self.dev.address(v)])
            .collect()
    }

    /// Marks positions `..len` of every layer as written (by the model, in place).
    pub(crate) fn commit(&mut self, len: usize) {
        for l in &mut self.lens {
            *l = len;
        }
    }

    pub(crate) fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    fn check_layer(&self, layer: usize) -> Result<(), KvError> {
        if layer >= self.shape.layers {
            return Err(KvError::LayerOutOfRange {
                layer,
                layers: self.shape.layers,
            });
        }
        Ok(())
    }

    /// Checks that rows `range` of `layer` are stored.
    fn check_rows(&self, layer: usize, range: &Range<usize>) -> Result<(), KvError> {
        self.check_layer(layer)?;
        let len = self.lens[layer];
        if range.end > len || range.start > range.end {
            return Err(KvError::RowsOutOfRange {
                start: range.start,
                end: range.end,
                len,
            });
        }
        Ok(())
    }

    /// Makes room for `k` and `v` bytes of stored rows after `layer`'s (checked whole rows
    /// of this cache's type, as many of K as of V): their count, and the byte they go at.
    fn room_for(&mut self, layer: usize, k: usize, v: usize) -> Result<(usize, usize), KvError> {
        self.check_layer(layer)?;
        let row = self.row_bytes(1);
        if !k.is_multiple_of(row) {
            return Err(KvError::RaggedRows {
                what: "K",
                got: k,
                row_len: row,
            });
        }
        if k != v {
            return Err(KvError::KvRowMismatch {
                k: k / row,
                v: v / row,
            });
        }
        let n = k / row;
        let at = self.lens[layer];
        self.reserve(at + n)?;
        Ok((n, at * row))
    }

    /// Appends rows given as stored bytes (checked whole rows of this cache's type).
    fn append_bytes(&mut self, layer: usize, k: &[u8], v: &[u8]) -> Result<(), KvError> {
        let (n, at) = self.room_for(layer, k.len(), v.len())?;
        // Through pinned staging: the copy to the device overlaps the caller's next rows.
        self.dev
            .write_staged(k, &mut self.k[layer], at)
            .map_err(kv_error)?;
        self.dev
            .write_staged(v, &mut self.v[layer], at)
            .map_err(kv_error)?;
        self.lens[layer] += n;
        Ok(())
    }
}

impl KvView for CudaKvCache {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn layout(&self) -> LayoutKind {
        LayoutKind::Device
    }

    fn dtype(&self) -> KvDtype {
        self.dtype
    }

    fn layer_len(&self, layer: usize) -> usize {
        self.lens[layer]
    }

    /// The stored values widened to `f32` (exactly).
    fn read_rows(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<(), KvError> {
        self.check_rows(layer, &range)?;
        let n = range.len() * self.shape.row_len();
        if k.len() < n || v.len() < n {
            return Err(KvError::OutputSize {
                got: k.len().min(v.len()),
                expected: n,
            });
        }
        let bytes = self.row_bytes(range.len());
        let (mut kb, mut vb) = (vec![0u8; bytes], vec![0u8; bytes]);
        self.read_raw(layer, range, &mut kb, &mut vb)?;
        for (out, raw) in [(k, kb), (v, vb)] {
            let wide = self
                .dtype
                .decode(&raw)
                .expect("whole rows of the cache's type");
            out[..n].copy_from_slice(&wide);
        }
        Ok(())
    }

    /// The stored values' bytes (the host's byte order, as the SSD tier stores them),
    /// copied straight from the device.
    fn read_raw(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<(), KvError> {
        self.check_rows(layer, &range)?;
        let n = self.row_bytes(range.len());
        if k.len() != n || v.len() != n {
            return Err(KvError::OutputSize {
                got: k.len().min(v.len()),
                expected: n,
            });
        }
        if n == 0 {
            return Ok(());
        }
        let at = self.row_bytes(range.start);
        self.dev.read(&self.k[layer], at, k).map_err(kv_error)?;
        self.dev.read(&self.v[layer], at, v).map_err(kv_error)
    }

    /// Device memory held (K and V of every layer, at capacity).
    fn physical_bytes(&self) -> usize {
        self.capacity * self.shape.bytes_per_token(self.dtype)
    }
}

impl KvCache for CudaKvCache {
    /// Rounds the rows to the stored type on the host, then copies them in.
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        let row = self.shape.row_len();
        if !k.len().is_multiple_of(row) {
            return Err(KvError::RaggedRows {
                what: "K",
                got: k.len(),
                row_len: row,
            });
        }
        let dtype = self.dtype;
        self.append_bytes(layer, &dtype.encode(k), &dtype.encode(v))
    }

    fn reserve_positions(&mut self, n: usize) -> Result<(), KvError> {
        self.reserve(n)
    }

    /// Stored bytes go to the device as they are: a restore never rounds them again.
    fn append_stored(&mut self, layer: usize, k: &[u8], v: &[u8]) -> Result<(), KvError> {
        self.append_bytes(layer, k, v)
    }

    /// Page-locked buffers of the device's (`lent.rs`); `None` where they can't be had,
    /// and the restore takes the copying path.
    fn lend_staging(&mut self, count: usize, bytes: usize) -> Option<Vec<Box<dyn StagingBuffer>>> {
        let lent = self.dev.lend_host(count, bytes).ok()?;
        Some(lent.into_iter().map(|b| Box::new(b) as _).collect())
    }

    /// From a buffer this device lent, the rows go to the device straight from it.
    fn append_staged(
        &mut self,
        layer: usize,
        buf: &mut dyn StagingBuffer,
        k: Range<usize>,
        v: Range<usize>,
    ) -> Result<(), KvError> {
        // Both ranges lie in the buffer.
        let bytes = buf.bytes();
        staged_part(bytes, k.clone())?;
        staged_part(bytes, v.clone())?;
        let Some(lent) = buf.as_any_mut().downcast_mut::<Lent>() else {
            let bytes = buf.bytes();
            return self.append_bytes(layer, &bytes[k], &bytes[v]);
        };
        let (n, at) = self.room_for(layer, k.len(), v.len())?;
        self.dev
            .write_lent(lent, k, &mut self.k[layer], at)
            .map_err(kv_error)?;
        self.dev
            .write_lent(lent, v, &mut self.v[layer], at)
            .map_err(kv_error)?;
        self.lens[layer] += n;
        Ok(())
    }

    /// Attention for host queries: the rows go to the host and the shared host kernel runs
    /// over them (what a CPU-side caller, such as an MTP head on the CPU, gets). The CUDA
    /// model never calls this: it attends on the device.
    fn attend(
        &self,
        layer: usize,
        q: &[f32],
        q_heads: usize,
        scale: f32,
        out: &mut [f32],
    ) -> Result<(), KvError> {
        self.check_layer(layer)?;
        let len = self.lens[layer];
        let one = KvShape {
            layers: 1,
            ..self.shape
        };
        let mut host = host_factory(len, self.dtype).new_cache(one);
        let bytes = self.row_bytes(len);
        let (mut k, mut v) = (vec![0u8; bytes], vec![0u8; bytes]);
        self.read_raw(layer, 0..len, &mut k, &mut v)?;
        host.append_stored(0, &k, &v)?;
        host.attend(0, q, q_heads, scale, out)
    }

    fn truncate(&mut self, len: usize) {
        for l in &mut self.lens {
            *l = (*l).min(len);
        }
    }

    /// A host copy in the same type, each layer's rows read from the device straight into
    /// the copy's own buffers.
    fn snapshot(&self) -> Arc<dyn KvView> {
        let len = self.len();
        let mut host = host_factory(len, self.dtype).new_cache(self.shape);
        if len > 0 {
            let lent = host
                .append_in_place(len)
                .expect("a contiguous cache lends its rows");
            for (layer, lent) in lent.into_iter().enumerate() {
                for p in lent.pieces {
                    // A device that fails a copy here has failed the whole process's work;
                    // there is no partial snapshot to return.
                    self.read_raw(layer, p.positions, p.k, p.v)
                        .expect("copy the KV rows from the device");
                }
            }
        }
        Arc::<dyn KvCache>::from(host)
    }

    fn fork(&self) -> Box<dyn KvCache> {
        let mut f = CudaKvCache::new(self.dev.clone(), self.shape, self.dtype);
        if self.k.is_empty() {
            // Nothing allocated, so nothing written yet.
            return Box::new(f);
        }
        let len = self.lens.iter().copied().max().unwrap_or(0);
        f.reserve(len).expect("allocate the fork's device rows");
        for layer in 0..self.shape.layers {
            let used = self.row_bytes(self.lens[layer]);
            self.dev
                .copy(&self.k[layer], &mut f.k[layer], used)
                .expect("copy K on the device");
            self.dev
                .copy(&self.v[layer], &mut f.v[layer], used)
                .expect("copy V on the device");
        }
        f.lens = self.lens.clone();
        Box::new(f)
    }

    fn device_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}

impl Drop for CudaKvCache {
    /// Frees the buffers on the stream, never while a pass is being captured (a server drops
    /// caches on threads other than its engine's).
    fn drop(&mut self) {
        let _host = self.dev.host_ops();
        self.k.clear();
        self.v.clear();
    }
}

/// A host cache of `dtype` rows that holds `len` positions in one buffer a layer.
fn host_factory(len: usize, dtype: KvDtype) -> CacheFactory {
    CacheFactory::from(Layout::Contiguous {
        chunk_tokens: len.max(1),
    })
    .with_dtype(dtype)
    .expect("a host layout stores every type")
}

/// Builds [`CudaKvCache`]s: `CacheFactory::device(DeviceCaches(Arc::new(CudaCaches(dev))))`.
pub struct CudaCaches(pub Arc<CudaDevice>);

impl MakeDeviceCache for CudaCaches {
    fn stores(&self, dtype: KvDtype) -> bool {
        self.0.stores_kv(dtype)
    }

    fn new_cache(&self, shape: KvShape, dtype: KvDtype) -> Box<dyn KvCache> {
        Box::new(CudaKvCache::new(self.0.clone(), shape, dtype))
    }

    fn name(&self) -> String {
        format!("cuda:{}", self.0.ordinal())
    }
}
