//! The `meshcat-agent` binary: parses the configuration, sets up logging and runs
//! the agent until SIGTERM or SIGINT.

use meshcat_agent::AgentConfig;
use meshcat_common::config::{EXIT_USAGE, init_tracing, shutdown_signal};

/// One runtime thread: the agent waits on sidecars and the aggregator far more than
/// it computes (a scrape of a sidecar with 1,000 upstream clusters takes under 10 ms
/// of CPU). A runtime with a worker per core would give a big node's agent dozens of
/// threads, each with its own allocator arena holding freed pages: on 2 cores that
/// alone took the agent from 15 to 22 MiB resident (docs/benchmarks.md). The one heavy
/// computation, reading a `/config_dump` after a configuration change (about 5 ms of
/// CPU per MB), runs on this thread for dumps up to 4 MiB and on a thread of the
/// blocking pool above (up to the 32 MiB read limit), one at a time, so that a big
/// dump holds back neither the other sidecars' scrapes nor the connection to the
/// aggregator.
#[tokio::main(flavor = "current_thread")]
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
