//! meshcat-common: the catalog model (seed names, camelCase), its validation, the
//! agent ↔ aggregator wire messages and their MessagePack codec, and configuration
//! helpers shared by both binaries, the TLS set-up of the QUIC link, the frame
//! transport over quinn streams, and what both read in the sidecar's log.

pub mod config;
pub mod envoy_log;
pub mod http;
pub mod level;
pub mod model;
pub mod tls;
pub mod transport;
pub mod validate;
pub mod wire;
