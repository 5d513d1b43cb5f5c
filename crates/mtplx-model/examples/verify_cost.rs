//! Time of one forward pass of n rows (a decode step is n = 1, a verify block k + 1) after a
//! 200-token prompt, on the default model's native weights: what speculation pays per step.
//!
//!     cargo run --release -p mtplx-model --example verify_cost
//!
//! `MTPLX_DEVICE=cuda` (with `--features cuda`) times the CUDA backend instead; the MTP
//! head's draft step stays on the CPU.
use std::time::Instant;

use mtplx_kv::CacheFactory;
use mtplx_model::mtp::MtpRunner;
use mtplx_model::store::{ModelStore, DEFAULT_MODEL};
use mtplx_model::{Bundle, ForwardOutput, LanguageModel, Want, WeightFormat};

fn main() {
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| ModelStore::from_env().path_of(&DEFAULT_MODEL));
    let b = Bundle::load(&path, WeightFormat::Native).expect("model");
    let cuda = std::env::var("MTPLX_DEVICE").is_ok_and(|d| d == "cuda");
    #[cfg(feature = "cuda")]
    let gpu = cuda.then(|| {
        let dev = mtplx_model::cuda::CudaDevice::open(0).expect("MTPLX_DEVICE=cuda: a device");
        println!("{dev:?}");
        mtplx_model::cuda::CudaModel::from_model(
            &mtplx_model::Model::load(&b.path, mtplx_model::WeightFormat::Native)
                .expect("the dense model"),
            dev,
        )
        .expect("upload the model")
    });
    #[cfg(feature = "cuda")]
    let (m, factory): (&dyn LanguageModel, CacheFactory) = match &gpu {
        Some(g) => (g, g.cache_factory()),
        None => (&*b.model, CacheFactory::contiguous()),
    };
    #[cfg(not(feature = "cuda"))]
    let (m, factory): (&dyn LanguageModel, CacheFactory) = {
        assert!(!cuda, "MTPLX_DEVICE=cuda needs --features cuda");
        (&*b.model, CacheFactory::contiguous())
    };
    let prompt: Vec<u32> = (0..200u32).map(|i| 100 + i * 7).collect();
    let mut out = ForwardOutput::default();
    for want in [Want::All, Want::Last] {
        let mut base = f64::NAN;
        for n in 1..=6usize {
            let mut cache = m.new_sequence(&factory);
            m.forward(&prompt, &mut cache, Want::Nothing).unwrap();
            let toks: Vec<u32> = (0..n as u32).map(|i| 300 + i).collect();
            let reps = 60;
            let mut times = Vec::with_capacity(reps);
            for _ in 0..reps {
                let t = Instant::now();
                m.forward_into(&toks, &mut cache, want, &mut out).unwrap();
                times.push(t.elapsed().as_secs_f64());
                cache.rewind(prompt.len()).unwrap();
            }
            times.sort_by(f64::total_cmp);
            let (best, median) = (times[0], times[reps / 2]);
            if n == 1 {
                base = median;
            }
            println!(
                "{want:?} n={n}: median {:.3} ms ({:.2}x one row), best {:.3} ms",
                median * 1e3,
                median / base,
                best * 1e3
            );
        }
    }
    // Plain greedy decoding, 64 steps after the prompt: what a token costs in a loop.
    {
        let mut cache = m.new_sequence(&factory);
        let mut g = mtplx_model::Generator::new(
            m,
            &mut cache,
            &prompt,
            mtplx_model::sampling::Sampler::greedy(),
            512,
        )
        .unwrap();
        let t = Instant::now();
        for _ in 0..64 {
            g.step().unwrap();
        }
        println!(
            "plain decoding: {:.3} ms a token",
            t.elapsed().as_secs_f64() * 1e3 / 64.0
        );
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
    let mut cache = m.new_sequence(&factory);
    let rows = m.forward(&prompt, &mut cache, Want::Hidden).unwrap();
    let h = head.hidden_size();
    let n = prompt.len() - 1;
    // One draft step of `runner` with its cache from `caches`: the median of 60.
    let time = |runner: &dyn MtpRunner, caches: &CacheFactory| {
        let mut hc = caches.new_cache(runner.kv_shape());
        runner
            .last_row(m, &rows.hidden[..n * h], &prompt[1..], hc.as_mut(), 0)
            .unwrap();
        let mut times = Vec::with_capacity(60);
        for _ in 0..60 {
            let t = Instant::now();
            runner
                .last_row(m, &rows.hidden[n * h..], &[7], hc.as_mut(), n)
                .unwrap();
            times.push(t.elapsed().as_secs_f64());
            hc.truncate(n);
        }
        times.sort_by(f64::total_cmp);
        times[30] * 1e3
    };
    println!(
        "MTP draft step, head on the CPU: median {:.3} ms",
        time(&head, &CacheFactory::contiguous())
    );
    #[cfg(feature = "cuda")]
    if let Some(g) = &gpu {
        let on_gpu = mtplx_model::cuda::CudaMtpHead::new(&head, g).expect("upload the head");
        println!(
            "MTP draft step, head on the GPU: median {:.3} ms",
            time(&on_gpu, &g.cache_factory())
        );
    }
}
