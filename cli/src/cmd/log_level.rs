//! `meshcat log-level get|set`: the sidecars' log level through the aggregator and
//! their agents (contract section 5). Without `--instance`, `get` asks every live
//! instance of the cluster at once and `set` uses the per-cluster route, which
//! answers each instance's outcome.

use std::io::Write;

use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};

use super::{Ctx, emit};
use crate::args::{Format, Level, LogLevelAction, LogTarget};
use crate::client::{Call, CliError};
use crate::render::{self, Cell, Table, s};

pub async fn run(ctx: &Ctx, action: LogLevelAction, out: &mut dyn Write) -> Result<(), CliError> {
    let (format, (rows, failed)) = match action {
        LogLevelAction::Get { target } => (target.output.output, get(ctx, &target).await?),
        LogLevelAction::Set { level, target } => {
            (target.output.output, set(ctx, level, &target).await?)
        }
    };
    let text = match format {
        Format::Table => {
            let mut t = Table::new(&["INSTANCE", "LEVEL"]);
            for (instance, outcome) in &rows {
                t.row(vec![
                    instance.as_str().into(),
                    match outcome {
                        Ok(level) => Cell::from(level.as_str()),
                        Err(why) => Cell::styled(format!("failed: {why}"), render::RED),
                    },
                ]);
            }
            t.render(ctx.width)
        }
        f => render::data(&as_data(&rows), f)?,
    };
    emit(out, &text)?;
    if failed > 0 {
        return Err(CliError::Failed(format!(
            "{failed} of {} instances failed",
            rows.len()
        )));
    }
    Ok(())
}

/// The rows for `-o json|yaml`: `[{"instance", "level"} | {"instance", "error"}]`,
/// one per instance, in the table's order.
fn as_data(rows: &[(String, Result<String, String>)]) -> Value {
    rows.iter()
        .map(|(instance, outcome)| match outcome {
            Ok(level) => json!({"instance": instance, "level": level}),
            Err(why) => json!({"instance": instance, "error": why}),
        })
        .collect()
}

/// Instances asked at once: each answer waits on a sidecar through its agent.
const PARALLEL: usize = 16;

type Rows = (Vec<(String, Result<String, String>)>, usize);

fn instance_call<'a>(t: &'a LogTarget, instance: &'a str) -> Call<'a> {
    Call::new(&[
        "zones",
        &t.zone,
        "clusters",
        &t.cluster,
        "instances",
        instance,
        "logging",
    ])
}

/// The live instances of the cluster (their names need the read token).
async fn instances(ctx: &Ctx, t: &LogTarget) -> Result<Vec<String>, CliError> {
    let list = ctx
        .api
        .get(&Call::new(&["clusters", &t.cluster]).q("zoneName", &t.zone))
        .await?;
    let view = &list[0];
    if view["authorized"] == Value::Bool(false) {
        return Err(CliError::Failed(
            "the instances of a cluster are live data: give the read or write token (--token-file)"
                .into(),
        ));
    }
    let names: Vec<String> = view["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| s(i, "name").to_owned())
        .collect();
    if names.is_empty() {
        return Err(CliError::Failed(format!(
            "cluster {} in zone {} has no live instance",
            t.cluster, t.zone
        )));
    }
    Ok(names)
}

async fn get(ctx: &Ctx, t: &LogTarget) -> Result<Rows, CliError> {
    if let Some(i) = &t.instance {
        // One instance asked for: its refusal is the command's.
        let level = ctx.api.text(Method::GET, &instance_call(t, i)).await?;
        return Ok((vec![(i.clone(), Ok(level.trim().to_owned()))], 0));
    }
    let names = instances(ctx, t).await?;
    let answers: Vec<Result<String, CliError>> = futures::stream::iter(names.iter())
        .map(|i| async move {
            ctx.api
                .text(Method::GET, &instance_call(t, i))
                .await
                .map(|l| l.trim().to_owned())
        })
        .buffered(PARALLEL)
        .collect()
        .await;
    let failed = answers.iter().filter(|a| a.is_err()).count();
    let rows = names
        .into_iter()
        .zip(answers)
        .map(|(n, a)| (n, a.map_err(|e| api_message(&e))))
        .collect();
    Ok((rows, failed))
}

async fn set(ctx: &Ctx, level: Level, t: &LogTarget) -> Result<Rows, CliError> {
    if let Some(i) = &t.instance {
        let now = ctx
            .api
            .text(Method::PUT, &instance_call(t, i).q("level", level.as_str()))
            .await?;
        return Ok((vec![(i.clone(), Ok(now.trim().to_owned()))], 0));
    }
    let call = Call::new(&["zones", &t.zone, "clusters", &t.cluster, "logging"])
        .q("level", level.as_str());
    let answer = ctx.api.json(Method::PUT, &call, None).await?;
    Ok(outcomes(&answer))
}

/// The rows of a per-cluster answer: `{"succeeded", "failed", "instances":
/// [{"instance", "status", "level"} | {"instance", "status", "code", "error"}]}`.
pub fn outcomes(answer: &Value) -> Rows {
    let rows: Vec<(String, Result<String, String>)> = answer["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            let name = s(i, "instance").to_owned();
            if i["status"].as_u64() == Some(200) {
                (name, Ok(s(i, "level").to_owned()))
            } else {
                (name, Err(format!("{} ({})", s(i, "error"), s(i, "code"))))
            }
        })
        .collect();
    let failed = rows.iter().filter(|(_, r)| r.is_err()).count();
    (rows, failed)
}

/// The API's sentence of a refusal, without the request line.
fn api_message(e: &CliError) -> String {
    match e {
        CliError::Api { message, code, .. } => format!("{message} ({code})"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cluster_outcomes() {
        let answer = json!({"zoneName": "east", "clusterName": "catalog", "succeeded": 1, "failed": 1,
            "instances": [
                {"instance": "catalog-0", "status": 200, "level": "warn"},
                {"instance": "catalog-1", "status": 503, "code": "agent_timeout",
                 "error": "The agent of instance catalog-1 did not answer within 5s."}]});
        let (rows, failed) = outcomes(&answer);
        assert_eq!(failed, 1);
        assert_eq!(rows[0], ("catalog-0".into(), Ok("warn".into())));
        assert_eq!(
            rows[1].1,
            Err("The agent of instance catalog-1 did not answer within 5s. (agent_timeout)".into())
        );
        assert_eq!(
            as_data(&rows),
            json!([{"instance": "catalog-0", "level": "warn"},
                   {"instance": "catalog-1",
                    "error": "The agent of instance catalog-1 did not answer within 5s. (agent_timeout)"}])
        );
    }
}
