//! `--device` as an operator meets it when the GPU can't be used: the server binary exits
//! at start, non-zero, with one line that says why (no panic, no backtrace). The device is
//! named by the flag or by `MTPLX_DEVICE`; a build without the `cuda` feature says how to
//! build one, a build with it says the device did not open, and a hybrid model is refused
//! before any device is opened.

mod serve_support;

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;

use serve_support::process::PATIENCE;

/// Runs the server binary with `args` (and `env`) until it exits; fails the test if it
/// is still running after [`PATIENCE`] (it started serving, which it must not).
fn run_to_exit(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String) {
    let stderr = dir.join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mtplx-serve-under-test"))
        .args(["--port", "0", "--ssd-session-cache", "off"])
        .args(args)
        .envs(env.iter().copied())
        .env("MTPLX_HOME", dir.join("home"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .expect("start the server binary");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("the server did not exit");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    (status, std::fs::read_to_string(stderr).unwrap())
}

/// The one line a start refused for `device` prints, checked: a non-zero exit, not a
/// panic, the error alone on stderr, naming the device.
fn refusal(status: ExitStatus, stderr: &str, device: &str) -> String {
    assert_eq!(status.code(), Some(1), "{status}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    let prefix = format!("mtplx-serve: --device {device}: ");
    assert!(lines[0].starts_with(&prefix), "{stderr}");
    lines[0].to_owned()
}

#[test]
fn a_gpu_that_can_not_be_used_stops_the_start_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let model = serve_support::model_path();
    let model = model.to_str().unwrap();
    // No machine has device 999 (without a driver, without a GPU, or with eight); the
    // flag names it, then the environment does.
    let by_flag = run_to_exit(dir.path(), &["--model", model, "--device", "cuda:999"], &[]);
    let by_env = run_to_exit(
        dir.path(),
        &["--model", model],
        &[("MTPLX_DEVICE", "cuda:999")],
    );
    for (status, stderr) in [by_flag, by_env] {
        let line = refusal(status, &stderr, "cuda:999");
        if cfg!(feature = "cuda") {
            assert!(line.contains("could not be opened"), "{line}");
        } else {
            assert!(line.contains("without CUDA support"), "{line}");
            assert!(line.contains("--features cuda"), "{line}");
        }
    }
    let (status, stderr) = run_to_exit(dir.path(), &["--device", "cuda:x"], &[]);
    assert_eq!(status.code(), Some(2), "a usage error: {stderr}");
    assert!(
        stderr.contains("--device") && stderr.contains("cuda:x"),
        "{stderr}"
    );
}

#[test]
fn a_hybrid_model_is_refused_on_a_gpu_before_the_device_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    // Only the family, from `config.json`: no weights, no tokenizer, and no GPU needed to
    // refuse it.
    let model = dir.path().join("hybrid");
    std::fs::create_dir(&model).unwrap();
    std::fs::write(model.join("config.json"), r#"{"model_type": "qwen3_next"}"#).unwrap();
    let (status, stderr) = run_to_exit(
        dir.path(),
        &["--model", model.to_str().unwrap(), "--device", "cuda"],
        &[],
    );
    let line = refusal(status, &stderr, "cuda:0");
    if cfg!(feature = "cuda") {
        assert!(
            line.contains("hybrid") && line.contains("--device cpu"),
            "{line}"
        );
    } else {
        assert!(line.contains("without CUDA support"), "{line}");
    }
}
