//! Connections into another network namespace (contract section 18): a sidecar whose
//! admin listens on its pod's loopback is reached by opening the TCP connection from
//! inside the pod's namespace. A fresh thread enters the namespace, connects, hands
//! the socket back and ends; the socket stays in the namespace it was made in, so the
//! rest of the agent (the runtime's threads included) never leaves its own.
//!
//! This is the agent's only system call of its own beyond what the standard library
//! makes: `setns(2)` through rustix's safe wrapper, so the crate still forbids
//! `unsafe`. It needs `CAP_SYS_ADMIN` (and, to open another process's
//! `/proc/<pid>/ns/net`, `CAP_SYS_PTRACE`); docs/security.md says why.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// The network namespace a sidecar lives in: a namespace file (`/proc/<pid>/ns/net`,
/// `/run/netns/<name>`) and, once known, the namespace's inode. The inode is the
/// namespace's identity: a `/proc/<pid>/ns/net` whose process died and whose PID went
/// to another process names another namespace, which the agent must not enter in the
/// target's name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(from = "PathBuf")]
pub struct Netns {
    /// The namespace file, as configured or found.
    path: PathBuf,
    /// The inode the namespace had when the target was made; `None` when the file
    /// could not be read then (checked from the first connection on).
    inode: Option<u64>,
}

impl From<PathBuf> for Netns {
    fn from(path: PathBuf) -> Self {
        Netns { path, inode: None }
    }
}

impl Netns {
    /// The namespace at `path`, its identity pinned to the namespace found there now
    /// (none pinned when it cannot be read now: the connection then names the error).
    pub fn pinned_now(path: PathBuf) -> Self {
        let mut ns = Netns::from(path);
        ns.pin();
        ns
    }

    /// The namespace at `path`, known to be the one with `inode`.
    pub fn with_inode(path: PathBuf, inode: u64) -> Self {
        Netns {
            path,
            inode: Some(inode),
        }
    }

    /// Pins the identity to what `path` names now, unless already pinned.
    pub fn pin(&mut self) {
        if self.inode.is_none() {
            self.inode = std::fs::metadata(&self.path).ok().map(|m| m.ino());
        }
    }

    /// The namespace file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace's inode, when pinned.
    pub fn inode(&self) -> Option<u64> {
        self.inode
    }
}

/// Why a connection inside a namespace could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace {path} is gone (its process exited)")]
    Gone { path: String },
    #[error("{path} is not a network namespace")]
    NotNetns { path: String },
    #[error(
        "{path} is no longer the namespace this target was found in (inode {found}, expected {expected}): its process was replaced"
    )]
    Replaced {
        path: String,
        expected: u64,
        found: u64,
    },
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot enter network namespace {path}: {source}")]
    Enter {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to {addr} inside network namespace {path}: {source}")]
    Connect {
        path: String,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the thread that enters network namespace {path} could not run: {reason}")]
    Thread { path: String, reason: String },
}

impl NetnsError {
    /// The metric label of this failure (`meshcat_agent_netns_errors_total{reason}`);
    /// a refused or timed-out connection inside the namespace is the sidecar's, not
    /// the namespace's, and has none.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            NetnsError::Gone { .. } => Some("gone"),
            NetnsError::NotNetns { .. } => Some("not_netns"),
            NetnsError::Replaced { .. } => Some("replaced"),
            NetnsError::Open { .. } | NetnsError::Enter { .. } | NetnsError::Thread { .. } => {
                Some("enter_failed")
            }
            NetnsError::Connect { .. } => None,
        }
    }
}

/// Every reason [`NetnsError::reason`] gives, for the metric's documentation and tests.
pub const REASONS: [&str; 4] = ["gone", "not_netns", "replaced", "enter_failed"];

/// Opens a TCP connection to `addr` (`host:port`, resolved inside the namespace) from
/// inside `ns`, within `timeout` per address tried. Blocks: call it from a thread of
/// its own ([`connect`] does).
fn connect_blocking(ns: &Netns, addr: &str, timeout: Duration) -> Result<TcpStream, NetnsError> {
    let path = ns.path.display().to_string();
    let file = std::fs::File::open(&ns.path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => NetnsError::Gone { path: path.clone() },
        _ => NetnsError::Open {
            path: path.clone(),
            source: e,
        },
    })?;
    let meta = file.metadata().map_err(|e| NetnsError::Open {
        path: path.clone(),
        source: e,
    })?;
    if let Some(expected) = ns.inode
        && meta.ino() != expected
    {
        return Err(NetnsError::Replaced {
            path,
            expected,
            found: meta.ino(),
        });
    }
    // The kernel checks the type: any other file, or a namespace of another kind
    // (`/proc/<pid>/ns/mnt`), answers EINVAL.
    move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network)).map_err(|e| {
        if e == rustix::io::Errno::INVAL {
            NetnsError::NotNetns { path: path.clone() }
        } else {
            NetnsError::Enter {
                path: path.clone(),
                source: e.into(),
            }
        }
    })?;
    let connect_err = |e| NetnsError::Connect {
        path: path.clone(),
        addr: addr.to_owned(),
        source: e,
    };
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs().map_err(connect_err)?.collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                s.set_nodelay(true).map_err(connect_err)?;
                s.set_nonblocking(true).map_err(connect_err)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(connect_err(last))
}

/// Opens a TCP connection to `addr` from inside `ns`: a thread of its own enters the
/// namespace (a thread of the runtime's pools would stay in it afterwards), connects
/// and ends.
pub async fn connect(
    ns: &Netns,
    addr: &str,
    timeout: Duration,
) -> Result<tokio::net::TcpStream, NetnsError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (thread_ns, thread_addr) = (ns.clone(), addr.to_owned());
    let thread_err = |reason: String| NetnsError::Thread {
        path: ns.path.display().to_string(),
        reason,
    };
    std::thread::Builder::new()
        .name("meshcat-netns".into())
        .spawn(move || {
            let _ = tx.send(connect_blocking(&thread_ns, &thread_addr, timeout));
        })
        .map_err(|e| thread_err(e.to_string()))?;
    let stream = rx
        .await
        .map_err(|_| thread_err("it ended without an answer".into()))??;
    tokio::net::TcpStream::from_std(stream).map_err(|e| NetnsError::Connect {
        path: ns.path.display().to_string(),
        addr: addr.to_owned(),
        source: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_namespace_is_gone() {
        let ns = Netns::from(PathBuf::from("/proc/999999999/ns/net"));
        let e = connect(&ns, "127.0.0.1:9", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(e, NetnsError::Gone { .. }), "{e}");
        assert_eq!(e.reason(), Some("gone"));
    }

    #[tokio::test]
    async fn a_regular_file_is_no_namespace() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let ns = Netns::pinned_now(f.path().to_owned());
        let e = connect(&ns, "127.0.0.1:9", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(e, NetnsError::NotNetns { .. }), "{e}");
        assert_eq!(e.reason(), Some("not_netns"));
    }

    #[tokio::test]
    async fn another_kind_of_namespace_is_refused() {
        let ns = Netns::pinned_now(PathBuf::from("/proc/self/ns/uts"));
        let e = connect(&ns, "127.0.0.1:9", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(e, NetnsError::NotNetns { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_replaced_namespace_is_refused() {
        let own = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        let ns = Netns::with_inode(PathBuf::from("/proc/self/ns/net"), own + 1);
        let e = connect(&ns, "127.0.0.1:9", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(e, NetnsError::Replaced { .. }), "{e}");
        assert_eq!(e.reason(), Some("replaced"));
    }

    #[tokio::test]
    async fn the_own_namespace_connects_and_leaves_the_caller_where_it_was() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let ns = Netns::pinned_now(PathBuf::from("/proc/self/ns/net"));
        assert!(ns.inode().is_some());
        let before = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
        let stream = connect(&ns, &addr, Duration::from_secs(1)).await.unwrap();
        let (_accepted, from) = listener.accept().await.unwrap();
        assert_eq!(stream.local_addr().unwrap(), from);
        assert_eq!(
            std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino(),
            before
        );
    }
}
