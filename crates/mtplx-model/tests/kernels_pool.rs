//! The kernel thread pool runs each part exactly once, on distinct threads, and reports
//! panics instead of hanging.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use mtplx_model::kernels::Pool;

#[test]
fn every_part_runs_once_on_its_own_thread() {
    for threads in 1..=4 {
        let pool = Pool::new(threads);
        assert_eq!(pool.threads(), threads);
        for parts in 0..=threads {
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
                let ids = Mutex::new(HashSet::new());
                pool.run(parts, &|p| {
                    hits[p].fetch_add(1, Ordering::SeqCst);
                    ids.lock().unwrap().insert(std::thread::current().id());
                });
                let counts: Vec<usize> = hits.iter().map(|h| h.load(Ordering::SeqCst)).collect();
                let want: Vec<usize> = (0..threads).map(|p| usize::from(p < parts)).collect();
                assert_eq!(counts, want, "{parts} parts on {threads} threads");
                assert_eq!(ids.lock().unwrap().len(), parts);
            }
        }
    }
}

#[test]
fn sleeping_workers_wake_up() {
    let pool = Pool::with_spin(3, Duration::ZERO);
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(1));
        let sum = AtomicUsize::new(0);
        pool.run(3, &|p| {
            sum.fetch_add(p + 1, Ordering::SeqCst);
        });
        assert_eq!(sum.load(Ordering::SeqCst), 6);
    }
}

#[test]
fn a_panicking_part_is_reported_and_the_pool_still_works() {
    let pool = Pool::new(2);
    for bad in [0, 1] {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(2, &|p| assert_ne!(p, bad, "part {p} fails"));
        }));
        assert!(r.is_err(), "part {bad}'s panic was lost");
        let sum = AtomicUsize::new(0);
        pool.run(2, &|p| {
            sum.fetch_add(p + 1, Ordering::SeqCst);
        });
        assert_eq!(sum.load(Ordering::SeqCst), 3);
    }
}

#[test]
fn concurrent_callers_share_one_pool() {
    let pool = Pool::new(2);
    let total = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..500 {
                    pool.run(2, &|_| {
                        total.fetch_add(1, Ordering::SeqCst);
                    });
                }
            });
        }
    });
    assert_eq!(total.load(Ordering::SeqCst), 4 * 500 * 2);
}
