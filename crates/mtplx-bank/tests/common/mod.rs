//! Shared helpers for the scenario tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mtplx_bank::{
    BankConfig, Checkpoint, Commit, Continuation, Identity, LookupQuery, Matching, SessionId,
};
use mtplx_cold::{
    ColdCandidate, ColdConfig, ColdIndex, ColdLookup, ColdQuery, ColdStore, KvSink, Mtp, ReadError,
    RestoreReport, SpillEntry, SpillTicket, WriteError, GIB,
};
use mtplx_kv::{
    CacheFactory, KvCache, KvShape, KvView, RecurrentLayerShape, RecurrentState, StateShape,
};

pub const SHAPE: KvShape = KvShape {
    layers: 2,
    kv_heads: 1,
    head_dim: 4,
};

pub fn identity() -> Identity {
    Identity {
        model: "tiny-llama".into(),
        chat_template: "tmpl".into(),
        mtp: Mtp::Off,
        policy: "default".into(),
        kv_dtype: mtplx_bank::cold_dtype(mtplx_kv::KvDtype::F32),
    }
}

/// Budgets nothing in a scenario reaches unless it sets them.
pub fn roomy() -> BankConfig {
    BankConfig {
        max_bytes: 1 << 40,
        max_session_bytes: 1 << 40,
        max_entries: 1000,
        max_entries_per_session: 1000,
        idle_ttl: Duration::from_secs(1 << 30),
        idle_write: None,
        active_window: Duration::from_secs(600),
        memory_limit_bytes: 1 << 40,
        matching: Matching::default(),
    }
}

/// `n` tokens, distinct per `salt`.
pub fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| salt * 100_000 + i).collect()
}

/// The value of row element `i` of `layer` at `position` holding `token` (K, or V when
/// `v`): equal prefixes have equal rows.
pub fn value(layer: usize, position: usize, token: u32, i: usize, v: bool) -> f32 {
    (token % 9973) as f32 * 0.5
        + position as f32 * 0.001
        + layer as f32 * 7.0
        + i as f32 * 0.1
        + if v { 0.25 } else { 0.0 }
}

/// A cache in `factory`'s layout holding rows for `tokens`.
pub fn cache_for(factory: &CacheFactory, tokens: &[u32]) -> Box<dyn KvCache> {
    let mut cache = factory.new_cache(SHAPE);
    let row = SHAPE.row_len();
    for layer in 0..SHAPE.layers {
        let mut k = Vec::with_capacity(tokens.len() * row);
        let mut v = Vec::with_capacity(tokens.len() * row);
        for (p, &t) in tokens.iter().enumerate() {
            for i in 0..row {
                k.push(value(layer, p, t, i, false));
                v.push(value(layer, p, t, i, true));
            }
        }
        cache.append(layer, &k, &v).unwrap();
    }
    cache
}

pub fn view(tokens: &[u32]) -> Arc<dyn KvView> {
    cache_for(&CacheFactory::contiguous(), tokens).snapshot()
}

pub fn continuation(n: usize) -> Continuation {
    Continuation {
        logits: vec![n as f32, 1.0, 2.0],
        hidden: vec![0.5; 4],
        mtp: Some(vec![n as u8, 7]),
    }
}

pub fn commit(session: &str, tokens: &[u32]) -> Commit {
    Commit {
        session: SessionId::new(session),
        identity: identity(),
        tokens: tokens.to_vec(),
        kv: view(tokens),
        continuation: Some(continuation(tokens.len())),
        checkpoints: None,
    }
}

/// A recurrent snapshot after `position` tokens (values depend on the position).
/// An attention-only model's state: [`SHAPE`]'s K/V.
pub fn dense() -> StateShape {
    StateShape::attention_only(SHAPE)
}

/// A hybrid model's state: [`SHAPE`]'s K/V and one recurrent layer ([`recurrent_at`]'s).
pub fn hybrid() -> StateShape {
    StateShape {
        kv: SHAPE,
        recurrent: vec![RecurrentLayerShape {
            conv: vec![2, 2],
            ssm: vec![3],
        }],
    }
}

pub fn recurrent_at(position: usize) -> RecurrentState {
    let mut s = RecurrentState::new(&hybrid().recurrent);
    let (c, m) = s.state_mut(0).unwrap();
    c.iter_mut().for_each(|x| *x = position as f32);
    m.iter_mut().for_each(|x| *x = -(position as f32));
    s.advance(position);
    s
}

pub fn hybrid_commit(session: &str, tokens: &[u32], checkpoints: &[usize]) -> Commit {
    Commit {
        checkpoints: Some(
            checkpoints
                .iter()
                .map(|&p| Checkpoint {
                    position: p,
                    state: recurrent_at(p).snapshot(),
                })
                .collect(),
        ),
        ..commit(session, tokens)
    }
}

pub fn query<'a>(identity: &'a Identity, prompt: &'a [u32]) -> LookupQuery<'a> {
    LookupQuery {
        identity,
        prompt,
        session: None,
        floor: 0,
    }
}

/// Asserts `cache` holds exactly the rows of `prompt[..len]`.
pub fn assert_rows(cache: &dyn KvView, prompt: &[u32], len: usize) {
    assert_eq!(cache.len(), len);
    let expected = cache_for(&CacheFactory::contiguous(), &prompt[..len]);
    let row = SHAPE.row_len();
    for layer in 0..SHAPE.layers {
        let (mut k, mut v) = (vec![0.0; len * row], vec![0.0; len * row]);
        let (mut ek, mut ev) = (vec![0.0; len * row], vec![0.0; len * row]);
        cache.read_rows(layer, 0..len, &mut k, &mut v).unwrap();
        expected.read_rows(layer, 0..len, &mut ek, &mut ev).unwrap();
        assert!(
            k == ek && v == ev,
            "layer {layer}: rows differ from the prompt's"
        );
    }
}

pub fn cold_config() -> ColdConfig {
    ColdConfig {
        cap_bytes: 100 * GIB,
        free_disk_floor: 0,
        backlog_cap_bytes: GIB,
        ..ColdConfig::for_ram(128 * GIB)
    }
}

pub fn cold_store(dir: &Path) -> Arc<ColdStore> {
    Arc::new(ColdStore::open_dir(dir, cold_config()).expect("open cold store"))
}

/// A cold tier that counts its restores (reads of blobs).
pub struct Counting {
    pub inner: Arc<ColdStore>,
    pub restores: AtomicUsize,
}

impl Counting {
    pub fn new(inner: Arc<ColdStore>) -> Arc<Counting> {
        Arc::new(Counting {
            inner,
            restores: AtomicUsize::new(0),
        })
    }

    pub fn restores(&self) -> usize {
        self.restores.load(Ordering::SeqCst)
    }
}

impl ColdIndex for Counting {
    fn lookup(&self, query: &ColdQuery<'_>) -> ColdLookup {
        self.inner.lookup(query)
    }

    fn restore(
        &self,
        candidate: &ColdCandidate,
        sink: &mut dyn KvSink,
    ) -> Result<RestoreReport, ReadError> {
        self.restores.fetch_add(1, Ordering::SeqCst);
        self.inner.restore(candidate, sink)
    }

    fn spill(&self, entry: SpillEntry) -> Result<SpillTicket, WriteError> {
        self.inner.spill(entry)
    }
}

/// A cold store over a fault-injecting in-memory file system (the storage is returned to
/// stall, fail or shrink it).
pub fn faulty_cold() -> (Arc<ColdStore>, mtplx_cold::storage::FaultyStorage) {
    let storage = mtplx_cold::storage::FaultyStorage::new();
    let store = ColdStore::open(Arc::new(storage.clone()), cold_config()).expect("open cold store");
    (Arc::new(store), storage)
}

/// Records every event the bank reports.
pub fn recorder() -> (
    mtplx_bank::Observer,
    Arc<std::sync::Mutex<Vec<mtplx_bank::BankEvent>>>,
) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    (
        Arc::new(move |e: &mtplx_bank::BankEvent| s.lock().unwrap().push(e.clone())),
        seen,
    )
}

/// `a` followed by `b`.
pub fn joined(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter().chain(b).copied().collect()
}
