//! The aggregator process the replica tests start: the same entry point as the
//! `meshcat-aggregator` binary, built with this crate so its tests always run the
//! current code (Cargo gives integration tests only their own package's binaries).

fn main() -> std::process::ExitCode {
    meshcat_aggregator::process::main()
}
