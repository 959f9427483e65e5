//! Shared by the agent's tests that run a real Envoy: the binary (`MESHCAT_ENVOY`,
//! else what `scripts/envoy.sh` installs) and an Envoy with only its admin API.
// Each test binary includes this module and uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Envoy's file flush interval in these tests.
pub const FLUSH: Duration = Duration::from_millis(200);

pub fn envoy_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("MESHCAT_ENVOY").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/envoy.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/envoy.sh");
    assert!(
        out.status.success(),
        "scripts/envoy.sh could not install Envoy"
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A real Envoy with only its admin API, writing its own log to a file. It runs under
/// a thread that lives as long as this value: Envoy exits when its spawning thread
/// does (`PR_SET_PDEATHSIG`).
pub struct Envoy {
    pub admin: String,
    pub log: PathBuf,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy with its own log at `level`, written to [`Envoy::log`].
    pub fn start(level: &str) -> Envoy {
        let bin = envoy_binary();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("bootstrap.yaml");
        std::fs::write(
            &config,
            "admin:\n  address:\n    socket_address: { address: 127.0.0.1, port_value: 0 }\n",
        )
        .unwrap();
        let addr_file = dir.path().join("admin-address");
        let log = dir.path().join("envoy.log");
        let out = std::fs::File::create(dir.path().join("envoy.out")).unwrap();
        // A port the kernel just handed out is a base id no other Envoy here uses.
        let base_id = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = Command::new(bin);
        cmd.arg("-c")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&addr_file)
            .arg("--base-id")
            .arg(base_id.to_string())
            .arg("--log-path")
            .arg(&log)
            .arg("--file-flush-interval-msec")
            .arg(FLUSH.as_millis().to_string())
            .arg("-l")
            .arg(level)
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let (spawned_tx, spawned_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || match cmd.spawn() {
            Ok(mut child) => {
                let _ = spawned_tx.send(Ok(()));
                // Until the test drops its Envoy (the sender goes away).
                let _ = stop_rx.recv();
                let _ = child.kill();
                let _ = child.wait();
                // A killed Envoy leaves its hot restart region (`base_id * 10`).
                let _ = std::fs::remove_file(format!(
                    "/dev/shm/envoy_shared_memory_{}",
                    u32::from(base_id) * 10
                ));
            }
            Err(e) => {
                let _ = spawned_tx.send(Err(e));
            }
        });
        spawned_rx.recv().unwrap().expect("spawn envoy");
        let deadline = Instant::now() + Duration::from_secs(30);
        let admin = loop {
            if let Ok(a) = std::fs::read_to_string(&addr_file)
                && !a.trim().is_empty()
            {
                break a.trim().to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "envoy did not start: {}",
                std::fs::read_to_string(dir.path().join("envoy.out")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Envoy {
            admin,
            log,
            stop: Some(stop_tx),
            thread: Some(thread),
            _dir: dir,
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
