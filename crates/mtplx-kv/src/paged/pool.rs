//! The shared, thread-safe pool that paged caches take their blocks from.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::KvElem;

/// A ref-counted pool of fixed-size KV blocks, shared by every [`crate::Paged`] cache built
/// from one [`crate::CacheFactory`] (cloning the pool clones the handle).
///
/// A block goes back to the pool's free list when the last cache or snapshot referencing it
/// drops it, and the next allocation of the same size reuses it. [`BlockPool::trim`] hands
/// the free list back to the allocator. Blocks of different sizes (different shapes or
/// block lengths) keep separate free lists.
#[derive(Clone, Default)]
pub struct BlockPool {
    inner: Arc<PoolInner>,
}

#[derive(Default)]
struct PoolInner {
    /// Free buffers by length in 4-byte words.
    free: Mutex<HashMap<usize, Vec<Box<[u32]>>>>,
    live_blocks: AtomicUsize,
    live_bytes: AtomicUsize,
}

/// What a [`BlockPool`] holds at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Blocks referenced by at least one cache or snapshot.
    pub live_blocks: usize,
    /// Bytes of those blocks.
    pub live_bytes: usize,
    /// Released blocks kept for reuse.
    pub free_blocks: usize,
    /// Bytes of those blocks.
    pub free_bytes: usize,
}

/// One block: `block_tokens` K rows followed by `block_tokens` V rows, of whatever element
/// type its cache stores (4-byte words underneath, so any [`KvElem`] can be cast to).
pub(crate) struct Block {
    data: Box<[u32]>,
    pool: Arc<PoolInner>,
}

impl Block {
    #[inline]
    fn values<E: KvElem>(&self) -> &[E] {
        bytemuck::cast_slice(&self.data)
    }
    #[inline]
    pub(crate) fn k<E: KvElem>(&self) -> &[E] {
        let all = self.values::<E>();
        &all[..all.len() / 2]
    }
    #[inline]
    pub(crate) fn v<E: KvElem>(&self) -> &[E] {
        let all = self.values::<E>();
        &all[all.len() / 2..]
    }
    /// The K and V halves, writable.
    #[inline]
    pub(crate) fn kv_mut<E: KvElem>(&mut self) -> (&mut [E], &mut [E]) {
        let all: &mut [E] = bytemuck::cast_slice_mut(&mut self.data);
        let half = all.len() / 2;
        all.split_at_mut(half)
    }
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.data)
    }
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Block({} bytes)", 4 * self.data.len())
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        let bytes = std::mem::size_of_val(&*data);
        self.pool.live_blocks.fetch_sub(1, Ordering::Relaxed);
        self.pool.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
        let mut free = self.pool.free.lock().unwrap_or_else(|e| e.into_inner());
        free.entry(data.len()).or_default().push(data);
    }
}

impl BlockPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// A block of `bytes` (K and V halves; a multiple of 4), reused from the free list when
    /// one of that size is there. Its contents are unspecified: callers write before they
    /// read.
    pub(crate) fn alloc(&self, bytes: usize) -> Arc<Block> {
        self.alloc_with(bytes, |_| {})
    }

    /// A block of `bytes` zeros: a reused block is cleared, a new one comes zeroed from the
    /// allocator (no memset).
    pub(crate) fn alloc_zeroed(&self, bytes: usize) -> Arc<Block> {
        self.alloc_with(bytes, |data| data.fill(0))
    }

    /// A block of `bytes`, reused (after `reuse` on its stale words) when the free list has
    /// one of that size, else newly allocated.
    fn alloc_with(&self, bytes: usize, reuse: impl FnOnce(&mut [u32])) -> Arc<Block> {
        debug_assert!(bytes.is_multiple_of(4));
        let words = bytes / 4;
        let reused = {
            let mut free = self.inner.free.lock().unwrap_or_else(|e| e.into_inner());
            free.get_mut(&words).and_then(Vec::pop)
        };
        let data = match reused {
            Some(mut data) => {
                reuse(&mut data);
                data
            }
            None => vec![0u32; words].into_boxed_slice(),
        };
        self.inner.live_blocks.fetch_add(1, Ordering::Relaxed);
        self.inner
            .live_bytes
            .fetch_add(std::mem::size_of_val(&*data), Ordering::Relaxed);
        Arc::new(Block {
            data,
            pool: self.inner.clone(),
        })
    }

    /// Live and free blocks right now.
    pub fn stats(&self) -> PoolStats {
        let free = self.inner.free.lock().unwrap_or_else(|e| e.into_inner());
        let (free_blocks, free_bytes) = free
            .values()
            .flatten()
            .fold((0, 0), |(n, b), d| (n + 1, b + std::mem::size_of_val(&**d)));
        PoolStats {
            live_blocks: self.inner.live_blocks.load(Ordering::Relaxed),
            live_bytes: self.inner.live_bytes.load(Ordering::Relaxed),
            free_blocks,
            free_bytes,
        }
    }

    /// Frees every block on the free list; returns the bytes released.
    pub fn trim(&self) -> usize {
        let mut free = self.inner.free.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = free
            .values()
            .flatten()
            .map(|d| std::mem::size_of_val(&**d))
            .sum();
        free.clear();
        bytes
    }

    /// Whether `self` and `other` are handles to the same pool.
    pub fn same_pool(&self, other: &BlockPool) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// Two handles are equal when they share one pool.
impl PartialEq for BlockPool {
    fn eq(&self, other: &Self) -> bool {
        self.same_pool(other)
    }
}

impl Eq for BlockPool {}

impl fmt::Debug for BlockPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockPool")
            .field("pool", &Arc::as_ptr(&self.inner))
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_blocks_are_reused_and_trimmed() {
        let pool = BlockPool::new();
        let a = pool.alloc(32);
        let addr = a.data.as_ptr();
        assert_eq!(pool.stats().live_blocks, 1);
        assert_eq!(pool.stats().live_bytes, 32);
        drop(a);
        assert_eq!(
            pool.stats(),
            PoolStats {
                live_blocks: 0,
                live_bytes: 0,
                free_blocks: 1,
                free_bytes: 32
            }
        );
        let mut b = pool.alloc(32);
        assert_eq!(b.data.as_ptr(), addr, "the freed buffer is reused");
        Arc::get_mut(&mut b).unwrap().kv_mut::<f32>().0.fill(3.0);
        drop(b);
        let b = pool.alloc_zeroed(32);
        assert_eq!(b.data.as_ptr(), addr, "reused again");
        assert_eq!(b.k::<f32>(), [0.0; 4], "and cleared");
        assert_eq!(b.v::<crate::f16>().len(), 8, "halves: twice as many values");
        let c = pool.alloc(16);
        assert_eq!(pool.stats().live_bytes, 48);
        drop((b, c));
        assert_eq!(pool.trim(), 48);
        assert_eq!(pool.stats(), PoolStats::default());
    }

    #[test]
    fn pool_is_shared_across_threads() {
        let pool = BlockPool::new();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        drop(pool.alloc(64));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let s = pool.stats();
        assert_eq!(s.live_blocks, 0);
        assert!(s.free_blocks >= 1 && s.free_blocks <= 4);
    }
}
