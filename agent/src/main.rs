//! The `meshcat-agent` binary: parses the configuration, sets up logging and runs
//! the agent until SIGTERM or SIGINT.

use meshcat_agent::AgentConfig;
use meshcat_common::config::{EXIT_USAGE, init_tracing, shutdown_signal};

#[tokio::main]
async fn main() {
    let config = AgentConfig::from_args();
    init_tracing(config.log_format);
    let listener = match tokio::net::TcpListener::bind(config.ops_addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "meshcat-agent: cannot listen on --ops-addr {}: {e}",
                config.ops_addr
            );
            std::process::exit(EXIT_USAGE);
        }
    };
    let shutdown = match shutdown_signal() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("meshcat-agent: cannot install signal handlers: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = meshcat_agent::run(config, listener, shutdown).await {
        tracing::error!(error = %e, "Agent failed.");
        std::process::exit(1);
    }
}
