//! `meshcat-aggregator`: parses the command line, sets up logging, binds the
//! listeners and runs the aggregator until SIGTERM or SIGINT.

use std::process::ExitCode;

use meshcat_aggregator::config::{self, Action};
use meshcat_aggregator::{RunError, run};
use meshcat_common::config::init_tracing;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info};

fn main() -> ExitCode {
    let Action::Serve(config) = config::parse_or_exit();
    init_tracing(config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            error!(error = %e, "Cannot start the async runtime.");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let shutdown = shutdown_on_signal()?;
        let bind = |what: &'static str, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|error| RunError::Bind { what, addr, error })
        };
        let api = bind("api", config.api_addr).await?;
        let ops = bind("ops", config.ops_addr).await?;
        run(*config, api, ops, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "Aggregator failed.");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed here, before any
/// listener exists, so a signal sent as soon as the addresses are logged is caught.
fn shutdown_on_signal() -> Result<impl Future<Output = ()>, RunError> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM received, shutting down."),
            _ = int.recv() => info!("SIGINT received, shutting down."),
        }
    })
}
