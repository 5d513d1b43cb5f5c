//! Speculation with the trunk on the GPU (the CUDA backend): greedy and seeded output
//! equals plain decoding on the GPU token for token, with the device KV's bits identical,
//! for prompt lookup, the shipped MTP head (on the CPU and on the GPU) and lookup then MTP
//! at depths 1-4.
//!
//! Needs an NVIDIA GPU. Without one each test says it was skipped and passes, unless
//! `MTPLX_CUDA_TESTS=1` is set (the device runs set it).
#![cfg(feature = "cuda")]

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use mtplx_kv::{CacheFactory, Sequence};
use mtplx_model::cuda::{CudaDevice, CudaModel, CudaMtpHead};
use mtplx_model::mtp::{MtpHead, MtpRunner, Vocab};
use mtplx_model::sampling::{Penalties, RandomSampling, Sampler, Sampling};
use mtplx_model::{Bundle, Generator, LanguageModel, WeightFormat};
use mtplx_spec::{
    generate, DepthPolicy, DraftSampling, LookupThenMtp, MtpProposer, PromptHidden, PromptLookup,
    Proposer, SpecDecoder,
};

const NEW_TOKENS: usize = 24;

fn gpu(b: &Bundle) -> Option<CudaModel> {
    match CudaDevice::open(0) {
        Ok(dev) => Some(
            CudaModel::from_model(
                &mtplx_model::Model::load(&b.path, mtplx_model::WeightFormat::Native)
                    .expect("the dense model"),
                dev,
            )
            .expect("upload the model"),
        ),
        Err(e) if std::env::var_os("MTPLX_CUDA_TESTS").is_some() => {
            panic!("MTPLX_CUDA_TESTS is set but there is no usable device: {e}")
        }
        Err(e) => {
            eprintln!("skipped, no CUDA device: {e}");
            None
        }
    }
}

fn samplers() -> [(&'static str, Sampler); 2] {
    let seeded = Sampler::new(
        Sampling::Random(RandomSampling {
            temperature: 0.8,
            top_k: 0,
            top_p: 0.95,
            min_p: 0.0,
            seed: 7,
        }),
        Penalties::default(),
    );
    [("greedy", Sampler::greedy()), ("seed 7", seeded)]
}

#[test]
fn speculation_on_the_gpu_gives_plain_tokens_and_kv_bits() {
    let b = Bundle::load(&common::default_path(), WeightFormat::Native).unwrap();
    let Some(gpu) = gpu(&b) else { return };
    let factory = gpu.cache_factory();
    let model: &dyn LanguageModel = &gpu;
    let head_path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/mtp/smollm2-135m-mtp.safetensors");
    let cpu_head = MtpHead::load(&head_path, model, Vocab::FromFile).unwrap();
    let gpu_head: Arc<dyn MtpRunner> = Arc::new(CudaMtpHead::new(&cpu_head, &gpu).unwrap());
    let cpu_head: Arc<dyn MtpRunner> = Arc::new(cpu_head);
    let host_caches = CacheFactory::contiguous();
    // Each head with a cache where it runs.
    let heads = [("cpu", cpu_head, &host_caches), ("gpu", gpu_head, &factory)];
    let shape = model.state_shape();
    let mut accepted = std::collections::BTreeMap::<String, usize>::new();
    for prompt in common::prompts(&b) {
        for (name, sampler) in samplers() {
            let mut cache = Sequence::new(&factory, &shape);
            let mut g = Generator::new(model, &mut cache, &prompt, sampler.clone(), 64).unwrap();
            for _ in 0..NEW_TOKENS {
                g.step().unwrap();
            }
            let want = g.generated().to_vec();
            drop(g);
            let want_kv = common::kv_bits(cache.kv());
            for depth in 1..=4 {
                for (where_, head, head_caches) in &heads {
                    let mut lookup = PromptLookup::default();
                    let mut mtp =
                        MtpProposer::new(model, head.clone(), head_caches, DraftSampling::Greedy);
                    let mut both = LookupThenMtp::new(MtpProposer::new(
                        model,
                        head.clone(),
                        head_caches,
                        DraftSampling::Greedy,
                    ));
                    let proposers: [(&mut dyn Proposer, PromptHidden); 3] = [
                        (&mut lookup, PromptHidden::Last),
                        (&mut mtp, PromptHidden::All),
                        (&mut both, PromptHidden::Last),
                    ];
                    for (p, hidden) in proposers {
                        let what = format!("{name}, {} ({where_} head) depth {depth}", p.name());
                        let mut cache = Sequence::new(&factory, &shape);
                        let mut d = SpecDecoder::with_prompt_hidden(
                            model,
                            &mut cache,
                            &prompt,
                            sampler.clone(),
                            64,
                            hidden,
                        )
                        .unwrap();
                        let mut policy = DepthPolicy::fixed(depth);
                        generate(&mut d, p, &mut policy, NEW_TOKENS, &|_| false).unwrap();
                        let got = d.generated().to_vec();
                        *accepted
                            .entry(format!("{} {where_}", p.name()))
                            .or_default() += d.stats.accepted_by_depth.iter().sum::<u64>() as usize;
                        drop(d);
                        assert_eq!(got, want, "{what}");
                        assert!(
                            common::kv_bits(cache.kv()) == want_kv,
                            "{what}: KV bits differ"
                        );
                    }
                }
            }
        }
    }
    eprintln!("accepted drafts: {accepted:?}");
    for name in ["lookup", "mtp", "lookup+mtp"] {
        for where_ in ["cpu", "gpu"] {
            let key = format!("{name} {where_}");
            assert!(
                accepted.get(&key).copied().unwrap_or(0) > 0,
                "{key} never had a draft accepted: {accepted:?}"
            );
        }
    }
}
