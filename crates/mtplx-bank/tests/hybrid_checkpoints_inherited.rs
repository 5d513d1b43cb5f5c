//! A hybrid follow-up turn's entry inherits the checkpoints of the turn it continues, so a
//! prompt that leaves the conversation inside an earlier turn still restores there; an
//! entry keeps at most `MAX_CHECKPOINTS`, the tail, the oldest and one per doubling.

mod common;

use common::*;
use mtplx_bank::{Bank, BankConfig, RestoreMode, MAX_CHECKPOINTS};
use mtplx_kv::CacheFactory;

#[test]
fn a_follow_up_turn_restores_at_its_parents_checkpoint() {
    // One entry per session: turn 2 replaces turn 1, so only what it inherited is left.
    let bank = Bank::new(BankConfig {
        max_entries_per_session: 1,
        ..roomy()
    });
    let conversation = tokens(2000, 1);
    // Turn 1: 1,000 tokens, checkpoints at 300 and its end.
    bank.commit(hybrid_commit("s", &conversation[..1000], &[300, 1000]))
        .unwrap();
    // Turn 2 continues it to 2,000 tokens; its prefill checkpointed only its own end.
    bank.commit(hybrid_commit("s", &conversation, &[2000]))
        .unwrap();

    // A prompt that follows the conversation for 700 tokens, then leaves it (an edit
    // of turn 1): the newest checkpoint at or below 700 is turn 1's, at 300.
    let mut prompt = conversation[..700].to_vec();
    prompt.extend(tokens(50, 7));
    let id = identity();
    let plan = bank.lookup(&query(&id, &prompt));
    assert_eq!(plan.cached_tokens(), 300, "{:?}", plan.explanation());
    assert_eq!(plan.mode(), RestoreMode::BlockPrefixBoundaryClone);
    let restored = plan.restore(&CacheFactory::paged(), &hybrid()).unwrap();
    let state = restored
        .sequence
        .recurrent()
        .cloned()
        .expect("the inherited checkpoint's state");
    assert_eq!(state.tokens(), 300);
    assert_eq!(state.conv(0).unwrap(), recurrent_at(300).conv(0).unwrap());
    assert_rows(restored.sequence.kv(), &prompt, 300);
}

#[test]
fn an_entry_keeps_at_most_the_bound_thinned_by_distance_from_the_tail() {
    let bank = Bank::new(roomy());
    let conversation = tokens(8192, 1);
    // Twelve turns, each checkpointing every 256 tokens of its own part.
    let mut end = 0;
    for turn in 1..=12 {
        let start = end;
        end = turn * 8192 / 12;
        let own: Vec<usize> = (start / 256 + 1..=end / 256)
            .map(|i| i * 256)
            .chain(std::iter::once(end))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        bank.commit(hybrid_commit("s", &conversation[..end], &own))
            .unwrap();
    }
    let info = bank.sessions();
    let s = info
        .iter()
        .find(|s| s.id.as_str() == "s")
        .expect("the session");
    assert_eq!(s.longest_tokens, 8192);
    assert!(s.checkpoint_bytes > 0);
    assert_eq!(
        bank.stats().checkpoint_bytes,
        s.checkpoint_bytes,
        "one session"
    );
    assert!(bank.stats().checkpoint_bytes < bank.stats().resident_bytes);
    let kept = &s.checkpoints;
    assert!(kept.len() <= MAX_CHECKPOINTS, "{kept:?}");
    assert_eq!(kept.first(), Some(&256), "the oldest stays");
    assert_eq!(kept.last(), Some(&8192), "the tail stays");
    // One per doubling of the distance from the tail, nearest first.
    let bands: Vec<u32> = kept[1..kept.len() - 1]
        .iter()
        .map(|p| (8192 - p).ilog2())
        .collect();
    let mut sorted = bands.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.dedup();
    assert_eq!(bands, sorted, "{kept:?}");
}
