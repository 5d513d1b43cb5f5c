//! [`Storage`] and [`StorageFile`]: the file operations the cold tier uses.

use std::fmt::Debug;
use std::io;
use std::path::Path;

/// A directory of files, as the cold tier needs it.
pub trait Storage: Send + Sync + Debug + 'static {
    /// Creates `dir` (and its parents), private to the user (0700).
    fn create_dir(&self, dir: &Path) -> io::Result<()>;
    /// Creates or truncates `path`, private to the user (0600), open for reading and writing.
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Atomically replaces `to` with `from`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// The files directly in `dir`: names and lengths.
    fn list(&self, dir: &Path) -> io::Result<Vec<(String, u64)>>;
    /// Makes the creations, renames and removals in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Bytes free for writing on the store's file system.
    fn free_space(&self) -> io::Result<u64>;
}

/// An open file.
pub trait StorageFile: Send + Sync + Debug {
    fn size(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset`, or fails (`UnexpectedEof` past the end).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Fills `bufs` in order from `offset` (a scatter read: the pages of a paged cache take
    /// one system call, not one each), or fails as [`read_at`](Self::read_at) does. The
    /// default reads the buffers one by one.
    fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs.iter_mut() {
            self.read_at(at, buf)?;
            at += buf.len() as u64;
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Truncates or zero-extends.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes the file's data durable.
    fn sync(&self) -> io::Result<()>;
    /// A hint that the whole file will be read soon (read-ahead).
    fn will_need(&self) {}
    /// Whether every page of the file is in memory (the OS page cache), so reading it
    /// waits for no disk. A hint that picks how a restore reads; `false` when unknown.
    fn resident(&self) -> bool {
        false
    }
}
