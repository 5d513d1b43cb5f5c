//! Admission sheds bank entries (spilling them) before refusing; a refusal (HTTP 507) names
//! its reason and when to retry, and loses nothing committed.

mod common;

use common::*;
use mtplx_bank::{
    Bank, BankConfig, MemoryEstimate, RefusalKind, RestoreMode, RetryWhen, SessionId,
};

const WEIGHTS: u64 = 1 << 20;

fn estimate(in_flight: u64, kv: u64) -> MemoryEstimate {
    MemoryEstimate {
        weights_bytes: WEIGHTS,
        in_flight_bytes: in_flight,
        kv_bytes: kv,
        activation_bytes: 1000,
    }
}

#[test]
fn sheds_idle_entries_to_ssd_then_admits() {
    let dir = tempfile::tempdir().unwrap();
    let bank = Bank::new(roomy()).with_cold(cold_store(dir.path()));
    let convs: Vec<Vec<u32>> = (0..3).map(|s| tokens(400, s + 1)).collect();
    for (i, t) in convs.iter().enumerate() {
        bank.commit(commit(&format!("s{i}"), t)).unwrap();
    }
    let held = bank.bytes();
    let per = held / 3;
    // Room for the weights, the request and one conversation: two must go.
    let limit = bank.config().memory_limit_bytes;
    let kv = limit - WEIGHTS - 1000 - per - per / 2;
    let admitted = bank
        .admit(&estimate(0, kv), Some(&SessionId::new("s2")))
        .unwrap();
    assert_eq!(admitted.shed_entries, 2);
    assert!(admitted.shed_bytes >= 2 * per - 64);
    assert!(
        bank.contains(&identity(), &convs[2]),
        "the protected session stays"
    );
    assert_eq!(bank.wait_for_spills().written, 2);
    // What was shed is on SSD, not lost.
    let id = identity();
    for t in &convs[..2] {
        let mut prompt = t.clone();
        prompt.push(1);
        assert_eq!(
            bank.lookup(&query(&id, &prompt)).mode(),
            RestoreMode::SsdClone
        );
    }
    assert_eq!(bank.stats().shed_entries, 2);
}

#[test]
fn refuses_with_a_reason_and_a_retry_hint_and_keeps_every_entry() {
    let bank = Bank::new(BankConfig {
        memory_limit_bytes: 64 << 20,
        ..roomy()
    });
    let t = tokens(400, 1);
    bank.commit(commit("a", &t)).unwrap();
    let before = bank.bytes();

    // Other requests hold most of memory: shedding the whole bank would not help.
    let r = bank.admit(&estimate(63 << 20, 1 << 10), None).unwrap_err();
    assert_eq!(r.refusal_reason, RefusalKind::MemoryRefusal);
    assert_eq!(r.retry_when, RetryWhen::AfterActiveRequests);
    assert_eq!(r.refusal_reason.as_str(), "memory_refusal");
    assert!(bank.contains(&identity(), &t));
    assert_eq!(bank.bytes(), before);

    // Too large on its own.
    let r = bank.admit(&estimate(0, 64 << 20), None).unwrap_err();
    assert_eq!(
        (r.refusal_reason, r.retry_when),
        (RefusalKind::TooLarge, RetryWhen::ReduceRequest)
    );
    assert_eq!(r.retry_when.as_str(), "reduce_request");
    assert_eq!(bank.bytes(), before);
    assert_eq!(bank.stats().refused, 2);

    // A request that fits is admitted without shedding.
    let ok = bank.admit(&estimate(0, 1 << 20), None).unwrap();
    assert_eq!(ok.shed_entries, 0);
    assert!(bank.contains(&identity(), &t));
}
