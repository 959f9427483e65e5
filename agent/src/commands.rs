//! Runs the aggregator's commands against this agent's sidecars, and feeds the
//! reporter with the board's snapshots. Each command reaches the sidecar through the
//! admin API client of the target it names.

use futures::FutureExt;
use futures::future::BoxFuture;
use meshcat_common::wire::{Command, CommandOutput, InstanceReport};

use crate::Agent;
use crate::envoy::seed_level;
use crate::report::{CommandHandler, SnapshotSource};

impl SnapshotSource for Agent {
    fn snapshot(&self) -> Vec<InstanceReport> {
        self.board().snapshot()
    }
}

impl CommandHandler for Agent {
    fn handle(
        &self,
        instance: String,
        cmd: Command,
    ) -> BoxFuture<'static, Result<CommandOutput, String>> {
        let agent = self.clone();
        async move { run(&agent, &instance, cmd).await }.boxed()
    }
}

async fn run(agent: &Agent, instance: &str, cmd: Command) -> Result<CommandOutput, String> {
    let admin = agent.admin(Some(instance)).map_err(|e| e.to_string())?;
    match cmd {
        Command::ConfigDump => admin
            .config_dump()
            .await
            .map(CommandOutput::ConfigDump)
            .map_err(|e| e.to_string()),
        Command::GetLogLevel => admin
            .log_level()
            .await
            .map(|l| CommandOutput::LogLevel(seed_level(&l).to_owned()))
            .map_err(|e| e.to_string()),
        Command::SetLogLevel { level } => {
            admin
                .set_log_level(&level)
                .await
                .map_err(|e| e.to_string())?;
            let now = admin.log_level().await.map_err(|e| e.to_string())?;
            Ok(CommandOutput::LogLevel(seed_level(&now).to_owned()))
        }
    }
}
