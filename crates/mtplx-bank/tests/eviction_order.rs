//! Eviction order and budgets: superseded entries first, then least recently used with idle
//! sessions before active ones; TTL, newest-N and per-session bytes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use mtplx_bank::{Bank, BankConfig, LookupQuery, ManualClock, MissReason, SessionId};

fn bank(config: BankConfig) -> (Bank, ManualClock) {
    let clock = ManualClock::new();
    (Bank::new(config).with_clock(Arc::new(clock.clone())), clock)
}

#[test]
fn an_entry_superseded_by_a_longer_one_of_its_session_goes_first() {
    let (bank, clock) = bank(BankConfig {
        max_entries: 3,
        ..roomy()
    });
    let t = tokens(200, 1);
    let b = tokens(100, 2);
    bank.commit(commit("b", &b)).unwrap();
    clock.advance(Duration::from_secs(1));
    bank.commit(commit("a", &t[..100])).unwrap();
    clock.advance(Duration::from_secs(1));
    bank.commit(commit("a", &t)).unwrap();
    clock.advance(Duration::from_secs(1));
    bank.commit(commit("c", &tokens(50, 3))).unwrap();
    let id = identity();
    assert!(
        !bank.contains(&id, &t[..100]),
        "the superseded turn is evicted"
    );
    assert!(bank.contains(&id, &b), "the least recently used one stays");
    assert!(bank.contains(&id, &t));
}

#[test]
fn idle_sessions_are_evicted_before_active_ones() {
    let (bank, clock) = bank(BankConfig {
        max_entries: 2,
        active_window: Duration::from_secs(600),
        ..roomy()
    });
    let x = tokens(100, 1);
    let y = tokens(100, 2);
    bank.commit(commit("x", &x)).unwrap();
    clock.advance(Duration::from_secs(100));
    bank.commit(commit("y", &y)).unwrap();
    clock.advance(Duration::from_secs(600));
    // Session x sends a request (its entry is older than y's, but x is now active).
    let id = identity();
    let sx = SessionId::new("x");
    let unrelated = tokens(10, 9);
    let _ = bank.lookup(&LookupQuery {
        session: Some(&sx),
        ..query(&id, &unrelated)
    });
    clock.advance(Duration::from_secs(10));
    bank.commit(commit("z", &tokens(100, 3))).unwrap();
    assert!(bank.contains(&id, &x), "active session kept");
    assert!(!bank.contains(&id, &y), "idle session evicted");
}

#[test]
fn idle_ttl_expires_entries_and_names_the_miss_evicted() {
    let (bank, clock) = bank(BankConfig {
        idle_ttl: Duration::from_secs(3600),
        ..roomy()
    });
    let t = tokens(100, 1);
    bank.commit(commit("a", &t)).unwrap();
    clock.advance(Duration::from_secs(3600));
    assert_eq!(bank.expire(), 0, "exactly the TTL is not past it");
    clock.advance(Duration::from_secs(1));
    assert_eq!(bank.expire(), 1);
    assert!(!bank.contains(&identity(), &t));
    let id = identity();
    let sa = SessionId::new("a");
    let mut prompt = t.clone();
    prompt.push(1);
    let plan = bank.lookup(&LookupQuery {
        session: Some(&sa),
        ..query(&id, &prompt)
    });
    assert_eq!(plan.explanation().miss, Some(MissReason::Evicted));
    assert_eq!(bank.stats().evictions.get("ttl"), Some(&1));
}

#[test]
fn a_session_keeps_its_newest_entries_only() {
    let (bank, clock) = bank(BankConfig {
        max_entries_per_session: 2,
        ..roomy()
    });
    let seqs: Vec<Vec<u32>> = (0..3).map(|s| tokens(50, s + 1)).collect();
    for s in &seqs {
        bank.commit(commit("a", s)).unwrap();
        clock.advance(Duration::from_secs(1));
    }
    bank.commit(commit("b", &tokens(50, 7))).unwrap();
    let id = identity();
    assert!(!bank.contains(&id, &seqs[0]));
    assert!(bank.contains(&id, &seqs[1]) && bank.contains(&id, &seqs[2]));
    let sessions = bank.sessions();
    let a = sessions.iter().find(|s| s.id.as_str() == "a").unwrap();
    assert_eq!(a.entries, 2);
}

#[test]
fn a_session_over_its_byte_budget_loses_its_own_entries_not_others() {
    let probe = Bank::new(roomy());
    probe.commit(commit("p", &tokens(300, 1))).unwrap();
    let one = probe.bytes();
    let (bank, clock) = bank(BankConfig {
        max_session_bytes: one * 5 / 2,
        ..roomy()
    });
    let other = tokens(300, 9);
    bank.commit(commit("b", &other)).unwrap();
    let seqs: Vec<Vec<u32>> = (0..3).map(|s| tokens(300, s + 1)).collect();
    for s in &seqs {
        clock.advance(Duration::from_secs(1));
        bank.commit(commit("a", s)).unwrap();
    }
    let id = identity();
    assert!(!bank.contains(&id, &seqs[0]), "oldest of a goes");
    assert!(bank.contains(&id, &other), "b is within its own budget");
    let a = bank
        .sessions()
        .into_iter()
        .find(|s| s.id.as_str() == "a")
        .unwrap();
    assert!(a.bytes <= one * 5 / 2);
    assert_eq!(bank.stats().evictions.get("session_bytes"), Some(&1));
}

#[test]
fn clearing_forgets_without_spilling() {
    let bank = Bank::new(roomy());
    bank.commit(commit("a", &tokens(10, 1))).unwrap();
    bank.commit(commit("b", &tokens(10, 2))).unwrap();
    assert_eq!(bank.clear_session(&SessionId::new("a")), 1);
    assert_eq!(bank.sessions().len(), 1);
    assert_eq!(bank.clear(), 1);
    assert_eq!((bank.bytes(), bank.stats().entries), (0, 0));
}
