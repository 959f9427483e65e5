//! `meshcat`: parses the command line and runs it (see the library).

use std::process::ExitCode;

use clap::Parser;
use meshcat_cli::args::Cli;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    ExitCode::from(meshcat_cli::run(Cli::parse()).await)
}
