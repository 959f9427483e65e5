//! The process entry point behind the `meshcat-aggregator` binary: parses the command
//! line, sets up logging, binds the listeners and runs the aggregator until SIGTERM or
//! SIGINT. A library function so test harnesses can build the same process.

use std::process::ExitCode;

use meshcat_common::config::{init_tracing, shutdown_signal};
use tokio::net::TcpListener;
use tracing::error;

use crate::config::{self, Action};
use crate::{RunError, run};

/// Runs the aggregator as a process; the exit code to return from `main`.
pub fn main() -> ExitCode {
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
        let shutdown = shutdown_signal()?;
        let bind = |what: &'static str, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|error| RunError::Bind { what, addr, error })
        };
        let api = bind("api", config.api.addr).await?;
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
