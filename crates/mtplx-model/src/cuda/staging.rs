//! Pinned host staging for copies to the device from pageable memory (the rows a restore
//! brings: the SSD tier's read buffers, the bank's snapshots). A copy from pageable memory
//! returns only once the device has the bytes; here the caller's bytes are copied (on
//! several threads) into one of two page-locked buffers and sent asynchronously, so the
//! transfer out of one buffer overlaps the caller filling the other (and its next read and
//! checksum). Allocated on first use: a server that never restores into the device pins
//! nothing.

use std::sync::{Arc, Mutex};

use cudarc::driver::{result, CudaContext, CudaEvent, CudaStream, PinnedHostSlice};

use super::fault::device_error;
use crate::error::Result;

/// Bytes of each buffer.
const STAGE_BYTES: usize = 8 << 20;

/// Bytes one thread copies into a buffer.
const COPY_PIECE: usize = 128 << 10;

/// `dst = src`, in pieces of [`COPY_PIECE`] on rayon's threads: one thread's copy into
/// pinned memory was the pace of a restore into the device (a 4.2 GB restore on an H100's
/// host, 6.4-7.6 GB/s with the read and the checksum already on other threads).
fn copy_side_by_side(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    if src.len() <= COPY_PIECE {
        dst.copy_from_slice(src);
        return;
    }
    dst.par_chunks_mut(COPY_PIECE)
        .zip(src.par_chunks(COPY_PIECE))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

struct Buffer {
    pinned: PinnedHostSlice<u8>,
    /// Recorded after the last copy out of this buffer.
    sent: Option<CudaEvent>,
}

impl Drop for Buffer {
    /// The pinned memory is freed only once no copy reads it.
    fn drop(&mut self) {
        if let Some(e) = self.sent.take() {
            let _ = e.synchronize();
        }
    }
}

pub(super) struct Staging {
    buffers: [Buffer; 2],
    next: usize,
}

impl Staging {
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Result<Staging> {
        let buffer = || -> Result<Buffer> {
            // SAFETY: the memory is written before any copy reads it (`send`).
            let pinned = unsafe { ctx.alloc_pinned::<u8>(STAGE_BYTES) }
                .map_err(|e| device_error("allocate pinned staging", e))?;
            Ok(Buffer { pinned, sent: None })
        };
        Ok(Staging {
            buffers: [buffer()?, buffer()?],
            next: 0,
        })
    }

    /// Queues the copy of `host` to device address `dst` on `stream`, a buffer's worth at
    /// a time; `host` may be reused when this returns. Each enqueue holds `host_ops` (the
    /// device's lock against a graph capture recording it). The caller makes sure `dst`
    /// holds `host.len()` bytes.
    pub(super) fn send(
        &mut self,
        stream: &CudaStream,
        host: &[u8],
        dst: u64,
        host_ops: &Mutex<()>,
    ) -> Result<()> {
        let mut at = 0u64;
        for chunk in host.chunks(STAGE_BYTES) {
            let b = &mut self.buffers[self.next];
            self.next ^= 1;
            // This buffer's previous copy has finished before it is written again.
            if let Some(e) = b.sent.take() {
                e.synchronize()
                    .map_err(|e| device_error("wait for a staged copy", e))?;
            }
            let staged = b
                .pinned
                .as_mut_slice()
                .map_err(|e| device_error("pinned staging", e))?;
            copy_side_by_side(&mut staged[..chunk.len()], chunk);
            let staged = &staged[..chunk.len()];
            let _queued = host_ops.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: `staged` is page-locked and stays untouched until `sent` is waited
            // for (above, or when the buffer is dropped); dst + at .. + len lies in the
            // caller's allocation.
            unsafe { result::memcpy_htod_async(dst + at, staged, stream.cu_stream()) }
                .map_err(|e| device_error("copy to the device", e))?;
            b.sent = Some(
                stream
                    .record_event(None)
                    .map_err(|e| device_error("record a staged copy", e))?,
            );
            at += chunk.len() as u64;
        }
        Ok(())
    }
}
