//! A KV cache whose rows live in the GPU's memory.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use mtplx_kv::{
    Contiguous, KvCache, KvDtype, KvError, KvShape, KvView, LayoutKind, MakeDeviceCache,
};

use super::device::CudaDevice;

/// Positions a cache grows by.
const GROW: usize = 256;

/// K/V rows in device memory: per layer one buffer of K and one of V, `[capacity, row]`,
/// grown (copied into a larger buffer) 256 positions at a time. The CUDA model writes and
/// attends over them in place; [`KvCache::append`] and [`KvView::read_rows`] copy rows in
/// and out, so restores, snapshots (host copies, [`Contiguous`]) and conversions work as
/// with any other layout.
pub struct CudaKvCache {
    dev: Arc<CudaDevice>,
    shape: KvShape,
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
    lens: Vec<usize>,
    capacity: usize,
}

fn kv_error(e: crate::ModelError) -> KvError {
    KvError::Device(e.to_string())
}

impl CudaKvCache {
    pub fn new(dev: Arc<CudaDevice>, shape: KvShape) -> Self {
        CudaKvCache {
            dev,
            k: Vec::new(),
            v: Vec::new(),
            lens: vec![0; shape.layers],
            shape,
            capacity: 0,
        }
    }

    /// Makes room for `len` positions in every layer.
    pub(crate) fn reserve(&mut self, len: usize) -> Result<(), KvError> {
        if len <= self.capacity && !self.k.is_empty() {
            return Ok(());
        }
        let cap = len.div_ceil(GROW).max(1) * GROW;
        let row = self.shape.row_len();
        let mut k = Vec::with_capacity(self.shape.layers);
        let mut v = Vec::with_capacity(self.shape.layers);
        for layer in 0..self.shape.layers {
            let mut nk = self.dev.zeros::<f32>(cap * row).map_err(kv_error)?;
            let mut nv = self.dev.zeros::<f32>(cap * row).map_err(kv_error)?;
            if let (Some(ok), Some(ov)) = (self.k.get(layer), self.v.get(layer)) {
                let used = self.lens[layer] * row;
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
}

impl KvView for CudaKvCache {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn layout(&self) -> LayoutKind {
        LayoutKind::Device
    }

    fn dtype(&self) -> KvDtype {
        KvDtype::F32
    }

    fn layer_len(&self, layer: usize) -> usize {
        self.lens[layer]
    }

    fn read_rows(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<(), KvError> {
        self.check_layer(layer)?;
        let len = self.lens[layer];
        if range.end > len || range.start > range.end {
            return Err(KvError::RowsOutOfRange {
                start: range.start,
                end: range.end,
                len,
            });
        }
        let row = self.shape.row_len();
        let n = range.len() * row;
        if k.len() < n || v.len() < n {
            return Err(KvError::OutputSize {
                got: k.len().min(v.len()),
                expected: n,
            });
        }
        if n == 0 {
            return Ok(());
        }
        let at = range.start * row;
        self.dev
            .read(&self.k[layer], at, &mut k[..n])
            .map_err(kv_error)?;
        self.dev
            .read(&self.v[layer], at, &mut v[..n])
            .map_err(kv_error)
    }

    /// `f32`, read back as its bytes (the host's byte order, as the SSD tier stores them).
    fn read_raw(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<(), KvError> {
        let n = range.len() * self.shape.row_len();
        if k.len() != 4 * n || v.len() != 4 * n {
            return Err(KvError::OutputSize {
                got: k.len().min(v.len()),
                expected: 4 * n,
            });
        }
        let (mut kf, mut vf) = (vec![0f32; n], vec![0f32; n]);
        self.read_rows(layer, range, &mut kf, &mut vf)?;
        for (bytes, values) in [(k, kf), (v, vf)] {
            for (b, x) in bytes.chunks_exact_mut(4).zip(values) {
                b.copy_from_slice(&x.to_ne_bytes());
            }
        }
        Ok(())
    }

    fn logical_bytes(&self) -> usize {
        self.len() * self.shape.bytes_per_token(KvDtype::F32)
    }

    /// Device memory held (K and V of every layer, at capacity).
    fn physical_bytes(&self) -> usize {
        self.capacity * self.shape.bytes_per_token(KvDtype::F32)
    }
}

impl KvCache for CudaKvCache {
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        self.check_layer(layer)?;
        let row = self.shape.row_len();
        if !k.len().is_multiple_of(row) {
            return Err(KvError::RaggedRows {
                what: "K",
                got: k.len(),
                row_len: row,
            });
        }
        if k.len() != v.len() {
            return Err(KvError::KvRowMismatch {
                k: k.len() / row,
                v: v.len() / row,
            });
        }
        let n = k.len() / row;
        let at = self.lens[layer];
        self.reserve(at + n)?;
        self.dev
            .write(k, &mut self.k[layer], at * row)
            .map_err(kv_error)?;
        self.dev
            .write(v, &mut self.v[layer], at * row)
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
        let row = self.shape.row_len();
        let mut host = Contiguous::new(
            KvShape {
                layers: 1,
                ..self.shape
            },
            len.max(1),
        );
        let mut k = vec![0f32; len * row];
        let mut v = vec![0f32; len * row];
        self.read_rows(layer, 0..len, &mut k, &mut v)?;
        host.append(0, &k, &v)?;
        host.attend(0, q, q_heads, scale, out)
    }

    fn truncate(&mut self, len: usize) {
        for l in &mut self.lens {
            *l = (*l).min(len);
        }
    }

    fn snapshot(&self) -> Arc<dyn KvView> {
        let len = self.len();
        let row = self.shape.row_len();
        let mut host = Contiguous::new(self.shape, len.max(1));
        let mut k = vec![0f32; len * row];
        let mut v = vec![0f32; len * row];
        for layer in 0..self.shape.layers {
            // A device that fails a copy here has failed the whole process's work; there
            // is no partial snapshot to return.
            self.read_rows(layer, 0..len, &mut k, &mut v)
                .expect("copy the KV rows from the device");
            host.append(layer, &k, &v)
                .expect("rows of the cache's own shape");
        }
        Arc::new(host)
    }

    fn fork(&self) -> Box<dyn KvCache> {
        let mut f = CudaKvCache::new(self.dev.clone(), self.shape);
        if self.k.is_empty() {
            // Nothing allocated, so nothing written yet.
            return Box::new(f);
        }
        let len = self.lens.iter().copied().max().unwrap_or(0);
        f.reserve(len).expect("allocate the fork's device rows");
        let row = self.shape.row_len();
        for layer in 0..self.shape.layers {
            let used = self.lens[layer] * row;
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

/// Builds [`CudaKvCache`]s: `CacheFactory::device(DeviceCaches(Arc::new(CudaCaches(dev))))`.
pub struct CudaCaches(pub Arc<CudaDevice>);

impl MakeDeviceCache for CudaCaches {
    fn new_cache(&self, shape: KvShape) -> Box<dyn KvCache> {
        Box::new(CudaKvCache::new(self.0.clone(), shape))
    }

    fn name(&self) -> String {
        format!("cuda:{}", self.0.ordinal())
    }
}
