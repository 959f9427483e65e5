//! docs/configuration.md stays true to both command lines: every long flag that
//! `--help` offers (read from the clap definitions of both binaries) appears in the
//! binary's table with its `MESHCAT_*` twin, and every row names a real flag.

use std::collections::BTreeMap;
use std::path::Path;

use clap::CommandFactory;

/// Flag -> environment variable of a clap command and its subcommands (without the
/// generated `--help` and `--version`).
fn flags(cmd: &clap::Command) -> BTreeMap<String, Option<String>> {
    let mut out = BTreeMap::new();
    for arg in cmd.get_arguments() {
        if let Some(long) = arg.get_long()
            && !matches!(long, "help" | "version")
        {
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            out.insert(format!("--{long}"), env);
        }
    }
    for sub in cmd.get_subcommands() {
        out.extend(flags(sub));
    }
    out
}

/// Rows `| \`--flag\` | \`MESHCAT_X\` | ...` of the section `## {title}`.
fn documented(title: &str) -> BTreeMap<String, Option<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let text = std::fs::read_to_string(path).unwrap();
    let heading = format!("## {title}");
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with(&heading[3..]))
        .unwrap_or_else(|| panic!("no section {heading:?} in docs/configuration.md"));
    section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let flag = cells.get(1)?.strip_prefix("`--")?.strip_suffix('`')?;
            let env = cells
                .get(2)
                .and_then(|e| e.strip_prefix('`')?.strip_suffix('`'))
                .map(str::to_owned);
            Some((format!("--{flag}"), env))
        })
        .collect()
}

fn twin(flag: &str) -> String {
    format!(
        "MESHCAT_{}",
        flag.trim_start_matches("--")
            .replace('-', "_")
            .to_uppercase()
    )
}

fn check(binary: &str, cmd: clap::Command) {
    let offered = flags(&cmd);
    let rows = documented(binary);
    assert!(offered.len() >= 10, "{binary}: {offered:?}");
    for (flag, env) in &offered {
        let expected = twin(flag);
        assert_eq!(
            env.as_deref(),
            Some(expected.as_str()),
            "{binary} {flag}: environment twin"
        );
        assert_eq!(
            rows.get(flag),
            Some(env),
            "{binary} {flag} ({expected}) missing or with another variable in docs/configuration.md"
        );
    }
    for flag in rows.keys() {
        assert!(
            offered.contains_key(flag),
            "docs/configuration.md documents {binary} {flag}, which does not exist"
        );
    }
}

#[test]
fn every_flag_is_documented() {
    check(
        "meshcat-aggregator",
        meshcat_aggregator::config::Cli::command(),
    );
    check("meshcat-agent", meshcat_agent::AgentConfig::command());
}
