//! `mtplx-serve`: see `--help`.

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("MTPLX_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours for a terminal; a log file (systemd, Docker, a redirect) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = mtplx_serve::Config::parse();
    match mtplx_serve::serve(config).await {
        // Exit now: the stop has flushed what it could within its deadline, and dropping
        // the state would wait for writes still running past it (an interrupted write is
        // safe: the next start reconciles it).
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("mtplx-serve: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
