//! Time of one forward pass of n rows (a decode step is n = 1, a verify block k + 1) after a
//! 200-token prompt, on the default model's native weights: what speculation pays per step.
//!
//!     cargo run --release -p mtplx-model --example verify_cost
use std::time::Instant;

use mtplx_kv::CacheFactory;
use mtplx_model::store::{ModelStore, DEFAULT_MODEL};
use mtplx_model::{Bundle, ForwardOutput, LanguageModel, Want, WeightFormat};

fn main() {
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| ModelStore::from_env().path_of(&DEFAULT_MODEL));
    let b = Bundle::load(&path, WeightFormat::Native).expect("model");
    let m = &b.model;
    let prompt: Vec<u32> = (0..200u32).map(|i| 100 + i * 7).collect();
    let mut out = ForwardOutput::default();
    for want in [Want::All, Want::Last] {
        let mut base = f64::NAN;
        for n in 1..=6usize {
            let mut cache = CacheFactory::contiguous().new_cache(m.config().kv_shape());
            m.forward(&prompt, cache.as_mut(), Want::Nothing).unwrap();
            let toks: Vec<u32> = (0..n as u32).map(|i| 300 + i).collect();
            let reps = 60;
            let mut best = f64::MAX;
            for _ in 0..reps {
                let t = Instant::now();
                m.forward_into(&toks, cache.as_mut(), want, &mut out)
                    .unwrap();
                best = best.min(t.elapsed().as_secs_f64());
                cache.truncate(prompt.len());
            }
            if n == 1 {
                base = best;
            }
            println!(
                "{want:?} n={n}: {:.3} ms ({:.2}x one row)",
                best * 1e3,
                best / base
            );
        }
    }
    // One MTP head draft step (its layer over one row, then the shortlist's scores), after
    // it observed the prompt: what each draft token costs.
    let head_path = std::env::var_os("MTPLX_MTP_HEAD").map_or_else(
        || {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/mtp/smollm2-135m-mtp.safetensors")
        },
        std::path::PathBuf::from,
    );
    let head = mtplx_model::mtp::MtpHead::load(&head_path, m, mtplx_model::mtp::Vocab::FromFile)
        .expect("head");
    let mut cache = CacheFactory::contiguous().new_cache(m.config().kv_shape());
    let rows = m.forward(&prompt, cache.as_mut(), Want::Hidden).unwrap();
    let mut hc = CacheFactory::contiguous().new_cache(head.kv_shape());
    let h = head.hidden_size();
    let n = prompt.len() - 1;
    head.forward(m, &rows.hidden[..n * h], &prompt[1..], hc.as_mut(), 0)
        .unwrap();
    let mut best = f64::MAX;
    for _ in 0..60 {
        let t = Instant::now();
        let x = head
            .forward(m, &rows.hidden[n * h..], &[7], hc.as_mut(), n)
            .unwrap();
        let _ = head.logits(&x).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
        hc.truncate(n);
    }
    println!("MTP draft step: {:.3} ms", best * 1e3);
}
