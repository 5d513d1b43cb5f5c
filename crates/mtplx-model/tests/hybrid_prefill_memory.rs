//! A hybrid prefill's memory does not grow with the prompt beyond the attention layers'
//! K/V: the recurrent state is carried from chunk to chunk (never one per token) and
//! attention streams keys in blocks (never a queries × keys score matrix). Measured with a
//! global allocator that tracks the peak of live bytes (this file's own binary).

use mtplx_kv::Sequence;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use mtplx_kv::CacheFactory;
use mtplx_model::hybrid::{HybridConfig, HybridModel, HybridWeights};

struct Peak;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Peak {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(live, Ordering::SeqCst);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Peak = Peak;

/// Peak live bytes above the start while prefilling `n` tokens in chunks of `chunk`, and
/// the bytes the cache's K/V holds after.
fn prefill_peak(
    model: &HybridModel,
    config: &HybridConfig,
    n: usize,
    chunk: usize,
) -> (usize, usize) {
    let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 3) % 256).collect();
    let mut cache = Sequence::new(&CacheFactory::paged(), &config.state_shape());
    let start = LIVE.load(Ordering::SeqCst);
    PEAK.store(start, Ordering::SeqCst);
    mtplx_model::prefill(model, &tokens, &mut cache, chunk).unwrap();
    let peak = PEAK.load(Ordering::SeqCst) - start;
    let s = config.kv_shape();
    let kv = n * s.layers * 2 * s.kv_heads * s.head_dim * std::mem::size_of::<f32>();
    drop(cache);
    (peak, kv)
}

#[test]
fn a_longer_prompt_costs_only_its_attention_kv() {
    let config = HybridConfig::tiny();
    let model = HybridModel::new(config.clone(), &HybridWeights::random(&config, 2)).unwrap();
    // Warm up the thread pool and the kernels' buffers.
    prefill_peak(&model, &config, 64, 64);
    let chunk = 256;
    let (short_peak, short_kv) = prefill_peak(&model, &config, 512, chunk);
    let (long_peak, long_kv) = prefill_peak(&model, &config, 4096, chunk);
    let growth = long_peak as i64 - short_peak as i64;
    let kv_growth = (long_kv - short_kv) as i64;
    // One recurrent state per token would be ~34 KB a token here (3.5K tokens: ~120 MB);
    // a score matrix for a chunk over the whole prompt 16 MB.
    let per_token_state = {
        let s = &config.recurrent_shapes()[0];
        let floats: usize = s.conv.iter().product::<usize>() + s.ssm.iter().product::<usize>();
        floats * 4 * config.recurrent_shapes().len()
    };
    eprintln!(
        "prefill peak: 512 tokens {short_peak} B (K/V {short_kv}), 4,096 tokens {long_peak} B \
         (K/V {long_kv}); growth {growth} B against K/V growth {kv_growth} B; one recurrent \
         state is {per_token_state} B"
    );
    // The growth is the K/V's, within a margin of a few per-chunk buffers and the paged
    // layout's block table.
    assert!(
        growth <= kv_growth + kv_growth / 4 + 256 * 1024,
        "a prefill of 4,096 tokens peaks {growth} B above one of 512, its K/V only {kv_growth} B"
    );
    assert!(growth >= kv_growth / 2, "the K/V must show ({growth} B)");
}
