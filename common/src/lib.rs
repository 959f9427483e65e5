//! meshcat-common: the catalog model (seed names, camelCase), its validation, the
//! agent ↔ aggregator wire messages and their MessagePack codec, and configuration
//! helpers shared by both binaries. Nothing here does network I/O.

pub mod config;
pub mod model;
pub mod validate;
pub mod wire;
