//! Network namespaces and pod cgroups for the tests of sidecars whose admin stays on
//! their pod's loopback (contract section 18): an HTTP call made from inside a
//! namespace (the socket is opened there by the agent's own connector, the request is
//! the test's own, over hyper), and a process placed in cgroups named as kubelet names
//! a pod's, so that the agent's `--pod-netns` finds it by the pod's UID as on a node.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use meshcat_agent::envoy::Netns;

/// One HTTP/1.1 call to `addr` (`host:port`) from inside the namespace `ns`: the
/// answer's body, or an error for a failed connection or a non-2xx status.
pub async fn http_in(ns: &Path, addr: &str, post: bool, path: &str) -> anyhow::Result<String> {
    let netns = Netns::pinned_now(ns.to_owned());
    let stream =
        meshcat_agent::envoy::netns::connect(&netns, addr, std::time::Duration::from_secs(2))
            .await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(if post { "POST" } else { "GET" })
        .uri(path)
        .header("host", addr)
        .body(Empty::<Bytes>::new())?;
    let resp = send.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    conn.abort();
    let text = String::from_utf8_lossy(&body).into_owned();
    if !status.is_success() {
        bail!("{addr}{path} in {} answered {status}: {text}", ns.display());
    }
    Ok(text)
}

/// The cgroup v2 hierarchy, where a process is placed as a pod's.
const CGROUP_ROOT: &str = "/sys/fs/cgroup/unified";
/// Where the cgroup v2 hierarchy is when it is the only one.
const CGROUP_ROOT_V2_ONLY: &str = "/sys/fs/cgroup";

/// A process placed in a cgroup named as kubelet's `systemd` driver names a
/// BestEffort pod's container (`kubepods.slice/.../kubepods-besteffort-pod<uid with _
/// for ->.slice/cri-containerd-<id>.scope`), on the node's cgroup v2 hierarchy. On
/// drop the process is moved back to the root cgroup (if still alive) and the
/// cgroups made are removed.
#[derive(Debug)]
pub struct PodCgroup {
    /// The cgroups made, deepest first.
    made: Vec<PathBuf>,
    /// The hierarchy's root.
    root: PathBuf,
    /// The process placed.
    pid: u32,
}

impl PodCgroup {
    /// Places `pid` as a container of the pod `uid`. Needs root and a writable cgroup
    /// v2 hierarchy; fails (never skips) without them.
    pub fn place(pid: u32, uid: &str) -> anyhow::Result<Self> {
        let root = [CGROUP_ROOT, CGROUP_ROOT_V2_ONLY]
            .into_iter()
            .map(PathBuf::from)
            .find(|r| r.join("cgroup.procs").is_file())
            .context("no cgroup v2 hierarchy at /sys/fs/cgroup/unified or /sys/fs/cgroup")?;
        let pod = format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_"));
        let parts = [
            "kubepods.slice".to_owned(),
            "kubepods-besteffort.slice".to_owned(),
            pod,
            format!("cri-containerd-{pid:064x}.scope"),
        ];
        let mut made = Vec::new();
        let mut dir = root.clone();
        for part in parts {
            dir.push(part);
            if !dir.exists() {
                std::fs::create_dir(&dir)
                    .with_context(|| format!("cannot make cgroup {}", dir.display()))?;
                made.push(dir.clone());
            }
        }
        made.reverse();
        let placed = Self { made, root, pid };
        std::fs::write(dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("cannot move {pid} into {}", dir.display()))?;
        Ok(placed)
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.root.join("cgroup.procs"), self.pid.to_string());
        for dir in &self.made {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
