//! Validation of every bound the contract sets on registrations. Each failure is one
//! sentence naming the field, fit for the API's `{"error", "code"}` body.

use std::net::Ipv4Addr;

use crate::model::{ClusterRecord, ZoneRecord};

/// Longest identifier (clusterName, zoneName, instance name): a DNS name's length.
pub const MAX_NAME_LEN: usize = 253;
/// Longest free-text field (description, documentation, URLs, ...).
pub const MAX_TEXT_LEN: usize = 4096;
/// Most items in an array field (protocols, externalLinks).
pub const MAX_ITEMS: usize = 64;

/// A registration that is well-formed JSON but breaks a rule of the contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

fn invalid(msg: impl Into<String>) -> Invalid {
    Invalid(msg.into())
}

/// Whether `s` is a valid identifier: 1 to 253 characters of `[A-Za-z0-9._-]`.
pub fn is_valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `s` can name an instance: 1 to 253 printable ASCII characters without
/// `/` or spaces. Wider than cluster names because pod names come from the
/// orchestrator and host names carry an admin port (`host:9901`). The one rule for
/// instance names: the ingest checks reports with it and the API checks paths.
pub fn is_valid_instance(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME_LEN && s.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
}

/// Checks an identifier field and says which one is wrong.
pub fn check_name(field: &str, value: &str) -> Result<(), Invalid> {
    if value.is_empty() {
        return Err(invalid(format!("{field} must not be empty.")));
    }
    if value.len() > MAX_NAME_LEN {
        return Err(invalid(format!(
            "{field} must be at most {MAX_NAME_LEN} characters long."
        )));
    }
    if !is_valid_name(value) {
        return Err(invalid(format!(
            "{field} may only contain letters, digits, '.', '_' and '-'."
        )));
    }
    Ok(())
}

fn check_text(field: &str, value: &str) -> Result<(), Invalid> {
    if value.len() > MAX_TEXT_LEN {
        return Err(invalid(format!(
            "{field} must be at most {MAX_TEXT_LEN} bytes long."
        )));
    }
    Ok(())
}

/// Most declared dependencies of one cluster.
pub const MAX_DEPENDENCIES: usize = 256;

/// The (zone, cluster) a declared dependency of a cluster in `zone` names: `c` (same
/// zone) or `z/c`; `None` when it is neither.
pub fn dependency<'a>(zone: &'a str, d: &'a str) -> Option<(&'a str, &'a str)> {
    let (z, c) = d.split_once('/').unwrap_or((zone, d));
    (is_valid_name(z) && is_valid_name(c)).then_some((z, c))
}

/// Checks every bound of a cluster registration.
pub fn cluster(r: &ClusterRecord) -> Result<(), Invalid> {
    check_name("clusterName", &r.cluster_name)?;
    check_name("zoneName", &r.zone_name)?;
    if r.name.trim().is_empty() {
        return Err(invalid("name must not be empty."));
    }
    for (field, value) in [
        ("name", &r.name),
        ("version", &r.version),
        ("owner", &r.owner),
        ("ownerURL", &r.owner_url),
        ("capability", &r.capability),
        ("runtime", &r.runtime),
        ("documentation", &r.documentation),
        ("description", &r.description),
        ("prometheusJob", &r.prometheus_job),
        ("metricsTemplate", &r.metrics_template),
        ("clusterID", &r.cluster_id),
        ("meshID", &r.mesh_id),
        ("apiEndpoint", &r.api_endpoint),
        ("apiSpecEndpoint", &r.api_spec_endpoint),
        ("businessImpact", &r.business_impact),
    ] {
        check_text(field, value)?;
    }
    if r.min_instances < 0 {
        return Err(invalid("minInstances must be 0 or more."));
    }
    if r.max_instances < 0 {
        return Err(invalid(
            "maxInstances must be 0 or more (0 means no upper bound).",
        ));
    }
    if r.min_instances > i64::from(u32::MAX) || r.max_instances > i64::from(u32::MAX) {
        return Err(invalid(
            "minInstances and maxInstances must be at most 4294967295.",
        ));
    }
    if r.max_instances > 0 && r.min_instances > r.max_instances {
        return Err(invalid(
            "minInstances must not exceed maxInstances when maxInstances is set.",
        ));
    }
    if !(0..=65535).contains(&r.metrics_port) {
        return Err(invalid("metricsPort must be between 0 and 65535."));
    }
    if r.protocols.len() > MAX_ITEMS {
        return Err(invalid(format!(
            "protocols may hold at most {MAX_ITEMS} items."
        )));
    }
    for p in &r.protocols {
        if p.is_empty() || p.len() > MAX_NAME_LEN {
            return Err(invalid(format!(
                "each protocol must be 1 to {MAX_NAME_LEN} characters long."
            )));
        }
    }
    if r.external_links.len() > MAX_ITEMS {
        return Err(invalid(format!(
            "externalLinks may hold at most {MAX_ITEMS} items."
        )));
    }
    for l in &r.external_links {
        check_text("externalLinks[].name", &l.name)?;
        check_text("externalLinks[].link", &l.link)?;
    }
    if r.dependencies.len() > MAX_DEPENDENCIES {
        return Err(invalid(format!(
            "dependencies may hold at most {MAX_DEPENDENCIES} items."
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for d in &r.dependencies {
        let (zone, cluster) = dependency(&r.zone_name, d).ok_or_else(|| {
            invalid(format!(
                "dependencies[] {d:?} must be a clusterName or zoneName/clusterName."
            ))
        })?;
        if !seen.insert((zone, cluster)) {
            return Err(invalid(format!("dependencies[] names {d:?} twice.")));
        }
    }
    // Readers of the API render these as links: only web addresses (and, for the
    // documentation fields, a path on the same site) are stored, never `javascript:`,
    // `data:` or a scheme-relative `//host`.
    check_url("ownerURL", &r.owner_url, false)?;
    check_url("apiEndpoint", &r.api_endpoint, false)?;
    check_url("documentation", &r.documentation, true)?;
    check_url("apiSpecEndpoint", &r.api_spec_endpoint, true)?;
    for l in &r.external_links {
        check_url("externalLinks[].link", &l.link, false)?;
    }
    Ok(())
}

/// Whether `value` is an absolute `http` or `https` URL with a host.
pub fn is_web_url(value: &str) -> bool {
    // The parser would accept surrounding spaces and control characters (it strips
    // them); a stored link is taken as written, so those are refused here.
    if value
        .bytes()
        .any(|b| b.is_ascii_control() || b == b' ' || b == b'\\')
    {
        return false;
    }
    // Written out as `http://` or `https://`: the parser would also take forms that
    // browsers repair, such as `http:/host` or `http:\\host`.
    let lower = value.get(..8).unwrap_or(value).to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return false;
    }
    url::Url::parse(value).is_ok_and(|u| {
        matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty())
    })
}

/// Checks a link field: empty, an absolute `http`/`https` URL, or (when `path_ok`) a
/// path on the same site starting with one `/`.
pub fn check_url(field: &str, value: &str, path_ok: bool) -> Result<(), Invalid> {
    if value.is_empty() || is_web_url(value) {
        return Ok(());
    }
    let is_path = value.starts_with('/')
        && !value.starts_with("//")
        && !value.starts_with("/\\")
        && !value
            .bytes()
            .any(|b| b.is_ascii_control() || b == b' ' || b == b'\\');
    if path_ok && is_path {
        return Ok(());
    }
    Err(invalid(if path_ok {
        format!(
            "{field} must be empty, an absolute http or https URL, or a path starting with '/'."
        )
    } else {
        format!("{field} must be empty or an absolute http or https URL.")
    }))
}

/// Checks a zone's `serverAddress` by the rule of [`host_port`].
pub fn check_server_address(value: &str) -> Result<(), Invalid> {
    host_port(value).map_err(|_| {
        invalid(format!(
            "serverAddress must be host:port with a DNS name or an IP address, got {value:?}."
        ))
    })
}

/// Checks `host:port`, where host is a DNS name, an IPv4 address or a bracketed IPv6
/// address, and port is 1..=65535: the one rule for every address meshcat takes (a
/// zone's `serverAddress`, the agent's `--aggregator`, `--sidecar-admin` and targets,
/// the aggregator's `--advertise-addr` and etcd endpoints, `meshcat inject
/// --aggregator`).
pub fn host_port(value: &str) -> Result<(), String> {
    let bad = || format!("{value:?} is not host:port with a DNS name or an IP address");
    let (host, port) = value.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if port == 0 {
        return Err(bad());
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner
            .parse::<std::net::Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| bad());
    }
    if host.parse::<Ipv4Addr>().is_ok() {
        return Ok(());
    }
    if is_dns_name(host) {
        Ok(())
    } else {
        Err(bad())
    }
}

fn is_dns_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= MAX_NAME_LEN
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Checks a zone registration's fields (not the files it names: see [`zone_files`]).
pub fn zone(z: &ZoneRecord) -> Result<(), Invalid> {
    check_name("zoneName", &z.zone_name)?;
    if !z.request_cluster.is_empty() {
        check_name("requestCluster", &z.request_cluster)?;
    }
    check_server_address(&z.server_address)?;
    for (field, value) in [
        ("caPath", &z.ca_path),
        ("certPath", &z.cert_path),
        ("keyPath", &z.key_path),
    ] {
        check_text(field, value)?;
    }
    Ok(())
}

/// Largest zone TLS file read (contract section 10).
pub const MAX_ZONE_FILE: u64 = 1 << 20;

/// With `useTls`, caPath, certPath and keyPath must name readable PEM files: regular
/// files up to [`MAX_ZONE_FILE`]. A FIFO or a device is never read (opened without
/// blocking, then refused by its type), a large file is never read whole, and every
/// failure gives the same message, so a caller cannot learn which paths exist.
pub fn zone_files(z: &ZoneRecord) -> Result<(), Invalid> {
    if !z.use_tls {
        return Ok(());
    }
    for (field, path) in [
        ("caPath", &z.ca_path),
        ("certPath", &z.cert_path),
        ("keyPath", &z.key_path),
    ] {
        if path.is_empty() {
            return Err(invalid(format!("{field} is required when useTls is true.")));
        }
        let pem = read_regular(std::path::Path::new(path), MAX_ZONE_FILE)
            .is_some_and(|text| text.windows(11).any(|w| w == b"-----BEGIN "));
        if !pem {
            return Err(invalid(format!(
                "{field} must name a readable PEM file (a regular file of at most 1 MiB)."
            )));
        }
    }
    Ok(())
}

/// The contents of `path` if it is a regular file of at most `limit` bytes.
pub fn read_regular(path: &std::path::Path, limit: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: opening a FIFO with no writer must not wait for one.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.file_type().is_file() || meta.len() > limit {
        return None;
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    // The file may grow after the check: read one byte past the limit at most.
    file.take(limit + 1).read_to_end(&mut out).ok()?;
    (out.len() as u64 <= limit).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_files_are_regular_bounded_pem_files() {
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("ok.pem");
        std::fs::write(&pem, "-----BEGIN CERTIFICATE-----\n").unwrap();
        let big = dir.path().join("big.pem");
        let mut text = b"-----BEGIN CERTIFICATE-----\n".to_vec();
        text.resize(MAX_ZONE_FILE as usize + 1, b'A');
        std::fs::write(&big, text).unwrap();
        let fifo = dir.path().join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let zone = |path: &std::path::Path| ZoneRecord {
            zone_name: "z".into(),
            server_address: "cp:1".into(),
            use_tls: true,
            ca_path: path.display().to_string(),
            cert_path: pem.display().to_string(),
            key_path: pem.display().to_string(),
            request_cluster: String::new(),
        };
        assert!(zone_files(&zone(&pem)).is_ok());
        let mut messages = Vec::new();
        for bad in [
            big.as_path(),
            fifo.as_path(),
            std::path::Path::new("/dev/zero"),
            std::path::Path::new("/nonexistent/ca.pem"),
            dir.path(),
        ] {
            messages.push(zone_files(&zone(bad)).unwrap_err().0);
        }
        // One message whatever the reason: it tells nothing about the path.
        messages.dedup();
        assert_eq!(messages.len(), 1, "{messages:?}");
    }

    #[test]
    fn link_fields_take_web_urls_and_paths_only() {
        for ok in [
            "https://docs.example.com/svc",
            "http://10.0.0.1:8080/x?y=1#z",
            "HTTPS://Example.COM",
        ] {
            assert!(check_url("ownerURL", ok, false).is_ok(), "{ok}");
        }
        for bad in [
            "javascript:alert(1)",
            "JavaScript:alert(1)",
            "data:text/html,<script>alert(1)</script>",
            "//evil.example.com/x",
            "/docs/api",
            "ftp://example.com/x",
            "https://",
            "http:/example.com",
            "http:\\\\example.com",
            "https://example.com\\@evil.example.com",
            " https://example.com",
            "https://exa mple.com",
            "vbscript:x",
            "mailto:team@example.com",
        ] {
            let e = check_url("ownerURL", bad, false).unwrap_err();
            assert!(e.0.starts_with("ownerURL "), "{bad}: {e}");
        }
        assert!(check_url("documentation", "/docs/api.md", true).is_ok());
        assert!(check_url("documentation", "", true).is_ok());
        for bad in [
            "//evil.example.com",
            "/\\evil.example.com",
            "docs/api",
            "javascript:x",
            "/a b",
        ] {
            let e = check_url("documentation", bad, true).unwrap_err();
            assert!(e.0.starts_with("documentation "), "{bad}: {e}");
        }
    }

    #[test]
    fn names() {
        assert!(is_valid_name("a"));
        assert!(is_valid_name("svc-a.v1_2"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("a b"));
        assert!(!is_valid_name("a/b"));
        assert!(is_valid_name(&"x".repeat(253)));
        assert!(!is_valid_name(&"x".repeat(254)));
    }

    #[test]
    fn instance_names() {
        assert!(is_valid_instance("pod-a-9901"));
        assert!(is_valid_instance("node-a:9901"));
        assert!(!is_valid_instance(""));
        assert!(!is_valid_instance("a b"));
        assert!(!is_valid_instance("a/b"));
        assert!(!is_valid_instance("caf\u{e9}"));
        assert!(is_valid_instance(&"x".repeat(253)));
        assert!(!is_valid_instance(&"x".repeat(254)));
    }

    #[test]
    fn server_addresses() {
        for ok in [
            "cp:50000",
            "control.mesh.svc:443",
            "10.0.0.1:8080",
            "[::1]:9000",
        ] {
            assert!(check_server_address(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "cp", "cp:", ":80", "cp:0", "cp:70000", "a b:80", "::1:80", "-x:1",
        ] {
            assert!(check_server_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn instance_bounds() {
        let mut r = ClusterRecord::new("z", "c", "n");
        r.min_instances = 3;
        r.max_instances = 2;
        assert!(cluster(&r).is_err());
        r.max_instances = 0;
        assert!(cluster(&r).is_ok());
        r.min_instances = -1;
        assert!(cluster(&r).is_err());
        r.min_instances = 0;
        r.metrics_port = 65536;
        assert!(cluster(&r).is_err());
    }
}
