//! `meshcat-aggregator`: the process entry point lives in the library
//! ([`meshcat_aggregator::entry::main`]).

fn main() -> std::process::ExitCode {
    meshcat_aggregator::entry::main()
}
