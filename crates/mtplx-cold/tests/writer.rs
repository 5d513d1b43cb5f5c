//! The background writer: spills queue behind a byte cap and wait while foreground work
//! runs.

mod common;

use std::ops::Range;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use common::*;
use mtplx_cold::storage::FaultyStorage;
use mtplx_cold::{BoxError, ColdIndex, KvSource, WriteError};

/// Rows from [`rows`], reporting each read.
struct Watched {
    rows: mtplx_cold::KvRows,
    reads: Mutex<mpsc::Sender<usize>>,
}

impl KvSource for Watched {
    fn read_rows(
        &self,
        l: usize,
        r: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<(), BoxError> {
        let _ = self.reads.lock().unwrap().send(r.start);
        self.rows.read_rows(l, r, k, v)
    }
}

#[test]
fn the_writer_waits_while_foreground_work_runs() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(600, 1);
    let (tx, rx) = mpsc::channel();
    let mut e = entry(&t);
    e.kv = Box::new(Watched {
        rows: rows(&t),
        reads: Mutex::new(tx),
    });

    let guard = store.foreground();
    let ticket = store.spill(e).unwrap();
    // While the guard lives no row is read (a bounded wait for an event that must not come).
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(300)),
        Err(mpsc::RecvTimeoutError::Timeout)
    );
    assert!(ticket.try_result().is_none());
    assert!(store.backlog_bytes() > 0);
    drop(guard);
    ticket.wait().unwrap();
    assert_eq!(store.backlog_bytes(), 0);
    assert!(rx.try_iter().count() > 0);
    assert!(lookup(&store, &t).exact.is_ok());
}

#[test]
fn spills_beyond_the_backlog_cap_are_refused() {
    let st = FaultyStorage::new();
    let mut cfg = config();
    let t = tokens(600, 1);
    cfg.backlog_cap_bytes = entry(&t).estimated_bytes() * 3 / 2;
    let store = open(&st, cfg);
    let guard = store.foreground();
    let first = store.spill(entry(&t)).unwrap();
    let err = store.spill(entry(&tokens(600, 2))).unwrap_err();
    assert!(matches!(err, WriteError::BacklogFull { .. }), "{err}");
    drop(guard);
    first.wait().unwrap();
    // Room again once the first is written.
    store.spill(entry(&tokens(600, 2))).unwrap().wait().unwrap();
}

#[test]
fn closing_drains_the_queue() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let tickets: Vec<_> = (0..3)
        .map(|s| store.spill(entry(&tokens(300, s))).unwrap())
        .collect();
    store.close();
    for t in tickets {
        t.wait().unwrap();
    }
    let store = open(&st, config());
    assert_eq!(store.usage().unwrap().entries, 3);
}
