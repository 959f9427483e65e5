//! The subcommands: each module parses nothing (clap did), calls the API through
//! [`Api`], renders with [`crate::render`] and writes to the output it is given.
//! Rendering is kept apart from the calls, as pure functions tested beside them.

pub mod apply;
pub mod check;
pub mod delete;
pub mod describe;
pub mod diagnose;
pub mod get;
pub mod graph;
pub mod history;
pub mod log_level;
pub mod watch;

use std::io::Write;

use crate::client::{Api, CliError};

/// What every subcommand is given.
#[derive(Debug)]
pub struct Ctx {
    pub api: Api,
    /// The terminal's width when standard output is one: tables are cut to it.
    pub width: Option<usize>,
}

/// Writes `text` to `out`. A closed pipe (`meshcat get clusters | head`) ends the
/// command quietly; any other write error is one.
pub fn emit(out: &mut dyn Write, text: &str) -> Result<(), CliError> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::Closed),
        Err(e) => Err(CliError::Failed(format!(
            "cannot write to standard output: {e}"
        ))),
    }
}
