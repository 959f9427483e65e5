//! The reporter against the real ingest server over QUIC on 127.0.0.1:0: reports reach
//! the sink, commands make the round trip, a hung command times out by its deadline
//! while others proceed, the reporter reconnects after a server restart and resends its
//! state, and says goodbye on shutdown.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use meshcat_agent::report::{CommandHandler, Reporter, ReporterConfig, SnapshotSource, TargetKey};
use meshcat_aggregator::ingest::{
    AgentAuth, Agents, CommandError, Ingest, IngestConfig, RecordingSink,
};
use meshcat_common::tls::{self, ClientAuth, DevFiles};
use meshcat_common::wire::{Command, CommandOutput, InstanceReport};
use prometheus::Registry;
use tokio::sync::oneshot;

struct Source(Mutex<Vec<InstanceReport>>);

impl SnapshotSource for Source {
    fn snapshot(&self) -> Vec<InstanceReport> {
        self.0.lock().unwrap().clone()
    }
}

/// Answers the log level; never answers for instance `hung`; fails config dumps.
#[derive(Default, Clone)]
struct Handler {
    levels_set: Arc<Mutex<Vec<(String, String)>>>,
}

impl CommandHandler for Handler {
    fn handle(
        &self,
        target: TargetKey,
        cmd: Command,
    ) -> BoxFuture<'static, Result<CommandOutput, String>> {
        let levels_set = self.levels_set.clone();
        let instance = target.instance;
        Box::pin(async move {
            if instance == "hung" {
                futures::future::pending::<()>().await;
            }
            match cmd {
                Command::GetLogLevel => Ok(CommandOutput::LogLevel("info".into())),
                Command::SetLogLevel { level } => {
                    levels_set.lock().unwrap().push((instance, level.clone()));
                    Ok(CommandOutput::LogLevel(level))
                }
                Command::ConfigDump => Err("sidecar admin unreachable".into()),
                other => Err(format!("{} is not handled by this test", other.name())),
            }
        })
    }
}

fn instance(zone: &str, cluster: &str, name: &str) -> InstanceReport {
    InstanceReport {
        admin_address: "127.0.0.1:9901".into(),
        reachable: true,
        start_time_ms: 1_700_000_000_000,
        server_state: "LIVE".into(),
        envoy_version: "1.40.0".into(),
        log_level: Some("info".into()),
        ..InstanceReport::unread(zone.into(), cluster.into(), name.into())
    }
}

struct Server {
    sink: Arc<RecordingSink>,
    agents: Agents,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    fn start(files: &DevFiles, socket: std::net::UdpSocket) -> Server {
        let server = tls::server_config(
            &files.server_cert,
            &files.server_key,
            &ClientAuth::Required(files.ca.clone()),
        )
        .unwrap();
        Server::with_config(IngestConfig::new(server, AgentAuth::certificates()), socket)
    }

    fn with_config(config: IngestConfig, socket: std::net::UdpSocket) -> Server {
        let sink = Arc::new(RecordingSink::default());
        let ingest = Ingest::new(config, sink.clone(), &Registry::new()).unwrap();
        let agents = ingest.agents();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            ingest
                .run(socket, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Server {
            sink,
            agents,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("ingest stops by itself")
            .unwrap();
    }
}

struct Agent {
    registry: Registry,
    handler: Handler,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Agent {
    fn start(
        files: &DevFiles,
        addr: std::net::SocketAddr,
        instances: Vec<InstanceReport>,
    ) -> Agent {
        let client =
            tls::client_config(&files.ca, Some((&files.agent_cert, &files.agent_key))).unwrap();
        let config = ReporterConfig::new(addr.to_string(), "localhost", client, "agent-1");
        Agent::with_config(config, instances)
    }

    fn with_config(mut config: ReporterConfig, instances: Vec<InstanceReport>) -> Agent {
        config.interval = Duration::from_millis(100);
        let registry = Registry::new();
        let handler = Handler::default();
        let reporter = Reporter::new(
            config,
            Arc::new(Source(Mutex::new(instances))),
            Arc::new(handler.clone()),
            &registry,
        )
        .unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(reporter.run(async {
            let _ = stopped.await;
        }));
        Agent {
            registry,
            handler,
            stop: Some(stop),
            task,
        }
    }

    fn metric(&self, name: &str) -> f64 {
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with(&format!("{name} ")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the reporter stops within 5 s")
            .unwrap();
    }
}

async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn setup() -> (tempfile::TempDir, DevFiles, std::net::UdpSocket) {
    let dir = tempfile::tempdir().unwrap();
    let files = tls::dev_setup(dir.path()).unwrap();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    (dir, files, socket)
}

#[tokio::test]
async fn reports_reach_the_sink_and_commands_make_the_round_trip() {
    let (_dir, files, socket) = setup();
    let addr = socket.local_addr().unwrap();
    let server = Server::start(&files, socket);
    let agent = Agent::start(&files, addr, vec![instance("east", "web", "web-1")]);

    eventually("two reports", || server.sink.count() >= 2).await;
    let (agent_id, report) = server.sink.reports()[0].clone();
    assert_eq!(meshcat_aggregator::ingest::agent_of(&agent_id), "agent-1");
    // The first report of an instance on a connection is its whole state; the next
    // ones say what changed since the acknowledged one (here nothing).
    assert_eq!(
        report,
        InstanceReport {
            seq: 1,
            ..instance("east", "web", "web-1")
        }
    );
    let second = server.sink.reports()[1].1.clone();
    assert_eq!(second.seq, 2);
    assert_eq!(second.delta.as_ref().map(|d| d.base), Some(1));
    eventually("the reporter's metrics", || {
        agent.metric("meshcat_agent_reports_sent_total") >= 2.0
            && agent.metric("meshcat_agent_connected") == 1.0
            && agent.metric("meshcat_agent_pending_snapshot") == 0.0
    })
    .await;

    let deadline = Duration::from_secs(5);
    let level = server
        .agents
        .command("east", "web", "web-1", Command::GetLogLevel, deadline)
        .await
        .unwrap();
    assert_eq!(level, CommandOutput::LogLevel("info".into()));
    let set = Command::SetLogLevel {
        level: "warning".into(),
    };
    server
        .agents
        .command("east", "web", "web-1", set, deadline)
        .await
        .unwrap();
    assert_eq!(
        agent.handler.levels_set.lock().unwrap().as_slice(),
        [("web-1".to_owned(), "warning".to_owned())]
    );
    let failed = server
        .agents
        .command("east", "web", "web-1", Command::ConfigDump, deadline)
        .await;
    assert!(
        matches!(&failed, Err(CommandError::Failed(e)) if e.contains("unreachable")),
        "{failed:?}"
    );
    let unknown = server
        .agents
        .command("east", "web", "web-9", Command::GetLogLevel, deadline)
        .await;
    assert!(
        matches!(unknown, Err(CommandError::UnknownInstance { .. })),
        "{unknown:?}"
    );
    agent.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_hung_command_times_out_by_its_deadline_while_others_proceed() {
    let (_dir, files, socket) = setup();
    let addr = socket.local_addr().unwrap();
    let server = Server::start(&files, socket);
    let agent = Agent::start(
        &files,
        addr,
        vec![
            instance("east", "web", "web-1"),
            instance("east", "web", "hung"),
        ],
    );
    eventually("a report", || server.agents.knows("east", "web", "hung")).await;

    let agents = server.agents.clone();
    let started = Instant::now();
    let hung = tokio::spawn(async move {
        agents
            .command(
                "east",
                "web",
                "hung",
                Command::GetLogLevel,
                Duration::from_millis(800),
            )
            .await
    });
    // Several quick commands complete while the hung one waits.
    for _ in 0..5 {
        let t = Instant::now();
        let ok = server
            .agents
            .command(
                "east",
                "web",
                "web-1",
                Command::GetLogLevel,
                Duration::from_secs(5),
            )
            .await;
        assert!(ok.is_ok(), "{ok:?}");
        assert!(t.elapsed() < Duration::from_millis(800));
    }
    let reports_before = server.sink.count();
    let hung = hung.await.unwrap();
    let waited = started.elapsed();
    assert!(matches!(hung, Err(CommandError::Timeout(_))), "{hung:?}");
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    eventually("reports keep flowing", || {
        server.sink.count() > reports_before + 2
    })
    .await;
    agent.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn the_reporter_reconnects_after_a_restart_and_resends_its_state() {
    let (_dir, files, socket) = setup();
    let addr = socket.local_addr().unwrap();
    let first = Server::start(&files, socket);
    let agent = Agent::start(&files, addr, vec![instance("east", "web", "web-1")]);
    eventually("a first report", || first.sink.count() >= 1).await;
    first.stop().await;
    eventually("the reporter notices", || {
        agent.metric("meshcat_agent_connected") == 0.0
            && agent.metric("meshcat_agent_pending_snapshot") == 1.0
    })
    .await;

    // The same address again, as after a restart.
    let socket = std::net::UdpSocket::bind(addr).unwrap();
    let second = Server::start(&files, socket);
    eventually("the state resent to the new server", || {
        second.sink.count() >= 1
    })
    .await;
    // Whole again on the new connection.
    let resent = second.sink.reports()[0].1.clone();
    assert_eq!(resent.delta, None);
    assert_eq!(
        resent,
        InstanceReport {
            seq: resent.seq,
            ..instance("east", "web", "web-1")
        }
    );
    assert!(agent.metric("meshcat_agent_reconnects_total") >= 1.0);
    eventually("connected again", || {
        agent.metric("meshcat_agent_connected") == 1.0
    })
    .await;
    agent.stop().await;
    second.stop().await;
}

#[tokio::test]
async fn the_reporter_says_goodbye_on_shutdown() {
    let (_dir, files, socket) = setup();
    let addr = socket.local_addr().unwrap();
    let server = Server::start(&files, socket);
    let agent = Agent::start(&files, addr, vec![instance("east", "web", "web-1")]);
    eventually("a report", || server.sink.count() >= 1).await;
    agent.stop().await;
    eventually("agent_gone", || server.sink.is_gone("agent-1")).await;
    assert!(!server.agents.knows("east", "web", "web-1"));
    server.stop().await;
}

#[tokio::test]
async fn token_agents_report_and_a_wrong_token_backs_off() {
    let (dir, files, socket) = setup();
    let addr = socket.local_addr().unwrap();
    let tokens = dir.path().join("agent-tokens");
    std::fs::write(&tokens, "t0ken-east east\n").unwrap();
    let server_tls =
        tls::server_config(&files.server_cert, &files.server_key, &ClientAuth::None).unwrap();
    let auth = AgentAuth::default().with_token_file(&tokens).unwrap();
    let server = Server::with_config(IngestConfig::new(server_tls, auth), socket);

    let agent_with = |token: &str| {
        let client = tls::client_config(&files.ca, None).unwrap();
        let mut config = ReporterConfig::new(addr.to_string(), "localhost", client, "agent-1");
        config.token = Some(token.to_owned());
        config
    };
    let wrong = Agent::with_config(
        agent_with("t0ken-wrong"),
        vec![instance("east", "web", "web-1")],
    );
    eventually("a few refused attempts", || {
        wrong.metric("meshcat_agent_reconnects_total") >= 2.0
    })
    .await;
    assert_eq!(wrong.metric("meshcat_agent_reports_sent_total"), 0.0);
    assert_eq!(wrong.metric("meshcat_agent_connected"), 0.0);
    // Backoff: 200 ms doubling (jittered down to half at most) — a handful of attempts
    // in the first second, not hundreds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(wrong.metric("meshcat_agent_reconnects_total") <= 6.0);
    wrong.stop().await;
    assert_eq!(server.sink.count(), 0);

    let right = Agent::with_config(
        agent_with("t0ken-east"),
        vec![instance("east", "web", "web-1")],
    );
    eventually("reports with the token", || server.sink.count() >= 2).await;
    right.stop().await;
    server.stop().await;
}
