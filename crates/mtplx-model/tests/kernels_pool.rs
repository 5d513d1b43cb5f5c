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

/// Jobs of different sizes back to back, with more threads than cores so that workers are
/// preempted anywhere: every part of every job runs exactly once. A worker that woke for
/// one job it had no part in, was preempted, and then read the next job's part count ran
/// that job's part twice (a second `pending` decrement let the caller return early or wait
/// forever). Before the fix this test hung within 20,000 jobs on 2 cores; the race needs
/// more than 2 threads, so it showed only on larger machines (the likely cause of runs that
/// stalled on the 16-core GPU host).
#[test]
fn a_late_worker_never_runs_a_part_twice() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let pool = Pool::with_spin(8, Duration::from_micros(20));
        let mut wrong = None;
        for i in 0..20_000usize {
            let parts = [2, 8, 3, 8, 1, 8][i % 6];
            let hits: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
            pool.run(parts, &|p| {
                hits[p].fetch_add(1, Ordering::SeqCst);
            });
            let counts: Vec<usize> = hits.iter().map(|h| h.load(Ordering::SeqCst)).collect();
            let want: Vec<usize> = (0..8).map(|p| usize::from(p < parts)).collect();
            if counts != want && wrong.is_none() {
                wrong = Some(format!("job {i}, {parts} parts: ran {counts:?}"));
            }
        }
        let _ = done.send(wrong);
    });
    match finished.recv_timeout(Duration::from_secs(120)) {
        Ok(None) => {}
        Ok(Some(wrong)) => panic!("a part ran twice or not at all: {wrong}"),
        Err(_) => panic!("the pool hung"),
    }
}
