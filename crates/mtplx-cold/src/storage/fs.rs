//! The real file system.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{Storage, StorageFile};
use crate::error::OpenError;

/// The cold store's directory on a real file system. Holds an exclusive `flock` on
/// `root/LOCK` while it lives, so two processes never share a store.
#[derive(Debug)]
pub struct FsStorage {
    root: PathBuf,
    _lock: File,
}

impl FsStorage {
    /// Creates `root` (0700) if needed and locks it.
    pub fn open(root: &Path) -> Result<FsStorage, OpenError> {
        let io = |op, source| OpenError::Io {
            op,
            path: root.to_path_buf(),
            source,
        };
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(|e| io("create directory", e))?;
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("chmod", e))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(root.join("LOCK"))
            .map_err(|e| io("open LOCK", e))?;
        // SAFETY: flock on a descriptor we own; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(if e.kind() == io::ErrorKind::WouldBlock {
                OpenError::Locked {
                    path: root.to_path_buf(),
                }
            } else {
                io("flock", e)
            });
        }
        Ok(FsStorage {
            root: root.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Storage for FsStorage {
    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(self.root.join(dir))
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(self.root.join(path))?;
        Ok(Box::new(FsFile(f)))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.root.join(path))?;
        Ok(Box::new(FsFile(f)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(self.root.join(from), self.root.join(to))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(self.root.join(path))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.root.join(dir))? {
            let e = e?;
            let meta = e.metadata()?;
            if meta.is_file() {
                if let Some(name) = e.file_name().to_str() {
                    out.push((name.to_string(), meta.len()));
                }
            }
        }
        Ok(out)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(self.root.join(dir))?.sync_all()
    }

    fn free_space(&self) -> io::Result<u64> {
        free_space(&self.root)
    }
}

/// Bytes available to an unprivileged user on the file system holding `path`.
pub(crate) fn free_space(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statvfs writes into the zeroed struct we pass; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

#[derive(Debug)]
struct FsFile(File);

impl StorageFile for FsFile {
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn will_need(&self) {
        #[cfg(target_os = "linux")]
        // SAFETY: an advisory call on a descriptor we own.
        unsafe {
            libc::posix_fadvise(self.0.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED);
        }
    }
}

/// Drops `path`'s pages from the OS page cache (Linux; a no-op elsewhere), so the next
/// read comes from the disk. For benchmarks.
pub fn drop_page_cache(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    f.sync_all()?;
    #[cfg(target_os = "linux")]
    // SAFETY: an advisory call on a descriptor we own.
    unsafe {
        let rc = libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
    }
    Ok(())
}
