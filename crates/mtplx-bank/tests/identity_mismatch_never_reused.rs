//! A state is never reused under another identity (model, chat template, MTP, policy, K/V
//! element type), from RAM or from SSD; the miss names what differed where the tier can
//! tell (the SSD tier finds entries of the same identity under another element type only).

mod common;

use common::*;
use mtplx_bank::{Bank, BankConfig, Identity, MissReason, RestoreMode};
use mtplx_cold::Mtp;
use mtplx_kv::CacheFactory;

fn others() -> [(Identity, MissReason); 5] {
    let base = identity();
    [
        (
            Identity {
                model: "other-model".into(),
                ..base.clone()
            },
            MissReason::ModelMismatch,
        ),
        (
            Identity {
                chat_template: "other-template".into(),
                ..base.clone()
            },
            MissReason::TemplateMismatch,
        ),
        (
            Identity {
                mtp: Mtp::On,
                ..base.clone()
            },
            MissReason::PolicyMismatch,
        ),
        (
            Identity {
                policy: "other".into(),
                ..base.clone()
            },
            MissReason::PolicyMismatch,
        ),
        (
            Identity {
                kv_dtype: mtplx_bank::cold_dtype(mtplx_kv::KvDtype::F16),
                ..base
            },
            MissReason::KvFormatMismatch,
        ),
    ]
}

#[test]
fn ram_states_are_not_served_under_another_identity() {
    let bank = Bank::new(roomy());
    let t = tokens(600, 1);
    bank.commit(commit("a", &t)).unwrap();
    let mut prompt = t.clone();
    prompt.push(3);
    for (other, reason) in others() {
        let plan = bank.lookup(&query(&other, &prompt));
        assert_eq!(plan.mode(), RestoreMode::Cold, "{other:?}");
        assert_eq!(plan.explanation().miss, Some(reason));
        let r = plan.restore(&CacheFactory::contiguous(), &dense()).unwrap();
        assert_eq!(r.prefix_len(), 0);
    }
    let id = identity();
    assert_eq!(bank.lookup(&query(&id, &prompt)).mode(), RestoreMode::Clone);
}

#[test]
fn ssd_states_are_not_served_under_another_identity() {
    let dir = tempfile::tempdir().unwrap();
    let bank = Bank::new(BankConfig {
        max_entries: 1,
        ..roomy()
    })
    .with_cold(cold_store(dir.path()));
    let t = tokens(600, 1);
    bank.commit(commit("a", &t)).unwrap();
    bank.commit(commit("b", &tokens(3, 9))).unwrap();
    bank.wait_for_spills();
    let mut prompt = t.clone();
    prompt.push(3);
    for (other, ram_reason) in others() {
        let plan = bank.lookup(&query(&other, &prompt));
        assert_eq!(plan.mode(), RestoreMode::Cold, "{other:?}");
        let want = match ram_reason {
            MissReason::KvFormatMismatch => {
                MissReason::Ssd(mtplx_cold::MissReason::KvFormatMismatch)
            }
            _ => MissReason::NewSession,
        };
        assert_eq!(plan.explanation().miss, Some(want), "{other:?}");
    }
    let id = identity();
    assert_eq!(
        bank.lookup(&query(&id, &prompt)).mode(),
        RestoreMode::SsdClone
    );
}
