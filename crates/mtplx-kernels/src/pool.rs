//! A small persistent thread pool shared by the model's matrix kernels and the attention
//! kernel: a dispatch costs a few atomic operations (no allocation, no queue), which matters
//! when a decode step runs ~200 products of a few microseconds each. One pool for both means
//! their threads never compete for the cores (a second pool, rayon's, spinning beside this
//! one halved prefill speed).
//!
//! Workers spin for a short while after each job (the next product usually follows within
//! microseconds), then sleep on a condition variable. The calling thread always takes part
//! 0 of the work itself.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps, by default.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(100);

type Task<'a> = &'a (dyn Fn(usize) + Sync);

/// Low bits of [`Shared::job`] that hold the part count.
const PARTS_BITS: u32 = 16;

/// A job word: its generation above its part count.
fn job_word(generation: u64, parts: usize) -> u64 {
    (generation << PARTS_BITS) | parts as u64
}

fn generation_of(word: u64) -> u64 {
    word >> PARTS_BITS
}

fn parts_of(word: u64) -> usize {
    (word & ((1 << PARTS_BITS) - 1)) as usize
}

struct Shared {
    /// The current job: a generation bumped once per job, and the job's part count (part 0
    /// is the caller's), in one word ([`job_word`]). Workers wait for the generation to
    /// change, and read the part count from the same load: a worker that woke for one job
    /// and was preempted then acts on the newest job once, never on one job's generation
    /// with another's part count (which ran a part twice).
    job: AtomicU64,
    /// A `*const Task` on the caller's stack, valid while `pending > 0`.
    task: AtomicPtr<()>,
    /// Worker parts not yet finished.
    pending: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    spin: Duration,
}

/// A fixed set of threads that run the parts of one job at a time.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises jobs from different callers.
    dispatch: Mutex<()>,
}

impl Pool {
    /// A pool of `threads` (at least 1: the caller; `threads − 1` workers are spawned), idle
    /// workers spinning for [`DEFAULT_SPIN`].
    pub fn new(threads: usize) -> Pool {
        Pool::with_spin(threads, DEFAULT_SPIN)
    }

    /// A pool whose idle workers spin for `spin` before sleeping.
    pub fn with_spin(threads: usize, spin: Duration) -> Pool {
        assert!(threads < 1 << PARTS_BITS, "{threads} threads");
        let shared = Arc::new(Shared {
            job: AtomicU64::new(job_word(0, 0)),
            task: AtomicPtr::new(std::ptr::null_mut()),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            spin,
        });
        let workers = (1..threads.max(1))
            .map(|index| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("mtplx-pool-{index}"))
                    .spawn(move || worker(&shared, index))
                    .expect("spawning a kernel thread")
            })
            .collect();
        Pool {
            shared,
            workers,
            dispatch: Mutex::new(()),
        }
    }

    /// The process-wide pool: `MTPLX_THREADS` threads if set, else one per available core.
    pub fn global() -> &'static Pool {
        static GLOBAL: OnceLock<Pool> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let threads = std::env::var("MTPLX_THREADS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            Pool::new(threads)
        })
    }

    /// Threads, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `task(p)` for every part `p` in `0..parts` (at most [`threads`](Self::threads)),
    /// part 0 on the calling thread, and returns when all have finished. A panic in any part
    /// is re-raised here, after every part has finished.
    pub fn run(&self, parts: usize, task: &(dyn Fn(usize) + Sync)) {
        assert!(
            parts <= self.threads(),
            "{parts} parts on {} threads",
            self.threads()
        );
        if parts <= 1 {
            if parts == 1 {
                task(0);
            }
            return;
        }
        let _one_job = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let task_ref: Task<'_> = task;
        s.task.store(
            (&task_ref as *const Task<'_>).cast_mut().cast(),
            Ordering::Relaxed,
        );
        s.pending.store(parts - 1, Ordering::Relaxed);
        // Only a dispatcher (holding `dispatch`) and `drop` (holding `&mut self`) write it.
        let next = generation_of(s.job.load(Ordering::Relaxed)) + 1;
        s.job.store(job_word(next, parts), Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| task(0)));
        // Workers read `task_ref` until they decrement `pending`: wait, even when unwinding.
        let mut spins = 0u32;
        while s.pending.load(Ordering::Acquire) != 0 {
            backoff(&mut spins);
        }
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a kernel thread panicked");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, Ordering::SeqCst);
        let next = generation_of(s.job.load(Ordering::Relaxed)) + 1;
        s.job.store(job_word(next, 0), Ordering::SeqCst);
        {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let word = wait_for_job(s, seen);
        seen = generation_of(word);
        if s.shutdown.load(Ordering::SeqCst) {
            return;
        }
        if index < parts_of(word) {
            let task = s.task.load(Ordering::Relaxed).cast::<Task<'_>>();
            // SAFETY: the caller published `task` before storing the job word (read with
            // Acquire in `wait_for_job`) and keeps it alive until `pending` reaches 0, which
            // needs this part: no later job can have replaced it.
            let r = catch_unwind(AssertUnwindSafe(|| unsafe { (*task)(index) }));
            if r.is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
            s.pending.fetch_sub(1, Ordering::Release);
        }
    }
}

/// Waits until the job's generation differs from `seen`; returns the job word.
fn wait_for_job(s: &Shared, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let w = s.job.load(Ordering::Acquire);
        if generation_of(w) != seen {
            return w;
        }
        backoff(&mut spins);
        if spins.is_multiple_of(64) && start.elapsed() > s.spin {
            break;
        }
    }
    let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    let w = loop {
        let w = s.job.load(Ordering::SeqCst);
        if generation_of(w) != seen {
            break w;
        }
        guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    };
    s.sleepers.fetch_sub(1, Ordering::SeqCst);
    w
}

/// One step of a busy wait: spin first, then give the core away between checks, so that
/// with more threads than cores the thread being waited for gets to run.
fn backoff(spins: &mut u32) {
    *spins = spins.wrapping_add(1);
    if *spins < 256 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}
