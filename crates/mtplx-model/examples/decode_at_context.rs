//! A diagnostic: in-process decode speed after a prompt of each length (`MTPLX_TEST_MODEL`,
//! default model otherwise), to set beside the same lengths through the server
//! (`tools/bench/peer_server.py`). K/V in `$MTPLX_KV_DTYPE` (f16 by default, as the server),
//! weights as `$MTPLX_WEIGHTS` says (`native` by default);
//! `$MTPLX_DECODE_STEPS` steps (32), more to profile the decode alone.
//!
//!     cargo run --release -p mtplx-model --example decode_at_context -- 500 2000 6500

use std::time::Instant;

use mtplx_kv::{CacheFactory, KvDtype};
use mtplx_model::store::{ModelStore, DEFAULT_MODEL};
use mtplx_model::{prefill, Bundle, Want, WeightFormat};

fn main() {
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| ModelStore::from_env().path_of(&DEFAULT_MODEL));
    // The server's `MTPLX_WEIGHTS` (`native`, `native-q8`, ...); `native` otherwise.
    let format = std::env::var("MTPLX_WEIGHTS").map_or(WeightFormat::Native, |w| {
        WeightFormat::parse(&w).expect("MTPLX_WEIGHTS: native, native-q8, f32 or quantized")
    });
    let b = Bundle::load(&path, format).expect("model");
    let m = b.model.as_ref();
    let vocab = m.dims().vocab_size as u32;
    let dtype: KvDtype = std::env::var("MTPLX_KV_DTYPE")
        .unwrap_or_else(|_| "f16".into())
        .parse()
        .expect("MTPLX_KV_DTYPE: f32, f16 or bf16");
    let factory = CacheFactory::paged()
        .with_dtype(dtype)
        .expect("a host layout");
    for arg in std::env::args().skip(1) {
        let ctx: usize = arg.parse().expect("a context length");
        let prompt: Vec<u32> = (0..ctx as u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let mut seq = m.new_sequence(&factory);
        let t = Instant::now();
        let out = prefill(m, &prompt, &mut seq, 512).expect("prefill");
        let pre = t.elapsed().as_secs_f64();
        let mut next = mtplx_model::sampling::argmax(out.last_logits()) as u32;
        let steps: usize = std::env::var("MTPLX_DECODE_STEPS")
            .map_or(32, |s| s.parse().expect("MTPLX_DECODE_STEPS: a count"));
        let t = Instant::now();
        for _ in 0..steps {
            let o = m.forward(&[next], &mut seq, Want::Last).expect("decode");
            next = mtplx_model::sampling::argmax(o.last_logits()) as u32;
        }
        let dec = t.elapsed().as_secs_f64();
        println!(
            "ctx {ctx}: prefill {:.1} tok/s, decode {:.1} tok/s ({:.1} ms/step)",
            ctx as f64 / pre,
            steps as f64 / dec,
            1e3 * dec / steps as f64
        );
    }
}
