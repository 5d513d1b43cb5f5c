//! Every lookup explains itself: restore modes, the whole-prompt rule, and one reason per
//! miss.

mod common;

use common::*;
use mtplx_bank::{Bank, LogValue, MissReason, RestoreMode};
use mtplx_kv::CacheFactory;

#[test]
fn misses_name_a_new_session_or_where_the_history_diverged() {
    let bank = Bank::new(roomy());
    let id = identity();
    let prompt = tokens(100, 1);
    let plan = bank.lookup(&query(&id, &prompt));
    assert_eq!(plan.explanation().miss, Some(MissReason::NewSession));
    assert_eq!(
        plan.explanation().ssd.map(|m| m.to_string()),
        Some("ssd_cache_off".into())
    );

    let mut edited = prompt.clone();
    edited[40] = 7;
    bank.commit(commit("a", &edited)).unwrap();
    let plan = bank.lookup(&query(&id, &prompt));
    assert_eq!(
        plan.explanation().miss,
        Some(MissReason::PrefixDivergenceAtToken(40))
    );
    let fields = plan.explanation().log_fields();
    assert!(fields.contains(&("prefix_divergence_token", LogValue::Num(40))));
    plan.restore(&CacheFactory::contiguous(), &dense()).unwrap();
    let stats = bank.stats();
    assert_eq!(stats.misses.get("prefix_divergence_at_token"), Some(&1));
    assert_eq!(stats.restores.get(&RestoreMode::Cold), Some(&1));
}

#[test]
fn a_stored_entry_a_few_tokens_past_the_prompt_is_a_near_prefix() {
    let bank = Bank::new(roomy());
    let t = tokens(108, 1);
    bank.commit(commit("a", &t)).unwrap();
    let id = identity();
    let prompt = &t[..100];
    let plan = bank.lookup(&query(&id, prompt));
    assert_eq!(plan.mode(), RestoreMode::NearPrefixClone);
    // The last prompt token is left to prefill: the entry's continuation is for token 108.
    assert_eq!(plan.cached_tokens(), 99);
    let r = plan.restore(&CacheFactory::contiguous(), &dense()).unwrap();
    assert_rows(r.sequence.kv(), prompt, 99);
    assert!(r.continuation.is_none());
}

#[test]
fn a_whole_prompt_restore_hands_back_the_continuation_or_stops_one_short() {
    let bank = Bank::new(roomy());
    let t = tokens(100, 1);
    bank.commit(commit("a", &t)).unwrap();
    let id = identity();
    let r = bank
        .lookup(&query(&id, &t))
        .restore(&CacheFactory::contiguous(), &dense())
        .unwrap();
    assert_eq!(r.prefix_len(), 100);
    assert_eq!(r.continuation, Some(continuation(100)));
    assert!(r.explanation.continuation);

    let u = tokens(100, 2);
    let mut bare = commit("b", &u);
    bare.continuation = None;
    bank.commit(bare).unwrap();
    let r = bank
        .lookup(&query(&id, &u))
        .restore(&CacheFactory::contiguous(), &dense())
        .unwrap();
    assert_eq!(
        r.prefix_len(),
        99,
        "one token left to prefill for the logits"
    );
    assert!(r.continuation.is_none());
}

#[test]
fn a_whole_prompt_ssd_restore_returns_the_stored_continuation() {
    let dir = tempfile::tempdir().unwrap();
    let bank = Bank::new(mtplx_bank::BankConfig {
        max_entries: 1,
        ..roomy()
    })
    .with_cold(cold_store(dir.path()));
    let t = tokens(300, 1);
    bank.commit(commit("a", &t)).unwrap();
    bank.commit(commit("b", &tokens(3, 2))).unwrap();
    bank.wait_for_spills();
    let id = identity();
    let r = bank
        .lookup(&query(&id, &t))
        .restore(&CacheFactory::contiguous(), &dense())
        .unwrap();
    assert_eq!(r.explanation.mode, RestoreMode::SsdClone);
    assert_eq!(r.prefix_len(), 300);
    assert_eq!(r.continuation, Some(continuation(300)));
}

#[test]
fn commits_are_validated() {
    let bank = Bank::new(roomy());
    let mut c = commit("a", &tokens(10, 1));
    c.tokens.push(5);
    assert_eq!(
        bank.commit(c).unwrap_err(),
        mtplx_bank::BankError::LengthMismatch { tokens: 11, kv: 10 }
    );
    let bad = hybrid_commit("a", &tokens(10, 1), &[5, 3]);
    assert!(matches!(
        bank.commit(bad),
        Err(mtplx_bank::BankError::BadCheckpoints { position: 3, .. })
    ));
}
