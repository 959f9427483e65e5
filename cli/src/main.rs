//! `meshcat`: run a diagnosis through the catalog API and print a checklist.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use meshcat_cli::{DiagnoseRequest, EXIT_ERROR, EXIT_FAIL, EXIT_PASS, failed, fetch, render};
use meshcat_common::config::{EXIT_USAGE, parse_positive_duration, read_token_file};
use meshcat_common::envoy_log::MAX_DEBUG_WINDOW_SECONDS;

/// meshcat: the service catalog and troubleshooting companion of an Envoy mesh.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Base URL of the aggregator's catalog API.
    #[arg(
        long,
        env = "MESHCAT_API",
        default_value = "http://127.0.0.1:9080",
        global = true
    )]
    api: String,
    /// File holding the bearer token to send (the read token, when the aggregator has one).
    #[arg(long, env = "MESHCAT_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,
    /// How long to wait for the answer (a diagnosis with a debug window takes longer).
    #[arg(long, env = "MESHCAT_TIMEOUT", default_value = "60s", value_parser = parse_positive_duration, global = true)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the mesh troubleshooting playbook for a cluster and print a checklist.
    /// Exits 0 when every step passed, 1 when a step failed, 2 when the diagnosis
    /// could not be run.
    Diagnose {
        /// The cluster (clusterName) to diagnose.
        cluster: String,
        /// The zone (mesh) the cluster belongs to.
        #[arg(long)]
        zone: String,
        /// The symptom seen: upstream_connect_error, no_healthy_upstream,
        /// ingress_502_503 or missing_metrics. Without it every check runs.
        #[arg(long)]
        symptom: Option<String>,
        /// The request path that fails, to filter the sidecar logs on.
        #[arg(long)]
        path: Option<String>,
        /// Raise the sidecars read to debug for that many seconds (1 to 300) before
        /// collecting, to catch TLS failures; replay the failing request meanwhile.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_DEBUG_WINDOW_SECONDS)))]
        debug_seconds: Option<u32>,
        /// Follow failing calls to the clusters called, diagnosing at most this many
        /// clusters in all (1 to 5; the server's default is 3).
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=5))]
        max_hops: Option<u8>,
        /// text: a checklist; json: the API's report as is.
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let token = match cli.token_file.as_deref().map(read_token_file).transpose() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("meshcat: {e}");
            return ExitCode::from(EXIT_USAGE as u8);
        }
    };
    let Command::Diagnose {
        cluster,
        zone,
        symptom,
        path,
        debug_seconds,
        max_hops,
        output,
    } = cli.command;
    let req = DiagnoseRequest {
        api: cli.api,
        token,
        cluster,
        zone,
        symptom,
        path,
        debug_seconds,
        max_hops,
        timeout: cli.timeout,
    };
    match fetch(&req).await {
        Ok((raw, report)) => {
            let text = match output {
                Output::Text => render(&report),
                Output::Json => format!("{raw:#}\n"),
            };
            #[allow(clippy::print_stdout)]
            {
                print!("{text}");
            }
            let code = if failed(&report) {
                EXIT_FAIL
            } else {
                EXIT_PASS
            };
            ExitCode::from(code as u8)
        }
        Err(e) => {
            eprintln!("meshcat: {e}");
            ExitCode::from(EXIT_ERROR as u8)
        }
    }
}
