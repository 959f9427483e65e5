//! `meshcat apply -f PATH...`: makes the catalog match the files. Every document is
//! read and validated first ([`crate::catalog`]); then the API's records of the
//! zones the files name are read and compared; then, and only when nothing was
//! refused, the writes are made in order: zones created (`POST /zones`) or replaced
//! (`PUT /zones/{z}`), clusters created (in bulk, one `POST /clusters` per chunk),
//! replaced, then deleted (`--prune`). Each line is printed once its write is
//! acknowledged; `--dry-run` prints them all and writes nothing.

use std::io::Write;

use futures::StreamExt;
use meshcat_common::model::{ClusterRecord, ZoneRecord};
use reqwest::Method;
use serde_json::Value;

use super::{Ctx, emit};
use crate::args::ApplyArgs;
use crate::catalog::{self, Action, Current, Desired, Plan, Problem};
use crate::client::{Call, CliError};

/// Records in one bulk `POST /clusters`: the API's bound (1,000).
pub use meshcat_common::limits::MAX_BULK_CLUSTERS as BULK_RECORDS;
/// Bytes of records in one bulk `POST /clusters`, well under the API's default
/// body limit (1 MiB).
pub const BULK_BYTES: usize = 512 << 10;
/// Replacements in flight at once: the aggregator groups writes that arrive together
/// into one durable commit.
const PARALLEL_UPDATES: usize = 8;
/// Zones named per `GET /clusters?zoneName=...` (the API takes 256 parameters).
const ZONES_PER_LIST: usize = 200;

pub async fn run(ctx: &Ctx, args: ApplyArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let docs = catalog::load(&args.files).map_err(problems)?;
    let desired = Desired::new(docs);
    let current = current(ctx, &desired).await?;
    let plan = catalog::plan(&desired, &current, args.prune).map_err(|p| {
        // The files are valid; the catalog refuses what they ask: a failed write,
        // though none was made.
        let text = problems(p).to_string();
        CliError::Failed(format!("{text}\nNothing was written."))
    })?;
    if args.dry_run {
        let text: String = plan
            .lines()
            .into_iter()
            .map(|(a, name)| line(a, &name))
            .collect();
        emit(out, &text)?;
        eprintln!("Dry run: nothing was written.");
        return Ok(());
    }
    execute(ctx, &plan, out).await
}

fn line(action: Action, name: &str) -> String {
    format!("{} {name}\n", action.as_str())
}

/// Every problem, one per line; the exit status of bad files.
fn problems(list: Vec<Problem>) -> CliError {
    let text = list
        .iter()
        .map(Problem::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    CliError::File(text)
}

/// The API's zones, and the clusters of the zones the files name.
async fn current(ctx: &Ctx, desired: &Desired) -> Result<Current, CliError> {
    let mut cur = Current::default();
    let zones: Vec<ZoneRecord> = parse(ctx.api.get(&Call::new(&["zones"])).await?, "GET /zones")?;
    cur.zones = zones
        .into_iter()
        .map(|z| (z.zone_name.clone(), z))
        .collect();
    let named: Vec<String> = desired
        .zone_names()
        .into_iter()
        .filter(|z| cur.zones.contains_key(z))
        .collect();
    for chunk in named.chunks(ZONES_PER_LIST) {
        let mut call = Call::new(&["clusters"]);
        for z in chunk {
            call = call.q("zoneName", z.clone());
        }
        let list: Vec<ClusterRecord> = parse(ctx.api.get(&call).await?, "GET /clusters")?;
        cur.clusters.extend(
            list.into_iter()
                .map(|c| ((c.zone_name.clone(), c.cluster_name.clone()), c)),
        );
    }
    Ok(cur)
}

fn parse<T: serde::de::DeserializeOwned>(v: Value, what: &str) -> Result<T, CliError> {
    serde_json::from_value(v).map_err(|e| CliError::Body {
        what: what.into(),
        reason: e.to_string(),
    })
}

/// Names the record a refused write was for.
fn for_record(name: &str, e: CliError) -> CliError {
    match e {
        CliError::Api {
            what,
            status,
            code,
            message,
        } => CliError::Api {
            what: format!("{name}: {what}"),
            status,
            code,
            message,
        },
        other => other,
    }
}

async fn execute(ctx: &Ctx, plan: &Plan, out: &mut dyn Write) -> Result<(), CliError> {
    for (action, z) in &plan.zones {
        let name = catalog::zone_name(&z.zone_name);
        let write = match action {
            Action::Created => Some((Method::POST, Call::new(&["zones"]))),
            Action::Updated => Some((Method::PUT, Call::new(&["zones", &z.zone_name]))),
            Action::Unchanged | Action::Deleted => None,
        };
        if let Some((method, call)) = write {
            ctx.api
                .json(method, &call, Some(&body(z)))
                .await
                .map_err(|e| for_record(&name, e))?;
        }
        emit(out, &line(*action, &name))?;
    }
    for chunk in chunks(&plan.create) {
        let records = match chunk {
            [one] => body(one),
            many => Value::Array(many.iter().map(body).collect()),
        };
        let first = &chunk[0];
        ctx.api
            .json(Method::POST, &Call::new(&["clusters"]), Some(&records))
            .await
            .map_err(|e| {
                let name = if chunk.len() == 1 {
                    catalog::cluster_name(&first.zone_name, &first.cluster_name)
                } else {
                    format!(
                        "{} clusters from {}",
                        chunk.len(),
                        catalog::cluster_name(&first.zone_name, &first.cluster_name)
                    )
                };
                for_record(&name, e)
            })?;
        let text: String = chunk
            .iter()
            .map(|c| {
                line(
                    Action::Created,
                    &catalog::cluster_name(&c.zone_name, &c.cluster_name),
                )
            })
            .collect();
        emit(out, &text)?;
    }
    let mut updates = futures::stream::iter(plan.update.iter().map(|c| async move {
        let call = Call::new(&["clusters", &c.cluster_name]).q("zoneName", &c.zone_name);
        let name = catalog::cluster_name(&c.zone_name, &c.cluster_name);
        ctx.api
            .json(Method::PUT, &call, Some(&body(c)))
            .await
            .map(|_| name.clone())
            .map_err(|e| for_record(&name, e))
    }))
    .buffered(PARALLEL_UPDATES);
    // Every update sent is waited for, so that each one the API took is printed even
    // when another failed; the first refusal is then the command's (the others are
    // said on standard error) and nothing is deleted.
    let mut refused: Vec<CliError> = Vec::new();
    while let Some(done) = updates.next().await {
        match done {
            Ok(name) => emit(out, &line(Action::Updated, &name))?,
            Err(e) => refused.push(e),
        }
    }
    drop(updates);
    let mut refused = refused.into_iter();
    if let Some(first) = refused.next() {
        for other in refused {
            other.report();
        }
        return Err(first);
    }
    let text: String = plan
        .unchanged
        .iter()
        .map(|c| {
            line(
                Action::Unchanged,
                &catalog::cluster_name(&c.zone_name, &c.cluster_name),
            )
        })
        .collect();
    emit(out, &text)?;
    for (zone, cluster) in &plan.delete {
        let name = catalog::cluster_name(zone, cluster);
        let call = Call::new(&["clusters", cluster]).q("zoneName", zone);
        ctx.api
            .json(Method::DELETE, &call, None)
            .await
            .map_err(|e| for_record(&name, e))?;
        emit(out, &line(Action::Deleted, &name))?;
    }
    Ok(())
}

/// Records to create, in chunks the API takes in one bulk `POST /clusters`.
pub fn chunks(records: &[ClusterRecord]) -> Vec<&[ClusterRecord]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, r) in records.iter().enumerate() {
        let size = serde_json::to_vec(r).map_or(0, |v| v.len()) + 1;
        if i > start && (i - start == BULK_RECORDS || bytes + size > BULK_BYTES) {
            out.push(&records[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < records.len() {
        out.push(&records[start..]);
    }
    out
}

/// A record as the JSON body the API takes.
fn body<T: serde::Serialize>(record: &T) -> Value {
    serde_json::to_value(record).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_go_in_chunks_under_both_bounds() {
        let many: Vec<ClusterRecord> = (0..2500)
            .map(|i| ClusterRecord::new("z", &format!("c{i}"), "n"))
            .collect();
        let sizes: Vec<usize> = chunks(&many).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [1000, 1000, 500]);
        let mut big = ClusterRecord::new("z", "big", "n");
        big.description = "x".repeat(4000);
        let large: Vec<ClusterRecord> = (0..300).map(|_| big.clone()).collect();
        let parts = chunks(&large);
        assert!(parts.len() > 2, "{}", parts.len());
        for p in &parts {
            let bytes: usize = p
                .iter()
                .map(|r| serde_json::to_vec(r).unwrap().len() + 1)
                .sum();
            assert!(bytes <= BULK_BYTES);
        }
        assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), 300);
        assert!(chunks(&[]).is_empty());
    }
}
