//! The failure scenarios of `diagnose/scenarios/` run live: the templates rendered
//! with free ports and fresh certificates, the two Envoys (edge and service sidecar)
//! spawned from long-lived threads (Envoy 1.40 sets `PR_SET_PDEATHSIG`), each writing
//! its access lines and its own log to one file as a container runtime shows them,
//! and the sample upstream served in process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::certs::MeshCerts;
use crate::envoy::{Process, envoy_binary, next_base_id, shared_memory_file};
use crate::ports::free_port;
use crate::upstream::Upstream;
use crate::wait_for;

/// Every scenario folder, in the order the tests run them.
pub const SCENARIOS: [&str; 10] = [
    "healthy",
    "upstream_stopped",
    "no_endpoints",
    "route_to_missing_cluster",
    "cluster_not_routed",
    "untrusted_client_cert",
    "sds_dead",
    "ext_authz_dead",
    "wrong_local_port",
    "local_cluster_unset",
];

/// How long a scenario's Envoy gets to answer `/ready` (the `sds_dead` edge waits for
/// its secrets' 1 s initial fetch timeout first).
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// `diagnose/scenarios/`.
pub fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../diagnose/scenarios")
}

/// `tests/scenarios/`: scenarios run live only, without captured fixtures.
pub fn live_scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// One running sidecar of a scenario.
#[derive(Debug)]
pub struct Sidecar {
    /// The Envoy process; killed on drop.
    process: Option<Process>,
    /// Admin API address.
    pub admin: SocketAddr,
    /// Its stdout and stderr: access lines mixed with Envoy's own lines.
    pub log_file: PathBuf,
}

impl Sidecar {
    /// `host:port` of the admin API.
    pub fn admin_addr(&self) -> String {
        self.admin.to_string()
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_file).unwrap_or_default()
    }

    /// Kills the sidecar.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// GETs from the admin API.
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<String> {
        Ok(reqwest::get(format!("http://{}{path}", self.admin))
            .await?
            .text()
            .await?)
    }

    /// The level every logger has (`None` when mixed), read with `POST /logging`.
    pub async fn uniform_log_level(&self) -> anyhow::Result<Option<String>> {
        let text = reqwest::Client::new()
            .post(format!("http://{}/logging", self.admin))
            .send()
            .await?
            .text()
            .await?;
        let levels: std::collections::BTreeSet<&str> = text
            .lines()
            .skip_while(|l| l.trim() != "active loggers:")
            .skip(1)
            .filter_map(|l| l.trim().split_once(": ").map(|(_, lvl)| lvl))
            .collect();
        Ok(if levels.len() == 1 {
            levels.into_iter().next().map(str::to_owned)
        } else {
            None
        })
    }
}

/// How a scenario's Envoys run.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--file-flush-interval-msec`; `None` leaves Envoy's default (10 s), under
    /// which a request's access line reaches the file up to 10 s late.
    pub flush_interval_ms: Option<u32>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            flush_interval_ms: Some(200),
        }
    }
}

/// What meshcat's diagnosis finds in a scenario: the `diagnosis` of its
/// `scenario.json` (the fixture tests in `diagnose/tests/scenarios.rs` read the same
/// field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    /// The symptom to diagnose, as `GET /diagnose` takes it; `None`: every check.
    pub symptom: Option<String>,
    /// `(step, verdict)` of the sidecar checks, in report order (the `metrics_*`
    /// checks depend on the aggregator's record of the cluster and are left out).
    pub verdicts: Vec<(String, String)>,
}

impl Diagnosis {
    /// Reads the `diagnosis` of a `scenario.json`.
    pub fn from_spec(spec: &Value) -> anyhow::Result<Diagnosis> {
        let d = &spec["diagnosis"];
        let symptom = match &d["symptom"] {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            v => bail!("diagnosis.symptom is {v}, not a symptom name or null"),
        };
        let verdicts = d["verdicts"]
            .as_array()
            .context("diagnosis.verdicts is not a list")?
            .iter()
            .map(|pair| match pair.as_array().map(Vec::as_slice) {
                Some([Value::String(step), Value::String(verdict)]) => {
                    Ok((step.clone(), verdict.clone()))
                }
                _ => bail!("diagnosis.verdicts holds {pair}, not a [step, verdict] pair"),
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Diagnosis { symptom, verdicts })
    }
}

/// A running scenario: its two sidecars, the upstream and what it expects.
#[derive(Debug)]
pub struct Scenario {
    pub name: String,
    /// `scenario.json`.
    pub spec: Value,
    /// Rendered configurations, certificates and logs; removed on drop.
    dir: tempfile::TempDir,
    pub edge: Sidecar,
    pub service: Sidecar,
    /// The sample service behind the service sidecar.
    pub upstream: Option<Upstream>,
    /// Where clients send requests.
    pub edge_port: u16,
    /// More edge sidecars started from the same template, with their listener ports.
    pub extra_edges: Vec<(Sidecar, u16)>,
    /// Holds `DEAD_PORT` bound (not listening) so that nothing answers there.
    _dead_port: tokio::net::TcpSocket,
    /// The placeholders' values the templates were rendered with.
    values: Vec<(&'static str, String)>,
    src: PathBuf,
    options: Options,
}

impl Scenario {
    /// Starts the scenario `name` and waits until both sidecars are ready.
    pub async fn start(name: &str) -> anyhow::Result<Scenario> {
        Self::start_with(name, Options::default()).await
    }

    /// As [`Scenario::start`], with the Envoys run as `options` say.
    pub async fn start_with(name: &str, options: Options) -> anyhow::Result<Scenario> {
        let src = match scenarios_dir().join(name) {
            d if d.is_dir() => d,
            _ => live_scenarios_dir().join(name),
        };
        let spec: Value = serde_json::from_str(
            &std::fs::read_to_string(src.join("scenario.json"))
                .with_context(|| format!("scenario {name}"))?,
        )?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("meshcat-{name}-"))
            .tempdir()?;
        let cert_dir = dir.path().join("certs");
        write_certs(&cert_dir)?;
        let upstream = Upstream::start().await?;
        let edge_port = free_port()?;
        let edge_admin = free_port()?;
        let service_admin = free_port()?;
        // Bound without listening, and held for the scenario's life: connections to
        // it are refused, and no other process can take the port meanwhile (a port
        // merely found free could be bound by any later listener of the machine).
        let dead = tokio::net::TcpSocket::new_v4()?;
        dead.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let values = [
            ("EDGE_PORT", edge_port.to_string()),
            ("EDGE_ADMIN_PORT", edge_admin.to_string()),
            ("SERVICE_PORT", free_port()?.to_string()),
            ("SERVICE_ADMIN_PORT", service_admin.to_string()),
            ("UPSTREAM_PORT", upstream.addr.port().to_string()),
            ("DEAD_PORT", dead.local_addr()?.port().to_string()),
            ("CERT_DIR", cert_dir.display().to_string()),
        ];
        let service = spawn(
            dir.path(),
            &src,
            "service",
            &values,
            service_admin,
            &options,
        )?;
        let edge = spawn(dir.path(), &src, "edge", &values, edge_admin, &options)?;
        for side in [&service, &edge] {
            wait_ready(side).await?;
        }
        Ok(Scenario {
            name: name.to_owned(),
            spec,
            dir,
            edge,
            service,
            upstream: Some(upstream),
            edge_port,
            extra_edges: Vec::new(),
            _dead_port: dead,
            values: values.to_vec(),
            src,
            options,
        })
    }

    /// The value a placeholder was rendered with (`DEAD_PORT`, `SERVICE_PORT`, ...).
    pub fn value(&self, key: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Starts one more edge sidecar from the edge template, on ports of its own, in
    /// front of the same service sidecar; answers its index in `extra_edges`.
    pub async fn add_edge(&mut self) -> anyhow::Result<usize> {
        let n = self.extra_edges.len() + 1;
        let port = free_port()?;
        let admin = free_port()?;
        let mut values = self.values.clone();
        for (k, v) in &mut values {
            match *k {
                "EDGE_PORT" => *v = port.to_string(),
                "EDGE_ADMIN_PORT" => *v = admin.to_string(),
                _ => {}
            }
        }
        let side = format!("edge-{n}");
        let sidecar = spawn_as(
            self.dir.path(),
            &self.src,
            "edge",
            &side,
            &values,
            admin,
            &self.options,
        )?;
        wait_ready(&sidecar).await?;
        self.extra_edges.push((sidecar, port));
        Ok(self.extra_edges.len() - 1)
    }

    /// The path of the request the scenario fails.
    pub fn path(&self) -> &str {
        self.spec["path"].as_str().unwrap_or("/")
    }

    /// The code the edge answers in this scenario.
    pub fn expect_code(&self) -> Option<u16> {
        self.spec["expect_code"]
            .as_u64()
            .and_then(|c| u16::try_from(c).ok())
    }

    /// What the diagnosis is expected to find (`diagnosis` in `scenario.json`).
    pub fn diagnosis(&self) -> anyhow::Result<Diagnosis> {
        Diagnosis::from_spec(&self.spec).with_context(|| format!("scenario {}", self.name))
    }

    /// A folder for the test's own files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Sends `GET path` through the edge and answers (code, body).
    pub async fn request(&self, path: &str) -> anyhow::Result<(u16, String)> {
        self.request_via(self.edge_port, path).await
    }

    /// Sends `GET path` through the edge listening on `port`.
    pub async fn request_via(&self, port: u16, path: &str) -> anyhow::Result<(u16, String)> {
        let r = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?
            .get(format!("http://127.0.0.1:{port}{path}"))
            .send()
            .await?;
        let code = r.status().as_u16();
        Ok((code, r.text().await?))
    }

    /// Puts the scenario into its failure where that takes an action (a warm-up
    /// request, then the upstream stopped), then sends the failing request and
    /// checks the edge answers the scenario's code. Answers (code, body).
    pub async fn fail(&mut self) -> anyhow::Result<(u16, String)> {
        if self.spec["upstream"] == "stopped_after_warmup" {
            if let Some(mut up) = self.upstream.take() {
                let (code, _) = self.request(self.path()).await?;
                if code != 200 {
                    bail!("{}: the warm-up request answered {code}", self.name);
                }
                up.stop().await;
            }
        }
        let (code, body) = self.request(self.path()).await?;
        match self.expect_code() {
            Some(want) if code != want => {
                bail!("{}: expected {want}, got {code}: {body:?}", self.name)
            }
            _ => {}
        }
        Ok((code, body))
    }
}

/// Waits until a sidecar answers `/ready`, or fails with its log.
async fn wait_ready(side: &Sidecar) -> anyhow::Result<()> {
    let url = format!("http://{}/ready", side.admin);
    let ready = wait_for("a scenario sidecar to be ready", READY_DEADLINE, || {
        let url = url.clone();
        async move {
            let r = reqwest::get(&url).await.ok()?;
            (r.status() == 200).then_some(())
        }
    })
    .await;
    if let Err(e) = ready {
        bail!("{e}; its log:\n{}", side.log());
    }
    Ok(())
}

/// Renders `<src>/<side>.yaml` and starts Envoy on it, stdout and stderr to one file.
fn spawn(
    dir: &Path,
    src: &Path,
    side: &str,
    values: &[(&str, String)],
    admin_port: u16,
    options: &Options,
) -> anyhow::Result<Sidecar> {
    spawn_as(dir, src, side, side, values, admin_port, options)
}

/// As [`spawn`], naming the rendered files and the node `name`.
fn spawn_as(
    dir: &Path,
    src: &Path,
    template: &str,
    side: &str,
    values: &[(&str, String)],
    admin_port: u16,
    options: &Options,
) -> anyhow::Result<Sidecar> {
    let mut text = std::fs::read_to_string(src.join(format!("{template}.yaml")))?;
    for (k, v) in values {
        text = text.replace(&format!("{{{{{k}}}}}"), v);
    }
    if let Some(i) = text.find("{{") {
        bail!("{side}.yaml: unknown placeholder near {:?}", &text[i..]);
    }
    let config = dir.join(format!("{side}.yaml"));
    std::fs::write(&config, text)?;
    let log_file = dir.join(format!("{side}.log"));
    std::fs::File::create(&log_file)?;
    // Appending, as a container runtime's log does: the access log reopened by
    // `POST /reopen_logs` then writes after Envoy's own lines, never over them.
    let log = std::fs::OpenOptions::new().append(true).open(&log_file)?;
    let mut cmd = Command::new(envoy_binary()?);
    let base_id = next_base_id();
    cmd.arg("-c")
        .arg(&config)
        .arg("--base-id")
        .arg(base_id.to_string());
    if let Some(ms) = options.flush_interval_ms {
        cmd.arg("--file-flush-interval-msec").arg(ms.to_string());
    }
    cmd.arg("--concurrency")
        .arg("1")
        .arg("-l")
        .arg("info")
        .arg("--service-cluster")
        .arg(template)
        .arg("--service-node")
        .arg(format!("{side}-0"))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log));
    let process = Process::spawn_leaving(cmd, Some(shared_memory_file(base_id)))?;
    Ok(Sidecar {
        process: Some(process),
        admin: SocketAddr::from(([127, 0, 0, 1], admin_port)),
        log_file,
    })
}

/// The certificates the templates name: `ca.pem`, `edge.pem`, `service.pem` (signed
/// by `ca.pem`) and `rogue-edge.pem` signed by `rogue-ca.pem`, with their keys.
fn write_certs(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join("mesh"))?;
    std::fs::create_dir_all(dir.join("rogue"))?;
    let mesh = MeshCerts::new(&dir.join("mesh"), "mesh")?;
    let rogue = MeshCerts::new(&dir.join("rogue"), "rogue")?;
    std::fs::copy(&mesh.ca_file, dir.join("ca.pem"))?;
    std::fs::copy(&rogue.ca_file, dir.join("rogue-ca.pem"))?;
    for (name, ca, san) in [
        ("edge", &mesh, "edge.mesh.local"),
        ("service", &mesh, "catalog.mesh.local"),
        ("rogue-edge", &rogue, "edge.mesh.local"),
    ] {
        let id = ca.identity(san)?;
        std::fs::copy(&id.cert_file, dir.join(format!("{name}.pem")))?;
        std::fs::copy(&id.key_file, dir.join(format!("{name}-key.pem")))?;
    }
    Ok(())
}
