//! meshcat aggregator library.
