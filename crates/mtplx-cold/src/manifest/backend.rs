//! redb's file goes through [`Storage`] too, so crash tests cover the manifest.

use std::fmt;
use std::io;

use crate::storage::StorageFile;

pub(crate) struct Backend(pub(crate) Box<dyn StorageFile>);

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Backend").field(&self.0).finish()
    }
}

impl redb::StorageBackend for Backend {
    fn len(&self) -> io::Result<u64> {
        self.0.size()
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0; len];
        self.0.read_at(offset, &mut buf)?;
        Ok(buf)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        self.0.sync()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_at(offset, data)
    }
}
