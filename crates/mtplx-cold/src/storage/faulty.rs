//! An in-memory file system that models what survives a crash, and injects faults.
//!
//! Durability model (what a journaling file system promises, no more):
//! - a file's data is durable once the file is synced; writes since are pending and, at a
//!   crash, each is kept, lost or torn (a prefix kept);
//! - a creation, rename or removal is durable once its directory (the destination's, for
//!   a rename) is synced; pending ones are each kept or lost at a crash;
//! - directories themselves are durable once created.
//!
//! Every mutating operation is a numbered step. [`FaultyStorage::crash_at`] makes step N
//! fail and every operation after it fail with EIO (reads too), as if the process died
//! there; [`FaultyStorage::crash_image`] is what a reboot would find on disk.
//! [`FaultyStorage::hold_creates`] stalls every file creation until released: how a test
//! keeps a spill in the writer while it looks at what the bank does meanwhile.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::{Storage, StorageFile};

/// A one-shot failure of a numbered step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The step fails with ENOSPC; nothing is written.
    NoSpace,
    /// The step fails with EIO; nothing is written.
    Io,
    /// A write stores only its first half, then fails with EIO.
    Torn,
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Clone, Default)]
struct Node {
    data: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

#[derive(Debug, Clone)]
enum NsOp {
    Link {
        path: PathBuf,
        node: usize,
    },
    Unlink {
        path: PathBuf,
    },
    /// Durable once the destination directory is synced, whether or not the source name
    /// ever was.
    Rename {
        from: PathBuf,
        to: PathBuf,
        node: usize,
    },
}

#[derive(Debug)]
struct Sim {
    nodes: Vec<Node>,
    names: BTreeMap<PathBuf, usize>,
    durable_names: BTreeMap<PathBuf, usize>,
    dirs: BTreeSet<PathBuf>,
    /// Pending namespace operations, with the directory whose sync makes each durable.
    pending_ns: Vec<(PathBuf, NsOp)>,
    steps: u64,
    crash_at: Option<u64>,
    crashed: bool,
    faults: HashMap<u64, Fault>,
    free_space: u64,
    reads: HashMap<PathBuf, u64>,
    bytes_read: u64,
    resident: bool,
}

/// See the module docs. Cloning shares the same file system.
#[derive(Debug, Clone)]
pub struct FaultyStorage {
    sim: Arc<Mutex<Sim>>,
    gate: Arc<Gate>,
}

/// Holds on file creation: creations wait while `held` is not zero.
#[derive(Debug, Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    held: usize,
    /// Creations waiting at the gate now.
    waiting: usize,
}

impl Gate {
    fn state(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits while the gate is held (called before a creation takes the file system's lock).
    fn pass(&self) {
        let mut s = self.state();
        if s.held == 0 {
            return;
        }
        s.waiting += 1;
        self.changed.notify_all();
        let mut s = self
            .changed
            .wait_while(s, |s| s.held > 0)
            .unwrap_or_else(|p| p.into_inner());
        s.waiting -= 1;
        self.changed.notify_all();
    }
}

/// While alive, every [`Storage::create`] on its storage waits; dropping it lets them go.
#[derive(Debug)]
pub struct CreateHold {
    gate: Arc<Gate>,
}

impl CreateHold {
    /// Blocks until at least `n` creations are waiting at the hold (a writer parked before
    /// its first blob, say).
    pub fn wait_for_waiters(&self, n: usize) {
        let s = self.gate.state();
        let _s = self
            .gate
            .changed
            .wait_while(s, |s| s.waiting < n)
            .unwrap_or_else(|p| p.into_inner());
    }
}

impl Drop for CreateHold {
    fn drop(&mut self) {
        self.gate.state().held -= 1;
        self.gate.changed.notify_all();
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

fn not_found() -> io::Error {
    io::Error::from(io::ErrorKind::NotFound)
}

fn parent(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

impl Default for FaultyStorage {
    fn default() -> Self {
        FaultyStorage::new()
    }
}

impl FaultyStorage {
    pub fn new() -> FaultyStorage {
        FaultyStorage::from_parts(BTreeMap::new(), Vec::new(), BTreeSet::new())
    }

    fn from_parts(
        names: BTreeMap<PathBuf, usize>,
        nodes: Vec<Node>,
        dirs: BTreeSet<PathBuf>,
    ) -> FaultyStorage {
        FaultyStorage {
            sim: Arc::new(Mutex::new(Sim {
                nodes,
                durable_names: names.clone(),
                names,
                dirs,
                pending_ns: Vec::new(),
                steps: 0,
                crash_at: None,
                crashed: false,
                faults: HashMap::new(),
                free_space: 1 << 40,
                reads: HashMap::new(),
                bytes_read: 0,
                resident: false,
            })),
            gate: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Sim> {
        self.sim.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Mutating steps so far.
    pub fn steps(&self) -> u64 {
        self.lock().steps
    }

    /// Step `step` (counted from the start, see [`FaultyStorage::steps`]) is where the
    /// process dies.
    pub fn crash_at(&self, step: u64) {
        self.lock().crash_at = Some(step);
    }

    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// Step `step` fails once with `fault`.
    pub fn inject(&self, step: u64, fault: Fault) {
        self.lock().faults.insert(step, fault);
    }

    /// Stalls every file creation (the first step of every blob write) until the returned
    /// hold is dropped.
    pub fn hold_creates(&self) -> CreateHold {
        self.gate.state().held += 1;
        CreateHold {
            gate: self.gate.clone(),
        }
    }

    /// The next mutating step fails once with `fault`.
    pub fn fail_next(&self, fault: Fault) {
        let mut s = self.lock();
        let next = s.steps + 1;
        s.faults.insert(next, fault);
    }

    pub fn set_free_space(&self, bytes: u64) {
        self.lock().free_space = bytes;
    }

    /// Whether files report themselves in memory ([`StorageFile::resident`]), which
    /// selects a restore's path for resident blobs. Off by default.
    pub fn set_resident(&self, resident: bool) {
        self.lock().resident = resident;
    }

    /// Reads of each file since the last reset (one per `read_at` call).
    pub fn reads(&self) -> HashMap<PathBuf, u64> {
        self.lock().reads.clone()
    }

    pub fn bytes_read(&self) -> u64 {
        self.lock().bytes_read
    }

    pub fn reset_read_stats(&self) {
        let mut s = self.lock();
        s.reads.clear();
        s.bytes_read = 0;
    }

    /// The files directly in `dir` and their lengths, without counting a step.
    pub fn files(&self, dir: &Path) -> Vec<(PathBuf, u64)> {
        let s = self.lock();
        s.names
            .iter()
            .filter(|(p, _)| parent(p) == dir)
            .map(|(p, &n)| (p.clone(), s.nodes[n].data.len() as u64))
            .collect()
    }

    /// Flips one bit of a file, as bit rot would (durably; counts no step).
    pub fn flip_bit(&self, path: &Path, bit: u64) -> io::Result<()> {
        self.edit(path, |data| {
            let byte = (bit / 8) as usize;
            let b = data.get_mut(byte).ok_or_else(not_found)?;
            *b ^= 1 << (bit % 8);
            Ok(())
        })
    }

    /// Replaces a file's content durably (counts no step): truncation, foreign bytes.
    pub fn overwrite(&self, path: &Path, content: Vec<u8>) -> io::Result<()> {
        self.edit(path, |data| {
            *data = content;
            Ok(())
        })
    }

    fn edit(&self, path: &Path, f: impl FnOnce(&mut Vec<u8>) -> io::Result<()>) -> io::Result<()> {
        let mut s = self.lock();
        let n = *s.names.get(path).ok_or_else(not_found)?;
        let node = &mut s.nodes[n];
        f(&mut node.data)?;
        node.durable = node.data.clone();
        node.pending.clear();
        Ok(())
    }

    /// What the disk holds after a crash now: durable state plus, chosen by `seed`, some of
    /// the pending operations (each kept, lost, or for a write, torn). The new storage has
    /// no faults armed.
    pub fn crash_image(&self, seed: u64) -> FaultyStorage {
        let s = self.lock();
        let mut rng = SplitMix(seed);
        let mut names = s.durable_names.clone();
        for (_, op) in &s.pending_ns {
            if rng.next() & 1 == 0 {
                continue;
            }
            match op {
                NsOp::Link { path, node } => {
                    names.insert(path.clone(), *node);
                }
                NsOp::Unlink { path } => {
                    names.remove(path);
                }
                NsOp::Rename { from, to, node } => {
                    names.remove(from);
                    names.insert(to.clone(), *node);
                }
            }
        }
        let mut nodes = Vec::new();
        let mut renumber = HashMap::new();
        for n in names.values_mut() {
            let id = *renumber.entry(*n).or_insert_with(|| {
                let old = &s.nodes[*n];
                let mut data = old.durable.clone();
                for p in &old.pending {
                    match (rng.next() % 3, p) {
                        (0, _) => {}
                        (1, Pending::Write { offset, data: w }) => {
                            apply_write(&mut data, *offset, w)
                        }
                        (_, Pending::Write { offset, data: w }) => {
                            let keep = (rng.next() as usize) % (w.len() + 1);
                            apply_write(&mut data, *offset, &w[..keep]);
                        }
                        (_, Pending::SetLen(len)) => data.resize(*len as usize, 0),
                    }
                }
                nodes.push(Node {
                    durable: data.clone(),
                    data,
                    pending: Vec::new(),
                });
                nodes.len() - 1
            });
            *n = id;
        }
        FaultyStorage::from_parts(names, nodes, s.dirs.clone())
    }
}

fn apply_write(data: &mut Vec<u8>, offset: u64, w: &[u8]) {
    let end = offset as usize + w.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[offset as usize..end].copy_from_slice(w);
}

/// A small deterministic generator (no dependency for a test model).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl Sim {
    /// Counts a mutating step; fails it if a crash or a fault is armed there.
    fn step(&mut self) -> Result<Option<Fault>, io::Error> {
        if self.crashed {
            return Err(eio());
        }
        self.steps += 1;
        if self.crash_at == Some(self.steps) {
            self.crashed = true;
            return Ok(Some(Fault::Torn));
        }
        Ok(self.faults.remove(&self.steps))
    }

    fn check_alive(&self) -> io::Result<()> {
        if self.crashed {
            Err(eio())
        } else {
            Ok(())
        }
    }

    fn fail(fault: Fault) -> io::Error {
        match fault {
            Fault::NoSpace => io::Error::from_raw_os_error(libc::ENOSPC),
            Fault::Io | Fault::Torn => eio(),
        }
    }

    fn dir_exists(&self, dir: &Path) -> bool {
        dir.as_os_str().is_empty() || self.dirs.contains(dir)
    }
}

impl Storage for FaultyStorage {
    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if let Some(f) = s.step()? {
            return Err(Sim::fail(f));
        }
        for a in dir.ancestors() {
            if !a.as_os_str().is_empty() {
                s.dirs.insert(a.to_path_buf());
            }
        }
        Ok(())
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        self.gate.pass();
        let mut s = self.lock();
        if let Some(f) = s.step()? {
            return Err(Sim::fail(f));
        }
        if !s.dir_exists(&parent(path)) {
            return Err(not_found());
        }
        let node = match s.names.get(path) {
            Some(&n) => {
                s.nodes[n].data.clear();
                s.nodes[n].pending.push(Pending::SetLen(0));
                n
            }
            None => {
                s.nodes.push(Node::default());
                let n = s.nodes.len() - 1;
                s.names.insert(path.to_path_buf(), n);
                let op = NsOp::Link {
                    path: path.to_path_buf(),
                    node: n,
                };
                s.pending_ns.push((parent(path), op));
                n
            }
        };
        Ok(Box::new(SimFile {
            sim: self.sim.clone(),
            node,
            path: path.to_path_buf(),
        }))
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let s = self.lock();
        s.check_alive()?;
        let node = *s.names.get(path).ok_or_else(not_found)?;
        Ok(Box::new(SimFile {
            sim: self.sim.clone(),
            node,
            path: path.to_path_buf(),
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if let Some(f) = s.step()? {
            return Err(Sim::fail(f));
        }
        if !s.dir_exists(&parent(to)) {
            return Err(not_found());
        }
        let n = s.names.remove(from).ok_or_else(not_found)?;
        s.names.insert(to.to_path_buf(), n);
        let op = NsOp::Rename {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
            node: n,
        };
        s.pending_ns.push((parent(to), op));
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if let Some(f) = s.step()? {
            return Err(Sim::fail(f));
        }
        s.names.remove(path).ok_or_else(not_found)?;
        let op = NsOp::Unlink {
            path: path.to_path_buf(),
        };
        s.pending_ns.push((parent(path), op));
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<(String, u64)>> {
        let s = self.lock();
        s.check_alive()?;
        if !s.dir_exists(dir) {
            return Err(not_found());
        }
        Ok(s.names
            .iter()
            .filter(|(p, _)| parent(p) == dir)
            .filter_map(|(p, &n)| {
                let name = p.file_name()?.to_str()?.to_string();
                Some((name, s.nodes[n].data.len() as u64))
            })
            .collect())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if let Some(f) = s.step()? {
            return Err(Sim::fail(f));
        }
        let pending = std::mem::take(&mut s.pending_ns);
        for (d, op) in pending {
            if d != dir {
                s.pending_ns.push((d, op));
                continue;
            }
            match op {
                NsOp::Link { path, node } => {
                    s.durable_names.insert(path, node);
                }
                NsOp::Unlink { path } => {
                    s.durable_names.remove(&path);
                }
                NsOp::Rename { from, to, node } => {
                    s.durable_names.remove(&from);
                    s.durable_names.insert(to, node);
                }
            }
        }
        Ok(())
    }

    fn free_space(&self) -> io::Result<u64> {
        let s = self.lock();
        s.check_alive()?;
        Ok(s.free_space)
    }
}

#[derive(Debug)]
struct SimFile {
    sim: Arc<Mutex<Sim>>,
    node: usize,
    path: PathBuf,
}

impl SimFile {
    fn lock(&self) -> MutexGuard<'_, Sim> {
        self.sim.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl StorageFile for SimFile {
    fn size(&self) -> io::Result<u64> {
        let s = self.lock();
        s.check_alive()?;
        Ok(s.nodes[self.node].data.len() as u64)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut s = self.lock();
        s.check_alive()?;
        *s.reads.entry(self.path.clone()).or_default() += 1;
        s.bytes_read += buf.len() as u64;
        let data = &s.nodes[self.node].data;
        let end = (offset as usize).checked_add(buf.len());
        match end.and_then(|end| data.get(offset as usize..end)) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
        }
    }

    fn resident(&self) -> bool {
        let s = self.lock();
        s.resident && s.check_alive().is_ok()
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut s = self.lock();
        let fault = s.step()?;
        let keep = match fault {
            None => data.len(),
            Some(Fault::Torn) => data.len() / 2,
            Some(f) => return Err(Sim::fail(f)),
        };
        let node = &mut s.nodes[self.node];
        apply_write(&mut node.data, offset, &data[..keep]);
        node.pending.push(Pending::Write {
            offset,
            data: data[..keep].to_vec(),
        });
        match fault {
            None => Ok(()),
            Some(f) => Err(Sim::fail(f)),
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.lock();
        if let Some(f) = s.step()? {
            return Err(Sim::fail(f));
        }
        let node = &mut s.nodes[self.node];
        node.data.resize(len as usize, 0);
        node.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut s = self.lock();
        if let Some(f) = s.step()? {
            return Err(Sim::fail(f));
        }
        let node = &mut s.nodes[self.node];
        node.durable = node.data.clone();
        node.pending.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_rename_and_data_can_be_lost_synced_ones_cannot() {
        let st = FaultyStorage::new();
        st.create_dir(Path::new("d")).unwrap();
        let f = st.create(Path::new("d/a")).unwrap();
        f.write_at(0, b"durable").unwrap();
        f.sync().unwrap();
        st.sync_dir(Path::new("d")).unwrap();
        f.write_at(0, b"PENDING").unwrap();
        st.rename(Path::new("d/a"), Path::new("d/b")).unwrap();

        let mut outcomes = BTreeSet::new();
        for seed in 0..64 {
            let img = st.crash_image(seed);
            let files = img.files(Path::new("d"));
            assert_eq!(files.len(), 1, "exactly one name survives");
            let f = img.open(&files[0].0).unwrap();
            let mut buf = vec![0; 7];
            f.read_at(0, &mut buf).unwrap();
            outcomes.insert((files[0].0.clone(), buf));
        }
        assert!(outcomes.contains(&(PathBuf::from("d/a"), b"durable".to_vec())));
        assert!(outcomes.iter().any(|(p, _)| p == Path::new("d/b")));
        assert!(outcomes.iter().any(|(_, b)| b == b"PENDING"));
    }

    #[test]
    fn a_crash_fails_the_step_and_everything_after() {
        let st = FaultyStorage::new();
        st.create_dir(Path::new("d")).unwrap();
        st.crash_at(st.steps() + 2);
        let f = st.create(Path::new("d/a")).unwrap();
        assert!(f.write_at(0, b"x").is_err());
        assert!(f.sync().is_err());
        assert!(st.list(Path::new("d")).is_err());
        assert!(st.crashed());
    }
}
