//! The background writer: spills queue here and are written on one thread, which waits
//! between blobs while foreground work runs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::error::WriteError;
use crate::id::EntryId;
use crate::sync::lock;
use crate::SpillEntry;

/// Writes one entry, calling the pause (the writer waits there while foreground work runs)
/// before each blob.
pub(crate) type Put = Box<dyn Fn(&SpillEntry, &dyn Fn()) -> Result<EntryId, WriteError> + Send>;

/// The outcome of a queued spill.
#[derive(Debug)]
pub struct SpillTicket {
    rx: mpsc::Receiver<Result<EntryId, WriteError>>,
}

impl SpillTicket {
    /// Blocks until the entry is committed (or the write failed).
    pub fn wait(self) -> Result<EntryId, WriteError> {
        self.rx.recv().unwrap_or(Err(WriteError::Shutdown))
    }

    /// The outcome, if the write has finished.
    pub fn try_result(&self) -> Option<Result<EntryId, WriteError>> {
        match self.rx.try_recv() {
            Ok(r) => Some(r),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(WriteError::Shutdown)),
        }
    }
}

struct Job {
    entry: SpillEntry,
    bytes: u64,
    done: mpsc::Sender<Result<EntryId, WriteError>>,
}

struct Shared {
    backlog: AtomicU64,
    /// Set by `close`: the writer stops pausing so the queue can drain.
    closing: AtomicBool,
    /// Foreground guards alive; the writer waits while this is not zero.
    foreground: Mutex<usize>,
    resumed: Condvar,
}

/// Held while foreground work runs; the writer pauses (between blobs) until every guard is
/// dropped.
pub struct ForegroundGuard {
    shared: Arc<Shared>,
}

impl Drop for ForegroundGuard {
    fn drop(&mut self) {
        let mut n = lock(&self.shared.foreground);
        *n -= 1;
        if *n == 0 {
            self.shared.resumed.notify_all();
        }
    }
}

impl std::fmt::Debug for ForegroundGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForegroundGuard")
    }
}

pub(crate) struct Writer {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    cap: u64,
}

impl Writer {
    /// Starts the writer thread: each queued entry is handed to `put` (with the pause to
    /// call before each blob), at most `cap` bytes queued at once.
    pub(crate) fn start(cap: u64, put: Put) -> Writer {
        let shared = Arc::new(Shared {
            backlog: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            foreground: Mutex::new(0),
            resumed: Condvar::new(),
        });
        let (tx, rx) = mpsc::channel::<Job>();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("mtplx-cold-writer".into())
            .spawn(move || {
                let pause = || {
                    let n = lock(&s.foreground);
                    let _n = s
                        .resumed
                        .wait_while(n, |n| *n > 0 && !s.closing.load(Ordering::SeqCst));
                };
                for job in rx {
                    pause();
                    let r = put(&job.entry, &pause);
                    s.backlog.fetch_sub(job.bytes, Ordering::SeqCst);
                    let _ = job.done.send(r);
                }
            })
            .ok();
        Writer {
            tx: thread.as_ref().map(|_| tx),
            thread,
            shared,
            cap,
        }
    }

    pub(crate) fn spill(&self, entry: SpillEntry) -> Result<SpillTicket, WriteError> {
        entry.validate()?;
        let tx = self.tx.as_ref().ok_or(WriteError::Shutdown)?;
        let bytes = entry.estimated_bytes();
        let reserved = self
            .shared
            .backlog
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                (b + bytes <= self.cap).then_some(b + bytes)
            });
        if let Err(backlog) = reserved {
            return Err(WriteError::BacklogFull {
                backlog,
                bytes,
                cap: self.cap,
            });
        }
        let (done, rx) = mpsc::channel();
        if tx.send(Job { entry, bytes, done }).is_err() {
            self.shared.backlog.fetch_sub(bytes, Ordering::SeqCst);
            return Err(WriteError::Shutdown);
        }
        Ok(SpillTicket { rx })
    }

    /// Whether `bytes` more would fit the backlog now.
    pub(crate) fn check_backlog(&self, bytes: u64) -> Result<(), WriteError> {
        let backlog = self.backlog_bytes();
        match backlog.checked_add(bytes) {
            Some(b) if b <= self.cap => Ok(()),
            _ => Err(WriteError::BacklogFull {
                backlog,
                bytes,
                cap: self.cap,
            }),
        }
    }

    pub(crate) fn foreground(&self) -> ForegroundGuard {
        *lock(&self.shared.foreground) += 1;
        ForegroundGuard {
            shared: self.shared.clone(),
        }
    }

    pub(crate) fn backlog_bytes(&self) -> u64 {
        self.shared.backlog.load(Ordering::SeqCst)
    }

    /// Lets the queue drain, then joins the thread.
    pub(crate) fn close(&mut self) {
        self.tx = None;
        {
            let _n = lock(&self.shared.foreground);
            self.shared.closing.store(true, Ordering::SeqCst);
            self.shared.resumed.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}
