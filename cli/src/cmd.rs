//! The subcommands: each module parses nothing (clap did), calls the API through
//! [`Api`] (`inject` reads only its file), renders with [`crate::render`] and writes
//! to the output it is given. Rendering is kept apart from the calls, as pure
//! functions tested beside them.

pub mod apply;
pub mod certs;
pub mod check;
pub mod delete;
pub mod describe;
pub mod diagnose;
pub mod get;
pub mod graph;
pub mod history;
pub mod inject;
pub mod log_level;
pub mod sync;
pub mod watch;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::client::{Api, CliError};
use crate::render;

/// What every subcommand is given.
#[derive(Debug)]
pub struct Ctx {
    pub api: Api,
    /// The terminal's width when standard output is one: tables are cut to it.
    pub width: Option<usize>,
}

/// Set once standard output's reader has left.
static OUTPUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` to `out`, through [`render::terminal`]: whatever a renderer let
/// through, no control character but a newline, a tab or one of meshcat's own
/// colours reaches the terminal (JSON and YAML pass unchanged). A closed pipe
/// (`meshcat apply -f dir | head -1`) is not
/// the command's failure: it goes on with its work, writing nothing more (an apply
/// finishes its writes, a check or a diagnosis still ends with its own status), and
/// [`output_closed`] tells a command that would print forever to stop. Any other
/// write error is one.
pub fn emit(out: &mut dyn Write, text: &str) -> Result<(), CliError> {
    if output_closed() {
        return Ok(());
    }
    let text = render::terminal(text);
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            OUTPUT_CLOSED.store(true, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => Err(CliError::Failed(format!(
            "cannot write to standard output: {e}"
        ))),
    }
}

/// Whether standard output's reader has left (a write met a closed pipe).
pub fn output_closed() -> bool {
    OUTPUT_CLOSED.load(Ordering::Relaxed)
}
