//! An append-only file that rotates by size: `log` → `log.1` → … → `log.{keep}`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// When to rotate and how many old files to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate before a write would take the file past this size.
    pub max_bytes: u64,
    /// Rotated files kept (`log.1` is the newest).
    pub keep: usize,
}

impl Default for Rotation {
    /// 64 MiB, 4 old files.
    fn default() -> Self {
        Rotation {
            max_bytes: 64 << 20,
            keep: 4,
        }
    }
}

/// The open log file and its size.
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    rotation: Rotation,
    file: Option<File>,
    size: u64,
}

impl RotatingFile {
    pub fn new(path: &Path, rotation: Rotation) -> Self {
        RotatingFile {
            path: path.to_path_buf(),
            rotation,
            file: None,
            size: 0,
        }
    }

    fn open(&mut self) -> io::Result<&mut File> {
        if self.file.is_none() {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
            self.size = f.metadata()?.len();
            self.file = Some(f);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    fn rotated(&self, i: usize) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(format!(".{i}"));
        PathBuf::from(name)
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file = None;
        if self.rotation.keep == 0 {
            return std::fs::remove_file(&self.path);
        }
        let _ = std::fs::remove_file(self.rotated(self.rotation.keep));
        for i in (1..self.rotation.keep).rev() {
            let from = self.rotated(i);
            if from.exists() {
                std::fs::rename(&from, self.rotated(i + 1))?;
            }
        }
        std::fs::rename(&self.path, self.rotated(1))
    }

    /// Appends one line (a newline is added).
    pub fn write_line(&mut self, line: &str) -> io::Result<()> {
        self.open()?;
        let len = line.len() as u64 + 1;
        if self.size > 0 && self.size + len > self.rotation.max_bytes {
            self.rotate()?;
            self.open()?;
        }
        let f = self.file.as_mut().expect("opened above");
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        f.write_all(&buf)?;
        self.size += len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_by_size_and_keeps_only_the_newest_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/log.jsonl");
        let mut f = RotatingFile::new(
            &path,
            Rotation {
                max_bytes: 10,
                keep: 2,
            },
        );
        for line in ["aaaa", "bbbb", "cccc", "dddd", "eeee", "ffff"] {
            f.write_line(line).unwrap();
        }
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(path.clone()), "eeee\nffff\n");
        assert_eq!(read(f.rotated(1)), "cccc\ndddd\n");
        assert_eq!(read(f.rotated(2)), "aaaa\nbbbb\n");
        f.write_line("gggg").unwrap();
        assert_eq!(read(path), "gggg\n");
        assert_eq!(read(f.rotated(1)), "eeee\nffff\n");
        assert_eq!(read(f.rotated(2)), "cccc\ndddd\n");
        assert!(!f.rotated(3).exists());
    }

    #[test]
    fn appends_to_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        std::fs::write(&path, "old\n").unwrap();
        let mut f = RotatingFile::new(&path, Rotation::default());
        f.write_line("new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\nnew\n");
    }
}
