//! `meshcat-aggregator`: parses the command line, sets up logging, binds the
//! listeners and runs the aggregator until SIGTERM or SIGINT.

use std::process::ExitCode;

use meshcat_aggregator::config::{self, Action};
use meshcat_aggregator::{RunError, run};
use meshcat_common::config::{init_tracing, shutdown_signal};
use tokio::net::TcpListener;
use tracing::error;

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
        let shutdown = shutdown_signal()?;
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
