//! Each pod's network namespace, found from the node's process list (`--pod-netns`,
//! contract section 18): a process whose cgroup path names the pod's UID lives in the
//! pod's namespace (every container of a pod shares it), so its `/proc/<pid>/ns/net`
//! is where the pod's loopback is. Both of kubelet's cgroup drivers are read:
//! `cgroupfs` (`/kubepods/<qos>/pod<uid>/<container>`) and `systemd`
//! (`kubepods-<qos>-pod<uid with _ for ->.slice`), under any prefix (kind and other
//! nested nodes put one in front), and as an agent in a cgroup namespace of its own
//! sees them (cgroup v2 gives a container one: other pods' paths start with `..`
//! and lose the `kubepods` part).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::envoy::Netns;

/// Largest `/proc/<pid>/cgroup` read (a line per hierarchy, a few KiB at most).
const MAX_CGROUP_FILE: u64 = 64 << 10;
/// Most processes looked at in one scan.
pub const MAX_PROCESSES: usize = 1 << 16;

/// The pod UID a `/proc/<pid>/cgroup` text names, if the process is in a pod's
/// cgroup: the first line (hierarchy) that names one.
pub fn pod_uid(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        // `hierarchy-ID:controller-list:cgroup-path`; the path may hold ':' itself.
        let path = line.splitn(3, ':').nth(2)?;
        pod_uid_of_path(path)
    })
}

/// The pod UID in one cgroup path: a `pod<uid>` component below `kubepods`, a QoS
/// class or a `..` (cgroupfs), or a `...kubepods...-pod<uid>.slice` component
/// (systemd).
fn pod_uid_of_path(path: &str) -> Option<String> {
    let mut below_kubepods = false;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        if let Some(slice) = part.strip_suffix(".slice") {
            if slice.contains("kubepods")
                && let Some((_, uid)) = slice.rsplit_once("-pod")
                && let Some(uid) = uid_key(&uid.replace('_', "-"))
            {
                return Some(uid);
            }
            continue;
        }
        if matches!(part, "kubepods" | "burstable" | "besteffort" | "..") {
            below_kubepods = true;
            continue;
        }
        if below_kubepods && let Some(uid) = part.strip_prefix("pod").and_then(uid_key) {
            return Some(uid);
        }
    }
    None
}

/// `s` when it is a Kubernetes UID (a UUID: 36 characters, hex and four dashes), in
/// lower case: how pods are keyed here, whether the UID comes from a cgroup path or
/// from the pod list.
pub fn uid_key(s: &str) -> Option<String> {
    let dashes = [8, 13, 18, 23];
    let ok = s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if dashes.contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        });
    ok.then(|| s.to_ascii_lowercase())
}

/// Every pod's network namespace found in `proc_dir`, by pod UID: of a pod's
/// processes, the one with the lowest PID whose namespace file can be read (the
/// pod's sandbox, the longest lived, where the agent may read it: a runtime that
/// confines containers with AppArmor starts the sandbox unconfined, and a confined
/// agent may not read an unconfined process's namespace, so the pod's own
/// containers serve then), its namespace's identity pinned now. Processes that end
/// while being read are skipped.
pub fn scan(proc_dir: &Path) -> std::io::Result<BTreeMap<String, Netns>> {
    let mut pids: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for entry in std::fs::read_dir(proc_dir)?.flatten().take(MAX_PROCESSES) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Some(uid) = read_cgroup(&entry.path().join("cgroup"))
            .as_deref()
            .and_then(pod_uid)
        else {
            continue;
        };
        pids.entry(uid).or_default().push(pid);
    }
    Ok(pids
        .into_iter()
        .filter_map(|(uid, mut pids)| {
            pids.sort_unstable();
            pids.into_iter().find_map(|pid| {
                let path = proc_dir.join(pid.to_string()).join("ns").join("net");
                let inode = std::fs::metadata(&path).ok()?.ino();
                Some((uid.clone(), Netns::with_inode(path, inode)))
            })
        })
        .collect())
}

/// A process's cgroup text, or `None` when it is gone or too large.
fn read_cgroup(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_CGROUP_FILE)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cgroup")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn kubelets_cgroupfs_driver() {
        assert_eq!(
            pod_uid(&fixture("cgroupfs-burstable.txt")).as_deref(),
            Some("3f1c2b8e-6a4d-4f0e-9b7a-2d5c8e1f4a60")
        );
    }

    #[test]
    fn kubelets_systemd_driver() {
        for f in ["systemd-besteffort.txt", "systemd-guaranteed-crio.txt"] {
            assert_eq!(
                pod_uid(&fixture(f)).as_deref(),
                Some("b7e4a9d2-1c3f-4e5a-8b6d-0f2a4c6e8a1b"),
                "{f}"
            );
        }
    }

    #[test]
    fn a_node_process_is_in_no_pod() {
        assert_eq!(pod_uid(&fixture("not-a-pod.txt")), None);
    }

    #[test]
    fn nested_nodes_and_lookalikes() {
        // kind's nodes put kubelet's tree below their own slice.
        let kind = "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod0a1b2c3d_4e5f_6a7b_8c9d_0e1f2a3b4c5d.slice/cri-containerd-1.scope";
        assert_eq!(
            pod_uid(kind).as_deref(),
            Some("0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d")
        );
        let nested = "0::/docker/abc/kubepods/besteffort/pod0A1B2C3D-4E5F-6A7B-8C9D-0E1F2A3B4C5D/x";
        assert_eq!(
            pod_uid(nested).as_deref(),
            Some("0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d")
        );
        // An agent in a cgroup namespace of its own sees other pods from above its
        // own cgroup.
        let in_cgroupns = "0::/../../../burstable/pod0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d/abc";
        assert_eq!(
            pod_uid(in_cgroupns).as_deref(),
            Some("0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d")
        );
        let guaranteed = "0::/../../pod0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d/abc";
        assert!(pod_uid(guaranteed).is_some());
        for not in [
            "0::/system.slice/pod0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d/x",
            "0::/kubepods/burstable/podnot-a-uid/x",
            "0::/user.slice/user-pod0a1b2c3d_4e5f_6a7b_8c9d_0e1f2a3b4c5d.slice",
            "garbage",
            "",
        ] {
            assert_eq!(pod_uid(not), None, "{not}");
        }
    }

    #[test]
    fn a_missing_proc_dir_is_an_error() {
        assert!(scan(Path::new("/nonexistent-proc")).is_err());
    }
}
