//! An entry spilled by one store is found and restored by the next one over the same
//! directory; two live stores never share a directory.

mod common;

use common::*;
use mtplx_cold::{ColdIndex, ColdStore, OpenError};

#[test]
fn a_fresh_store_restores_what_the_last_one_spilled() {
    let dir = tempfile::tempdir().unwrap();
    let t = tokens(1000, 6);
    {
        let store = ColdStore::open_dir(dir.path(), config()).unwrap();
        let ticket = store.spill(hybrid_entry(&t, &[512, 1000])).unwrap();
        ticket.wait().unwrap();
    }
    let store = ColdStore::open_dir(dir.path(), config()).unwrap();
    assert_eq!(store.report().entries, 1);
    assert_eq!(store.report().orphans_removed, 0);
    let hit = lookup(&store, &t).exact.unwrap();
    let got = restore(&store, &hit).unwrap();
    assert_eq!(got.truncated(1000), expected(&t, 1000));
    assert_eq!(got.recurrent, Some(checkpoint(1000)));
    assert_eq!(got.tail, Some(tail(1000)));
}

#[test]
fn a_second_store_on_a_live_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = ColdStore::open_dir(dir.path(), config()).unwrap();
    let second = ColdStore::open_dir(dir.path(), config());
    assert!(
        matches!(second, Err(OpenError::Locked { .. })),
        "{second:?}"
    );
}

#[test]
fn in_use_says_whether_a_live_store_holds_the_directory() {
    use mtplx_cold::storage::FsStorage;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ssd");
    assert!(!FsStorage::in_use(&root).unwrap(), "no directory yet");
    let store = ColdStore::open_dir(&root, config()).unwrap();
    assert!(FsStorage::in_use(&root).unwrap());
    // Asking does not take the lock from the store, nor keep it once answered.
    assert!(FsStorage::in_use(&root).unwrap());
    drop(store);
    assert!(!FsStorage::in_use(&root).unwrap());
    let _again = ColdStore::open_dir(&root, config()).unwrap();
    assert!(FsStorage::in_use(&root).unwrap());
}

/// A real directory that logs when each file handle closes and when the storage itself
/// (the directory's lock) is let go.
mod logged {
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    use mtplx_cold::storage::{FsStorage, Storage, StorageFile};

    pub type Log = Arc<Mutex<Vec<String>>>;

    #[derive(Debug)]
    pub struct Logged {
        pub inner: FsStorage,
        pub log: Log,
    }

    impl Drop for Logged {
        fn drop(&mut self) {
            self.log.lock().unwrap().push("lock released".into());
        }
    }

    #[derive(Debug)]
    struct File {
        path: PathBuf,
        file: Box<dyn StorageFile>,
        log: Log,
    }

    impl Drop for File {
        fn drop(&mut self) {
            let closed = format!("closed {}", self.path.display());
            self.log.lock().unwrap().push(closed);
        }
    }

    impl Logged {
        fn wrap(&self, path: &Path, file: Box<dyn StorageFile>) -> Box<dyn StorageFile> {
            Box::new(File {
                path: path.to_path_buf(),
                file,
                log: self.log.clone(),
            })
        }
    }

    impl Storage for Logged {
        fn create_dir(&self, dir: &Path) -> io::Result<()> {
            self.inner.create_dir(dir)
        }
        fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
            Ok(self.wrap(path, self.inner.create(path)?))
        }
        fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
            Ok(self.wrap(path, self.inner.open(path)?))
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            self.inner.rename(from, to)
        }
        fn remove(&self, path: &Path) -> io::Result<()> {
            self.inner.remove(path)
        }
        fn list(&self, dir: &Path) -> io::Result<Vec<(String, u64)>> {
            self.inner.list(dir)
        }
        fn sync_dir(&self, dir: &Path) -> io::Result<()> {
            self.inner.sync_dir(dir)
        }
        fn free_space(&self) -> io::Result<u64> {
            self.inner.free_space()
        }
    }

    impl StorageFile for File {
        fn size(&self) -> io::Result<u64> {
            self.file.size()
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            self.file.read_at(offset, buf)
        }
        fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> io::Result<()> {
            self.file.read_vectored_at(offset, bufs)
        }
        fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            self.file.write_at(offset, data)
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.file.set_len(len)
        }
        fn sync(&self) -> io::Result<()> {
            self.file.sync()
        }
        fn will_need(&self) {
            self.file.will_need()
        }
        fn resident(&self) -> bool {
            self.file.resident()
        }
    }
}

/// The directory's lock is what a restarting server waits on before it reopens the store
/// (`FsStorage::in_use`), so it must be the last thing a closing store lets go: were it
/// released before redb had closed the manifest, the next store could open a database still
/// being shut down (redb panics on the half-written file; CI met it once).
#[test]
fn a_closing_store_releases_its_lock_only_after_every_file_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let log = logged::Log::default();
    let storage = logged::Logged {
        inner: mtplx_cold::storage::FsStorage::open(dir.path()).unwrap(),
        log: log.clone(),
    };
    let store = ColdStore::open(std::sync::Arc::new(storage), config()).unwrap();
    let t = tokens(600, 3);
    store.spill(entry(&t)).unwrap().wait().unwrap();
    assert!(lookup(&store, &t).exact.is_ok());
    drop(store);

    let log = log.lock().unwrap().clone();
    assert_eq!(
        log.last().map(String::as_str),
        Some("lock released"),
        "{log:#?}"
    );
    assert!(
        log.iter().any(|e| e == "closed manifest.redb"),
        "the manifest was closed before the lock went: {log:#?}"
    );
}
