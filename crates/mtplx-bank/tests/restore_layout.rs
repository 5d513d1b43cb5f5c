//! A restore builds the cache in the layout the caller asks for, from RAM and from SSD
//! alike (seed 001: an SSD exact restore used the default decode layout).

mod common;

use common::*;
use mtplx_bank::{Bank, BankConfig, RestoreMode};
use mtplx_cold::ReadPath;
use mtplx_kv::{CacheFactory, LayoutKind};

fn factories() -> [CacheFactory; 3] {
    [
        CacheFactory::contiguous(),
        CacheFactory::paged(),
        CacheFactory::segmented(),
    ]
}

#[test]
fn ram_restores_build_the_layout_asked_for_whatever_layout_was_stored() {
    let t = tokens(700, 1);
    let mut prompt = t.clone();
    prompt.push(5);
    let id = identity();
    for stored in factories() {
        let bank = Bank::new(roomy());
        let mut c = commit("a", &t);
        c.kv = cache_for(&stored, &t).snapshot();
        bank.commit(c).unwrap();
        for asked in factories() {
            let plan = bank.lookup(&query(&id, &prompt));
            assert_eq!(plan.mode(), RestoreMode::Clone);
            let r = plan.restore(&asked, &dense()).unwrap();
            assert_eq!(
                r.sequence.kv().layout(),
                asked.layout(),
                "stored {:?}",
                stored.layout()
            );
            assert_rows(r.sequence.kv(), &prompt, 700);
        }
    }
}

#[test]
fn ssd_exact_restores_build_the_layout_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let bank = Bank::new(BankConfig {
        max_entries: 1,
        ..roomy()
    })
    .with_cold(cold_store(dir.path()));
    let t = tokens(700, 1);
    bank.commit(commit("a", &t)).unwrap();
    bank.commit(commit("b", &tokens(5, 2))).unwrap();
    bank.wait_for_spills();
    let mut prompt = t.clone();
    prompt.push(5);
    let id = identity();
    let mut seen = Vec::new();
    for asked in factories() {
        let plan = bank.lookup(&query(&id, &prompt));
        assert_eq!(plan.mode(), RestoreMode::SsdClone);
        let r = plan.restore(&asked, &dense()).unwrap();
        seen.push(r.sequence.kv().layout());
        assert_rows(r.sequence.kv(), &prompt, 700);
        // Every layout lends its rows: blocks were read straight into the cache.
        let path = r.ssd_report.expect("restored from SSD").read_path;
        assert_ne!(path, ReadPath::Staged, "{:?}", asked.layout());
    }
    assert_eq!(
        seen,
        [
            LayoutKind::Contiguous,
            LayoutKind::Paged,
            LayoutKind::Segmented
        ]
    );
}

#[test]
fn a_cold_start_also_uses_the_callers_layout() {
    let bank = Bank::new(roomy());
    let id = identity();
    let prompt = tokens(10, 1);
    let r = bank
        .lookup(&query(&id, &prompt))
        .restore(&CacheFactory::segmented(), &dense())
        .unwrap();
    assert_eq!(r.sequence.kv().layout(), LayoutKind::Segmented);
    assert_eq!(r.prefix_len(), 0);
}
