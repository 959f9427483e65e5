//! meshcat aggregator library.

pub mod ingest;
