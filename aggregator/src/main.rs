//! `meshcat-aggregator`: the process entry point lives in the library
//! ([`meshcat_aggregator::process::main`]).

/// mimalloc rather than the system allocator: with 10,000 agents the ingest spends
/// about a third less CPU (measured in docs/benchmarks.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    meshcat_aggregator::process::main()
}
