//! Limits that two parts of meshcat must agree on, written once: what an agent sends
//! and the aggregator keeps, what the aggregator reads from one sidecar document
//! wherever it reads it, and what `meshcat apply` sends in one request and the API
//! takes. A part that applies one of them names it from here, never by its value.

/// Most upstream clusters reported for one instance: the agent sends at most as many
/// (the busiest first), and the aggregator's `--max-upstream-clusters` defaults to it.
/// A sidecar of a mesh without configuration scoping knows every cluster of the mesh.
pub const MAX_UPSTREAM_CLUSTERS: usize = 20_000;
/// Most upstream hosts (over all its upstream clusters) reported for one instance: the
/// aggregator's `--max-upstream-hosts` defaults to it.
pub const MAX_UPSTREAM_HOSTS: usize = 100_000;
/// Most listeners reported and kept for one instance.
pub const MAX_LISTENERS: usize = 256;
/// Most clusters one listener's routes name, reported and kept.
pub const MAX_LISTENER_CLUSTERS: usize = 1024;
/// Most clusters read from one sidecar document (`/clusters` or `/config_dump`), for
/// a zone's services from its edge sidecar and for the diagnosis's evidence alike.
pub const MAX_SIDECAR_CLUSTERS: usize = 10_000;
/// Most records in one bulk registration (`POST /clusters` with an array): the API
/// refuses more, and `meshcat apply` sends no more in one request.
pub const MAX_BULK_CLUSTERS: usize = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    /// Each limit is the figure the operator's documentation gives: a change here is
    /// a change there.
    #[test]
    fn the_documented_figures() {
        let doc = |name: &str| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../docs")
                .join(name);
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let thousands = |n: usize| {
            let s = n.to_string();
            let mut out = String::new();
            for (i, c) in s.chars().enumerate() {
                if i > 0 && (s.len() - i) % 3 == 0 {
                    out.push(',');
                }
                out.push(c);
            }
            out
        };
        let configuration = doc("configuration.md");
        assert!(
            configuration.contains(&format!(
                "`MESHCAT_MAX_UPSTREAM_CLUSTERS` | `{MAX_UPSTREAM_CLUSTERS}`"
            )),
            "docs/configuration.md gives another --max-upstream-clusters default"
        );
        assert!(
            configuration.contains(&format!(
                "`MESHCAT_MAX_UPSTREAM_HOSTS` | `{MAX_UPSTREAM_HOSTS}`"
            )),
            "docs/configuration.md gives another --max-upstream-hosts default"
        );
        let api = doc("api.md");
        assert!(
            api.contains(&format!(
                "clusters per zone from an edge sidecar's configuration | {}",
                thousands(MAX_SIDECAR_CLUSTERS)
            )),
            "docs/api.md gives another edge-cluster limit"
        );
        let cli = doc("cli.md");
        assert!(
            cli.contains(&format!("up to {} records", thousands(MAX_BULK_CLUSTERS))),
            "docs/cli.md gives another bulk size"
        );
        let wire = doc("wire.md");
        assert!(
            wire.contains(&format!(
                "`--max-upstream-clusters` ({})",
                thousands(MAX_UPSTREAM_CLUSTERS)
            )),
            "docs/wire.md gives another upstream limit"
        );
    }
}
