//! The `meshcat` command: the operator's tool for the catalog API, in the manner of
//! kubectl, istioctl and linkerd (contract section 16). `get`, `describe`, `graph`,
//! `history` and `watch` read; `apply` (catalog as code, [`catalog`]), `delete` and
//! `log-level set` write; `check`, `diagnose` and `sync` (each sidecar's sync with its
//! zone's control server, [`control`]) judge; `completion` prints shell completions;
//! `inject` adds the agent to Kubernetes workloads as a sidecar, with no API (contract
//! section 18). [`run`] takes the parsed command line and answers the exit status: 0
//! done, 1 a check, diagnosis, sync or write failed, 2 bad usage, a bad file or an
//! unreachable API.

pub mod args;
pub mod catalog;
pub mod client;
pub mod cmd;
pub mod control;
pub mod render;
pub mod sse;
pub mod text;

use std::io::Write;

use clap::CommandFactory;
use meshcat_common::config::read_token_file;

use crate::args::{Cli, Command};
use crate::client::{Api, CliError, EXIT_OK};
use crate::cmd::Ctx;

/// Runs one command line, writing to standard output (colours stripped off a
/// terminal and under `NO_COLOR`) and errors to standard error; answers the exit
/// status.
pub async fn run(cli: Cli) -> u8 {
    let mut out = anstream::stdout();
    match execute(cli, &mut out).await {
        Ok(()) | Err(CliError::Closed) => EXIT_OK,
        Err(e) => {
            let _ = out.flush();
            e.report();
            e.exit_code()
        }
    }
}

async fn execute(cli: Cli, out: &mut dyn Write) -> Result<(), CliError> {
    // Neither needs the API nor a token: a script out, or a file in and out.
    let cli = match cli.command {
        Command::Completion { shell } => {
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "meshcat", &mut buf);
            return cmd::emit(out, &String::from_utf8_lossy(&buf));
        }
        Command::Inject(a) => return cmd::inject::run(a, out),
        _ => cli,
    };
    let token = cli
        .token_file
        .as_deref()
        .map(read_token_file)
        .transpose()
        .map_err(CliError::File)?;
    let ctx = Ctx {
        api: Api::new(&cli.api, token, Some(cli.timeout))?,
        width: render::terminal_width(),
    };
    match cli.command {
        Command::Get { what } => cmd::get::run(&ctx, what, out).await,
        Command::Describe { what } => cmd::describe::run(&ctx, what, out).await,
        Command::Apply(a) => cmd::apply::run(&ctx, a, out).await,
        Command::Delete { what } => cmd::delete::run(&ctx, what, out).await,
        Command::LogLevel(a) => cmd::log_level::run(&ctx, a.action, out).await,
        Command::Graph(a) => cmd::graph::run(&ctx, a, out).await,
        Command::History(a) => cmd::history::run(&ctx, a, out).await,
        Command::Watch(a) => cmd::watch::run(&ctx, a, out).await,
        Command::Sync(a) => cmd::sync::run(&ctx, a, out).await,
        Command::Certs(a) => cmd::certs::run(&ctx, a, out).await,
        Command::Check => cmd::check::run(&ctx, out).await,
        Command::Diagnose(a) => cmd::diagnose::run(&ctx, a, out).await,
        Command::Completion { .. } | Command::Inject(_) => unreachable!("answered above"),
    }
}
