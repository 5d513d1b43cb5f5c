//! The hourly write budget: SSD endurance is spent by bytes written, so a store writes at
//! most [`crate::ColdConfig::write_budget_per_hour`] bytes of new blobs in any sliding hour.
//! A write that would exceed it is skipped ([`crate::WriteError::OverWriteBudget`]) and
//! counted; blobs already stored (a shared prefix) cost nothing.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);

/// What the budget let through and what it skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteStats {
    /// Bytes of new blobs written in the last hour.
    pub written_last_hour: u64,
    /// Writes skipped because they would have exceeded the hourly budget, since open.
    pub skipped_over_budget: u64,
    /// Bytes those skipped writes would have written.
    pub skipped_bytes: u64,
}

/// Bytes written in the last hour, as a log of (when, bytes).
#[derive(Debug, Default)]
pub(crate) struct WriteWindow {
    log: VecDeque<(Instant, u64)>,
    in_window: u64,
    skipped: u64,
    skipped_bytes: u64,
}

impl WriteWindow {
    fn expire(&mut self, now: Instant) {
        while let Some(&(at, bytes)) = self.log.front() {
            if now.saturating_duration_since(at) < HOUR {
                break;
            }
            self.log.pop_front();
            self.in_window -= bytes;
        }
    }

    /// Charges `bytes` written at `now` if they fit `budget`; otherwise counts a skip and
    /// returns the bytes already written in the window.
    pub(crate) fn admit(&mut self, now: Instant, bytes: u64, budget: u64) -> Result<(), u64> {
        self.expire(now);
        if bytes > 0 && self.in_window.saturating_add(bytes) > budget {
            self.skipped += 1;
            self.skipped_bytes += bytes;
            return Err(self.in_window);
        }
        if bytes > 0 {
            self.log.push_back((now, bytes));
            self.in_window += bytes;
        }
        Ok(())
    }

    pub(crate) fn stats(&mut self, now: Instant) -> WriteStats {
        self.expire(now);
        WriteStats {
            written_last_hour: self.in_window,
            skipped_over_budget: self.skipped,
            skipped_bytes: self.skipped_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_over_the_budget_are_skipped_until_the_hour_has_passed() {
        let t0 = Instant::now();
        let mut w = WriteWindow::default();
        assert_eq!(w.admit(t0, 60, 100), Ok(()));
        assert_eq!(w.admit(t0 + Duration::from_secs(10), 30, 100), Ok(()));
        // 90 written: 20 more don't fit, and are counted.
        assert_eq!(w.admit(t0 + Duration::from_secs(20), 20, 100), Err(90));
        // Nothing new to write (a shared prefix) always fits.
        assert_eq!(w.admit(t0 + Duration::from_secs(21), 0, 100), Ok(()));
        // An hour after the first write, its 60 bytes have left the window.
        let later = t0 + HOUR + Duration::from_secs(1);
        assert_eq!(w.admit(later, 20, 100), Ok(()));
        assert_eq!(
            w.stats(later),
            WriteStats {
                written_last_hour: 50,
                skipped_over_budget: 1,
                skipped_bytes: 20,
            }
        );
        assert_eq!(w.stats(later + HOUR).written_last_hour, 0);
    }
}
