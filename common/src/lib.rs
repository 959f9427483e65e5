//! meshcat-common: the catalog model (seed names, camelCase), its validation, the
//! agent ↔ aggregator wire messages and their MessagePack codec, and configuration
//! helpers shared by both binaries, the TLS set-up of the QUIC link, the frame
//! transport over quinn streams, what both read in the sidecar's log, and what the
//! agent and `meshcat inject` read on a Kubernetes pod.

pub mod config;
pub mod config_dump;
#[cfg(any(test, feature = "differential"))]
pub mod differential;
pub mod envoy_log;
pub mod http;
pub mod identity;
pub mod level;
pub mod limits;
pub mod mesh_names;
pub mod model;
pub mod pods;
pub mod sync;
pub mod tls;
pub mod transport;
pub mod validate;
pub mod wire;
