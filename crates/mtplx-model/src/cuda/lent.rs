//! Page-locked host buffers a device cache lends to a restore ([`mtplx_kv::KvCache::lend_staging`]):
//! the restore reads stored rows from disk straight into them, and the cache's copies to the
//! device read them there, so no byte is copied on the host between the read and the
//! device (`staging.rs` is for callers whose rows sit in their own pageable memory). The
//! memory is cached, not write-combined as `staging.rs`'s is: the restore hashes what it
//! read. Buffers go back to the device's pool when dropped and are lent again by the next
//! restore.

use std::any::Any;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, CudaContext, CudaEvent, CudaStream};
use mtplx_kv::{KvError, StagingBuffer};

use super::fault::device_error;
use crate::error::Result;

/// Bytes of free buffers a device keeps for the next restore.
const KEEP_BYTES: usize = 96 << 20;

/// Page-locked host memory (`cuMemHostAlloc`, no flags).
struct HostMemory {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain memory, owned by this value alone; the context is thread-safe.
unsafe impl Send for HostMemory {}

impl HostMemory {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<HostMemory> {
        ctx.bind_to_thread()
            .map_err(|e| device_error("bind the context", e))?;
        // SAFETY: a fresh allocation of `len` bytes, freed in `drop`.
        let ptr = unsafe { result::malloc_host(len, 0) }
            .map_err(|e| device_error("allocate page-locked memory", e))?;
        Ok(HostMemory {
            ptr: ptr.cast(),
            len,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `malloc_host`; no copy reads it (`Lent` waits first).
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
    }
}

/// The free buffers of one device.
pub(super) struct LentPool {
    ctx: Arc<CudaContext>,
    free: Arc<Mutex<Vec<HostMemory>>>,
}

impl LentPool {
    pub(super) fn new(ctx: &Arc<CudaContext>) -> LentPool {
        LentPool {
            ctx: ctx.clone(),
            free: Arc::default(),
        }
    }

    /// `count` buffers of at least `bytes` bytes: kept ones first, new ones for the rest.
    pub(super) fn lend(&self, count: usize, bytes: usize) -> Result<Vec<Lent>> {
        let mut kept = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let (fit, small): (Vec<_>, Vec<_>) = free.drain(..).partition(|m| m.len >= bytes);
            *free = small;
            fit
        };
        let mut lent = Vec::with_capacity(count);
        while lent.len() < count {
            let memory = match kept.pop() {
                Some(m) => m,
                None => HostMemory::new(&self.ctx, bytes)?,
            };
            lent.push(Lent {
                memory: Some(memory),
                sent: None,
                pool: self.free.clone(),
            });
        }
        // More than asked for stays free.
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(&mut kept);
        Ok(lent)
    }
}

/// A buffer lent to a restore: back to its pool when dropped, once no copy reads it.
pub(crate) struct Lent {
    memory: Option<HostMemory>,
    /// Recorded after the last copy out of it.
    sent: Option<CudaEvent>,
    pool: Arc<Mutex<Vec<HostMemory>>>,
}

impl Lent {
    fn memory(&self) -> &HostMemory {
        self.memory.as_ref().expect("taken only on drop")
    }

    /// Waits for the last copy out of this buffer. Only a wait that succeeds forgets the
    /// copy: after a failed one, the buffer is never refilled or freed as if it were idle.
    fn wait(&mut self) -> Result<()> {
        if let Some(e) = &self.sent {
            e.synchronize()
                .map_err(|e| device_error("wait for a copy out of a lent buffer", e))?;
        }
        self.sent = None;
        Ok(())
    }

    /// Queues the copy of bytes `range` of this buffer to device address `dst` on `stream`
    /// (the enqueue holds `host_ops`, the device's lock against a graph capture).
    pub(super) fn send(
        &mut self,
        stream: &CudaStream,
        range: Range<usize>,
        dst: u64,
        host_ops: &Mutex<()>,
    ) -> Result<()> {
        let m = self.memory();
        assert!(
            range.start <= range.end && range.end <= m.len,
            "a lent buffer's range"
        );
        // SAFETY: the bytes lie in the page-locked allocation, which is neither written
        // (`to_fill` waits for `sent`) nor freed (`drop` waits for it) before the copy ends.
        let src = unsafe { std::slice::from_raw_parts(m.ptr.add(range.start), range.len()) };
        let _queued = host_ops.lock().unwrap_or_else(|p| p.into_inner());
        unsafe { result::memcpy_htod_async(dst, src, stream.cu_stream()) }
            .map_err(|e| device_error("copy a lent buffer to the device", e))?;
        // Replacing the previous event is enough: a stream's events complete in order.
        self.sent = Some(
            stream
                .record_event(None)
                .map_err(|e| device_error("record a copy out of a lent buffer", e))?,
        );
        Ok(())
    }
}

impl StagingBuffer for Lent {
    fn to_fill(&mut self) -> std::result::Result<&mut [u8], KvError> {
        self.wait().map_err(|e| KvError::Device(e.to_string()))?;
        let m = self.memory();
        // SAFETY: no copy reads the memory any more (waited above), and `&mut self` keeps
        // another fill or send from starting while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(m.ptr, m.len) })
    }

    fn bytes(&self) -> &[u8] {
        let m = self.memory();
        // SAFETY: copies only read it; writes need `&mut self` (`to_fill`).
        unsafe { std::slice::from_raw_parts(m.ptr, m.len) }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Drop for Lent {
    /// Back to the pool once no copy reads it; leaked when that can't be known (a failed
    /// wait), since freeing memory a copy may still read is worse than losing it.
    fn drop(&mut self) {
        let Some(memory) = self.memory.take() else {
            return;
        };
        if self.wait().is_err() {
            std::mem::forget(memory);
            return;
        }
        let mut free = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let kept: usize = free.iter().map(|m| m.len).sum();
        if kept + memory.len <= KEEP_BYTES {
            free.push(memory);
        }
    }
}
