//! The official `openai` and `anthropic` Python clients against a real server socket:
//! chat (whole and streamed), completions, responses, messages, count_tokens, tool-call
//! round trips and error classes (see `serve_sdk/check_sdks.py`).
//!
//! The clients come from PyPI, pinned, into a virtualenv under Cargo's target tmp dir
//! (made once, reused). `MTPLX_SDK_PYTHON` names an interpreter that already has them
//! (offline machines).

mod serve_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serve_support::socket::start;
use serve_support::state;

const PACKAGES: &[&str] = &["openai==3.57.0", "anthropic==2.14.0"];

fn has_sdks(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import openai, anthropic"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Python with the pinned SDKs.
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("MTPLX_SDK_PYTHON") {
        let p = PathBuf::from(p);
        assert!(
            has_sdks(&p),
            "MTPLX_SDK_PYTHON={} lacks openai/anthropic",
            p.display()
        );
        return p;
    }
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sdk-venv");
    let python = venv.join("bin").join("python3");
    if !has_sdks(&python) {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
        run(Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(PACKAGES));
    }
    python
}

#[test]
fn official_python_clients_work_against_the_server() {
    let python = python();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let state = state();
    let model = state.model_id().to_owned();
    let addr = rt.block_on(start(state));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve_sdk/check_sdks.py");
    let out = Command::new(python)
        .arg(&script)
        .env("MTPLX_BASE_URL", format!("http://{addr}"))
        .env("MTPLX_MODEL_ID", model)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("all SDK checks passed"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
