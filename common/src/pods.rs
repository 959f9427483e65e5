//! What meshcat reads on a Kubernetes pod, written once for the agent's pod discovery
//! and `meshcat inject`: the label a pod opts in with, the annotations that pick its
//! cluster, mesh, admin port and sidecar container, and the admin port and container
//! name of each mesh's sidecars (contract sections 6 and 18).

/// The label a pod opts in with (`"true"`).
pub const SCRAPE_LABEL: &str = "meshcat.io/scrape";
/// The annotation naming the pod's cluster (service).
pub const CLUSTER_ANNOTATION: &str = "meshcat.io/cluster";
/// The annotation naming the sidecar's admin port.
pub const ADMIN_PORT_ANNOTATION: &str = "meshcat.io/admin-port";
/// The annotation naming the sidecar container.
pub const SIDECAR_ANNOTATION: &str = "meshcat.io/sidecar-container";
/// The annotation naming the sidecar's own upstream cluster (left out of the graph).
pub const LOCAL_CLUSTER_ANNOTATION: &str = "meshcat.io/local-cluster";
/// Formerly chose the zone; now ignored (the zone is the namespace).
pub const ZONE_ANNOTATION: &str = "meshcat.io/zone";
/// The annotation naming the pod's mesh (`istio`, `consul`): it sets the admin port
/// and sidecar container defaults ([`Mesh`]).
pub const MESH_ANNOTATION: &str = "meshcat.io/mesh";
/// The admin port of a sidecar of no named mesh.
pub const DEFAULT_ADMIN_PORT: u16 = 9901;
/// The sidecar container of a pod of no named mesh.
pub const DEFAULT_SIDECAR: &str = "envoy";

/// A mesh whose sidecars have an admin port and a container name of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mesh {
    /// Istio's `istio-proxy`, admin on `127.0.0.1:15000`.
    Istio,
    /// Consul's `consul-dataplane`, admin on `127.0.0.1:19000`.
    Consul,
}

impl Mesh {
    /// Every mesh, for documentation and tests.
    pub const ALL: [Mesh; 2] = [Mesh::Istio, Mesh::Consul];

    /// The mesh a [`MESH_ANNOTATION`] value names (exactly, in lower case).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }

    /// Its name as the annotation gives it.
    pub fn name(self) -> &'static str {
        match self {
            Mesh::Istio => "istio",
            Mesh::Consul => "consul",
        }
    }

    /// The port its sidecars serve their admin API on (on the pod's loopback).
    pub fn admin_port(self) -> u16 {
        match self {
            Mesh::Istio => 15000,
            Mesh::Consul => 19000,
        }
    }

    /// The name of its sidecar container.
    pub fn sidecar_container(self) -> &'static str {
        match self {
            Mesh::Istio => "istio-proxy",
            Mesh::Consul => "consul-dataplane",
        }
    }
}

/// The admin port of a pod without an [`ADMIN_PORT_ANNOTATION`]: its mesh's, else
/// [`DEFAULT_ADMIN_PORT`].
pub fn default_admin_port(mesh: Option<Mesh>) -> u16 {
    mesh.map_or(DEFAULT_ADMIN_PORT, Mesh::admin_port)
}

/// The mesh a pod's [`MESH_ANNOTATION`] names (`None` without one); any other value
/// is refused, named in the answer.
pub fn mesh_of(annotation: Option<&str>) -> Result<Option<Mesh>, String> {
    annotation
        .map(|v| {
            Mesh::parse(v)
                .ok_or_else(|| format!("{MESH_ANNOTATION} {v:?} is not one of istio, consul"))
        })
        .transpose()
}

/// A pod's admin port: its [`ADMIN_PORT_ANNOTATION`], a port number and nothing
/// else, when given; else [`default_admin_port`] of its mesh.
pub fn admin_port_of(annotation: Option<&str>, mesh: Option<Mesh>) -> Result<u16, String> {
    match annotation {
        None => Ok(default_admin_port(mesh)),
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{ADMIN_PORT_ANNOTATION} {p:?} is not a port number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meshes_by_name() {
        assert_eq!(Mesh::parse("istio"), Some(Mesh::Istio));
        assert_eq!(Mesh::parse("consul"), Some(Mesh::Consul));
        for not in ["Istio", "linkerd", "", " istio"] {
            assert_eq!(Mesh::parse(not), None, "{not:?}");
        }
        assert_eq!(
            Mesh::ALL.map(|m| (m.admin_port(), m.sidecar_container())),
            [(15000, "istio-proxy"), (19000, "consul-dataplane")]
        );
        assert_eq!(default_admin_port(None), 9901);
        assert_eq!(mesh_of(Some("consul")), Ok(Some(Mesh::Consul)));
        assert_eq!(mesh_of(None), Ok(None));
        assert!(
            mesh_of(Some("linkerd"))
                .unwrap_err()
                .contains("\"linkerd\"")
        );
        assert_eq!(admin_port_of(None, Some(Mesh::Istio)), Ok(15000));
        assert_eq!(admin_port_of(Some("19001"), Some(Mesh::Consul)), Ok(19001));
        for bad in ["0", "70000", "http", " 1", "1@h:80"] {
            assert!(admin_port_of(Some(bad), None).is_err(), "{bad}");
        }
    }
}
