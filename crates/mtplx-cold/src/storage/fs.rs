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

    /// Whether a live `FsStorage` (in this process or another) holds `root`'s lock now. A
    /// store is closed only once its last handle is dropped and its writer has drained, so
    /// a caller that reopens a directory it just let go of can wait on this.
    pub fn in_use(root: &Path) -> io::Result<bool> {
        let lock = match OpenOptions::new().write(true).open(root.join("LOCK")) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        // SAFETY: flock on a descriptor we own; closing it releases a lock we took.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(false);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => Ok(true),
            _ => Err(e),
        }
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

    #[cfg(target_os = "linux")]
    fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> io::Result<()> {
        preadv_exact(&self.0, offset, bufs)
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

    fn resident(&self) -> bool {
        self.size().is_ok_and(|len| resident(&self.0, len))
    }
}

/// `preadv(2)` until every buffer is full: short reads resume where they stopped, at most
/// `IOV_MAX` buffers go in one call, and the end of the file first is `UnexpectedEof`.
#[cfg(target_os = "linux")]
fn preadv_exact(file: &File, mut offset: u64, bufs: &mut [&mut [u8]]) -> io::Result<()> {
    /// `IOV_MAX` on Linux.
    const MAX_IOV: usize = 1024;
    // The next buffer to fill, and how much of it is filled.
    let (mut i, mut filled) = (0, 0);
    let mut iov = Vec::with_capacity(bufs.len().min(MAX_IOV));
    loop {
        while i < bufs.len() && filled == bufs[i].len() {
            (i, filled) = (i + 1, 0);
        }
        if i == bufs.len() {
            return Ok(());
        }
        iov.clear();
        for (j, buf) in bufs[i..].iter_mut().take(MAX_IOV).enumerate() {
            let rest = &mut buf[if j == 0 { filled } else { 0 }..];
            iov.push(libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            });
        }
        let at = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: every iovec points into a distinct buffer we hold mutably, for its length.
        let n = unsafe { libc::preadv(file.as_raw_fd(), iov.as_ptr(), iov.len() as i32, at) };
        let mut n = match n {
            0 => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            n => n as usize,
        };
        offset += n as u64;
        while n > 0 {
            let left = bufs[i].len() - filled;
            if n < left {
                filled += n;
                break;
            }
            n -= left;
            (i, filled) = (i + 1, 0);
        }
    }
}

/// Whether all `len` bytes of `file` are in the page cache (Linux; `false` elsewhere):
/// `cachestat` (Linux 6.5), else `mincore` over a mapping of the file that is never read
/// through. Linux answers both for files the caller owns or may write to, which blobs are.
#[cfg(target_os = "linux")]
fn resident(file: &File, len: u64) -> bool {
    let Ok(len) = usize::try_from(len) else {
        return false;
    };
    if len == 0 {
        return true;
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let Ok(page) = usize::try_from(page) else {
        return false;
    };
    let pages = len.div_ceil(page);
    match cached_pages(file) {
        Ok(cached) => cached >= pages as u64,
        Err(_) => mincore_all(file, len, pages),
    }
}

/// Pages of `file` in the page cache, from `cachestat(2)`: no mapping to set up and tear
/// down (a `munmap` in a process with several threads costs a TLB shootdown).
#[cfg(target_os = "linux")]
fn cached_pages(file: &File) -> io::Result<u64> {
    /// The same number on every architecture (the unified syscall table).
    const SYS_CACHESTAT: libc::c_long = 451;
    #[repr(C)]
    struct Range {
        off: u64,
        /// 0: to the end of the file.
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let range = Range { off: 0, len: 0 };
    let mut stat = Stat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, both live and laid out as the
    // kernel's `struct cachestat_range` and `struct cachestat`; flags must be 0.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.nr_cache)
}

/// Whether all `pages` pages of `file` (`len` bytes) are in memory, from `mincore(2)` over a
/// mapping that is never read through.
#[cfg(target_os = "linux")]
fn mincore_all(file: &File, len: usize, pages: usize) -> bool {
    let mut vec = vec![0u8; pages];
    // SAFETY: a shared read-only mapping of a descriptor we hold, of the file's length; it
    // is never dereferenced (mincore only inspects it) and is unmapped before returning.
    // `vec` has one byte per page of the mapping, as mincore requires.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        if map == libc::MAP_FAILED {
            return false;
        }
        let rc = libc::mincore(map, len, vec.as_mut_ptr());
        libc::munmap(map, len);
        rc == 0 && vec.iter().all(|p| p & 1 == 1)
    }
}

#[cfg(not(target_os = "linux"))]
fn resident(_: &File, _: u64) -> bool {
    false
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_resident_once_written_and_not_where_it_has_holes() {
        let dir = tempfile::tempdir().unwrap();
        let st = FsStorage::open(dir.path()).unwrap();
        let written = st.create(Path::new("written")).unwrap();
        written.write_at(0, &vec![7u8; 1 << 20]).unwrap();
        assert!(written.resident());
        // Never written: its pages are in no cache.
        let holes = st.create(Path::new("holes")).unwrap();
        holes.set_len(1 << 20).unwrap();
        assert!(!holes.resident());
        // Part written, part hole.
        holes.write_at(0, &[1u8; 4096]).unwrap();
        assert!(!holes.resident());
    }

    /// A scatter read fills every buffer as reading them one by one does: empty buffers,
    /// more buffers than one `preadv` takes, and the end of the file.
    #[test]
    fn a_vectored_read_fills_buffers_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let st = FsStorage::open(dir.path()).unwrap();
        let f = st.create(Path::new("f")).unwrap();
        let data: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
        f.write_at(0, &data).unwrap();
        let lens: Vec<usize> = (0..1500).map(|i| [0, 1, 13, 40][i % 4]).collect();
        let total: usize = lens.iter().sum();
        let mut store = vec![0u8; total];
        let mut bufs: Vec<&mut [u8]> = Vec::new();
        let mut rest = &mut store[..];
        for &l in &lens {
            let (a, b) = rest.split_at_mut(l);
            bufs.push(a);
            rest = b;
        }
        f.read_vectored_at(100, &mut bufs).unwrap();
        assert_eq!(store, data[100..100 + total]);
        let mut one = [0u8; 8];
        let mut past: Vec<&mut [u8]> = vec![&mut one[..4], &mut []];
        assert!(f
            .read_vectored_at(data.len() as u64 - 2, &mut past)
            .is_err());
        let mut two = [0u8; 2];
        f.read_vectored_at(data.len() as u64 - 2, &mut [&mut two[..], &mut []])
            .unwrap();
        assert_eq!(two, data[data.len() - 2..]);
    }

    /// The fallback for kernels without `cachestat` gives the same answers.
    #[test]
    fn mincore_agrees() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(1 << 20).unwrap();
        assert!(!mincore_all(&f, 1 << 20, 256));
        f.write_all_at(&vec![3u8; 1 << 20], 0).unwrap();
        assert!(mincore_all(&f, 1 << 20, 256));
    }
}
