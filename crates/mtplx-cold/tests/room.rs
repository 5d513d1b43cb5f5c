//! What the tier tells before a write is queued: the room it has now (a cap that falls as
//! the disk fills), whether an entry would be written, and a short reason for every way a
//! write fails.

mod common;

use common::*;
use mtplx_cold::storage::{Fault, FaultyStorage};
use mtplx_cold::{ColdConfig, ColdIndex, WriteError};

#[test]
fn the_cap_in_force_follows_the_free_space_as_the_disk_fills() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    st.set_free_space(40 << 20);
    let space = store.space().unwrap();
    assert_eq!(space.configured_cap_bytes, config().cap_bytes);
    assert_eq!(space.cap_bytes, 10 << 20, "a quarter of the free disk");
    assert_eq!(space.free_bytes, 40 << 20);

    store.put(&entry(&tokens(300, 1))).unwrap();
    let used = store.usage().unwrap().used_bytes;
    // Another program fills the disk: the cap falls with it; the store's own bytes still
    // count as room it may use.
    st.set_free_space(8 << 20);
    let space = store.space().unwrap();
    assert_eq!(space.usage.used_bytes, used);
    assert_eq!(space.cap_bytes, ((8 << 20) + used) / 4);
}

#[test]
fn room_is_checked_before_a_write_is_queued() {
    let st = FaultyStorage::new();
    let store = open(
        &st,
        ColdConfig {
            free_disk_floor: 16 << 10,
            ..config()
        },
    );
    let e = entry(&tokens(300, 1));
    assert!(store.check_room(&e).is_ok());

    st.set_free_space((16 << 10) - 1);
    let err = store.check_room(&e).unwrap_err();
    assert!(
        matches!(err, WriteError::BelowFreeDiskFloor { .. }),
        "{err}"
    );
    assert_eq!(err.reason(), "below_free_disk_floor");

    // Above the floor, but a quarter of it is less than the entry.
    st.set_free_space(20 << 10);
    let err = store.check_room(&e).unwrap_err();
    assert_eq!(err.reason(), "too_large", "{err}");
    // The write itself refuses the same way, and writes nothing.
    let steps = st.steps();
    assert_eq!(store.put(&e).unwrap_err().reason(), "too_large");
    assert_eq!(st.steps(), steps);
}

#[test]
fn a_full_backlog_is_known_before_queueing() {
    let st = FaultyStorage::new();
    let e = entry(&tokens(300, 1));
    let store = open(
        &st,
        ColdConfig {
            backlog_cap_bytes: e.estimated_bytes() + 1,
            ..config()
        },
    );
    let hold = st.hold_creates();
    let ticket = store.spill(entry(&tokens(300, 1))).unwrap();
    hold.wait_for_waiters(1);
    let err = store.check_room(&entry(&tokens(300, 2))).unwrap_err();
    assert_eq!(err.reason(), "backlog_full", "{err}");
    drop(hold);
    ticket.wait().unwrap();
    assert!(store.check_room(&entry(&tokens(300, 2))).is_ok());
}

#[test]
fn a_held_writer_resumes_and_a_disk_that_fills_under_it_is_no_space() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let hold = st.hold_creates();
    let ticket = store.spill(entry(&tokens(300, 1))).unwrap();
    hold.wait_for_waiters(1);
    assert!(ticket.try_result().is_none(), "held at the first creation");
    st.fail_next(Fault::NoSpace);
    drop(hold);
    let err = ticket.wait().unwrap_err();
    assert_eq!(err.reason(), "no_space", "{err}");
    assert_eq!(store.usage().unwrap().entries, 0);
    // Nothing was left behind, and the next write goes through.
    store.put(&entry(&tokens(300, 1))).unwrap();
    assert_eq!(store.usage().unwrap().entries, 1);
}
