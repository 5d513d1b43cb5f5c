//! One lock per session: a session's jobs run one at a time, in arrival order (tokio's
//! mutex is fair), and each sees the commit of the one before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mtplx_bank::SessionId;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// The session locks; entries are dropped when no job holds or waits for them.
#[derive(Debug, Clone, Default)]
pub struct SessionLocks {
    map: Arc<Mutex<HashMap<SessionId, Arc<AsyncMutex<()>>>>>,
}

/// Held while a session's job runs; dropping it lets the session's next job go.
#[derive(Debug)]
pub struct SessionGuard {
    _guard: OwnedMutexGuard<()>,
    session: SessionId,
    locks: SessionLocks,
}

impl SessionLocks {
    /// Waits for `session`'s turn.
    pub async fn acquire(&self, session: &SessionId) -> SessionGuard {
        let lock = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(session.clone()).or_default().clone()
        };
        SessionGuard {
            _guard: lock.lock_owned().await,
            session: session.clone(),
            locks: self.clone(),
        }
    }

    /// Sessions with a job running or waiting.
    pub fn busy(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let mut map = self.locks.map.lock().unwrap_or_else(|e| e.into_inner());
        // Two references: the map's and our guard's mutex. Nobody else waits: forget it.
        if map
            .get(&self.session)
            .is_some_and(|l| Arc::strong_count(l) <= 2)
        {
            map.remove(&self.session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_session_runs_in_order_and_others_do_not_wait() {
        let locks = SessionLocks::default();
        let a = SessionId::new("a");
        let first = locks.acquire(&a).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let (l2, a2, o2) = (locks.clone(), a.clone(), order.clone());
        let second = tokio::spawn(async move {
            let _g = l2.acquire(&a2).await;
            o2.lock().unwrap().push("second");
        });
        // Another session is not blocked by `a`.
        let _b = locks.acquire(&SessionId::new("b")).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            order.lock().unwrap().is_empty(),
            "ran before the first finished"
        );
        order.lock().unwrap().push("first");
        drop(first);
        second.await.unwrap();
        assert_eq!(*order.lock().unwrap(), ["first", "second"]);
        drop(_b);
        assert_eq!(locks.busy(), 0, "finished sessions are forgotten");
    }
}
