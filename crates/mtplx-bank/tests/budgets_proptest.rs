//! Random commit / lookup / restore / clock sequences: budgets always hold, reported bytes
//! match what the states hold, the candidate restoring the most prompt tokens always wins,
//! it is always a prefix of the prompt under the same identity, and no unserved candidate
//! outlives the lookup.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use mtplx_bank::{Bank, BankConfig, Identity, LookupQuery, ManualClock, Matching};
use mtplx_kv::{CacheFactory, KvView};
use proptest::prelude::*;

const M: Matching = Matching {
    near_max_extension: 8,
    near_min_match: 8,
    block_tokens: 16,
    block_min_match: 32,
};

#[derive(Debug, Clone)]
struct Seq {
    base: u32,
    len: usize,
    /// Replace tokens from this position on with another run.
    branch: Option<(usize, u32)>,
}

impl Seq {
    fn tokens(&self) -> Vec<u32> {
        let mut t = tokens(self.len, self.base);
        if let Some((at, salt)) = self.branch {
            for (i, x) in t.iter_mut().enumerate().skip(at) {
                *x = 900_000 + salt * 1000 + i as u32;
            }
        }
        t
    }
}

#[derive(Debug, Clone)]
enum Op {
    Commit {
        session: u8,
        seq: Seq,
        continuation: bool,
        other_identity: bool,
    },
    Lookup(Seq),
    Advance(u64),
}

fn seq() -> impl Strategy<Value = Seq> {
    (
        0u32..2,
        1usize..120,
        prop::option::of((0usize..120, 0u32..3)),
    )
        .prop_map(|(base, len, branch)| Seq { base, len, branch })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, seq(), any::<bool>(), prop::bool::weighted(0.2)).prop_map(
            |(session, seq, continuation, other_identity)| Op::Commit {
                session,
                seq,
                continuation,
                other_identity
            }
        ),
        4 => seq().prop_map(Op::Lookup),
        1 => (0u64..2000).prop_map(Op::Advance),
    ]
}

fn other() -> Identity {
    Identity {
        model: "other".into(),
        ..identity()
    }
}

/// The restore point the bank must find for `entry` (independent of the crate's code).
fn oracle(entry: &[u32], continuation: bool, prompt: &[u32]) -> usize {
    let lcp = entry.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    let (el, pl) = (entry.len(), prompt.len());
    if lcp == el && el <= pl {
        return if el < pl || continuation { el } else { el - 1 };
    }
    if lcp == pl && el - pl <= M.near_max_extension && pl >= M.near_min_match {
        return pl - 1;
    }
    let cut = lcp / M.block_tokens * M.block_tokens;
    if cut >= M.block_min_match {
        return if cut < pl { cut } else { cut - 1 };
    }
    0
}

struct Held {
    view: Arc<dyn KvView>,
    tokens: Vec<u32>,
    continuation: bool,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn budgets_hold_and_the_longest_coverage_wins(
        ops in prop::collection::vec(op(), 1..40),
        max_entries in 1usize..6,
        per_session in 1usize..4,
        max_kib in 8u64..120,
        session_kib in 8u64..80,
    ) {
        let config = BankConfig {
            max_bytes: max_kib << 10,
            max_session_bytes: session_kib << 10,
            max_entries,
            max_entries_per_session: per_session,
            idle_ttl: Duration::from_secs(3000),
            idle_write: None,
            active_window: Duration::from_secs(600),
            memory_limit_bytes: 1 << 40,
            matching: M,
        };
        let clock = ManualClock::new();
        let bank = Bank::new(config.clone()).with_clock(Arc::new(clock.clone()));
        // Latest commit per (identity, tokens).
        let mut held: HashMap<(bool, Vec<u32>), Held> = HashMap::new();
        let id = identity();
        let oth = other();
        for op in ops {
            match op {
                Op::Commit { session, seq, continuation, other_identity } => {
                    let t = seq.tokens();
                    let mut c = commit(&format!("s{session}"), &t);
                    if other_identity {
                        c.identity = other();
                        // Other rows: serving them for `identity()` would fail the row check.
                        let shifted: Vec<u32> = t.iter().map(|x| x + 1).collect();
                        c.kv = view(&shifted);
                    }
                    if !continuation {
                        c.continuation = None;
                    }
                    let v = c.kv.clone();
                    bank.commit(c).unwrap();
                    held.insert((other_identity, t.clone()), Held { view: v, tokens: t, continuation });
                }
                Op::Lookup(seq) => {
                    let prompt = seq.tokens();
                    // Apply the TTL first, as the lookup does, so `contains` agrees with it.
                    bank.expire();
                    let want = held
                        .iter()
                        .filter(|((o, t), _)| !o && bank.contains(&id, t))
                        .map(|(_, h)| oracle(&h.tokens, h.continuation, &prompt))
                        .max()
                        .unwrap_or(0);
                    let plan = bank.lookup(&LookupQuery { identity: &id, prompt: &prompt, session: None, floor: 0 });
                    prop_assert_eq!(plan.cached_tokens(), want, "{:?}", plan.explanation());
                    let watch = plan.watch();
                    prop_assert!(watch.alive() <= 1);
                    let r = plan.restore(&CacheFactory::contiguous(), &dense()).unwrap();
                    prop_assert_eq!(watch.alive(), 0);
                    assert_rows(r.sequence.kv(), &prompt, want);
                    prop_assert_eq!(r.continuation.is_some(), want == prompt.len());
                }
                Op::Advance(s) => clock.advance(Duration::from_secs(s)),
            }

            // Budgets.
            let stats = bank.stats();
            prop_assert!(stats.bytes <= config.max_bytes);
            prop_assert!(stats.entries <= config.max_entries);
            for s in bank.sessions() {
                prop_assert!(s.entries <= config.max_entries_per_session);
                prop_assert!(s.bytes <= config.max_session_bytes);
            }
            // Byte accounting: what the held states hold, nothing more.
            let live: Vec<&Held> = held
                .iter()
                .filter(|((o, t), _)| bank.contains(if *o { &oth } else { &id }, t))
                .map(|(_, h)| h)
                .collect();
            prop_assert_eq!(live.len(), stats.entries);
            let expect: usize = live
                .iter()
                .map(|h| {
                    h.view.physical_bytes()
                        + 4 * h.tokens.len()
                        + if h.continuation { continuation(h.tokens.len()).bytes() } else { 0 }
                })
                .sum();
            prop_assert_eq!(stats.bytes, expect as u64);
            let by_session: usize = bank.sessions().iter().map(|s| s.bytes as usize).sum();
            prop_assert_eq!(by_session, expect);
        }
    }
}
