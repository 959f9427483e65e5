//! The documentation stays true to the command line: docs/configuration.md lists the
//! flags every subcommand takes with their `MESHCAT_*` twins, and docs/cli.md has a
//! section for every subcommand and names each of its flags.

use std::collections::BTreeSet;
use std::path::Path;

use clap::CommandFactory;
use meshcat_cli::args::Cli;

fn doc(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs")
            .join(name),
    )
    .unwrap()
}

#[test]
fn global_flags_are_in_the_configuration_table_with_their_twins() {
    let text = doc("configuration.md");
    let section = text
        .split("\n## ")
        .find(|s| s.lines().next() == Some("meshcat"))
        .expect("a section ## meshcat in docs/configuration.md");
    let rows: BTreeSet<(String, String)> = section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let flag = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let env = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
            flag.starts_with("--")
                .then(|| (flag.to_owned(), env.to_owned()))
        })
        .collect();
    let cmd = Cli::command();
    let offered: BTreeSet<(String, String)> = cmd
        .get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            (a.is_global_set()).then(|| {
                let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
                (format!("--{long}"), env.unwrap_or_default())
            })
        })
        .collect();
    assert_eq!(offered.len(), 3, "{offered:?}");
    for (flag, env) in &offered {
        let twin = format!("MESHCAT_{}", flag[2..].replace('-', "_").to_uppercase());
        assert_eq!(env, &twin, "{flag}");
    }
    assert_eq!(rows, offered);
}

#[test]
fn every_subcommand_and_flag_is_in_the_cli_guide() {
    let text = doc("cli.md");
    let cmd = Cli::command();
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let heading = format!("\n## meshcat {}\n", sub.get_name());
        let Some(at) = text.find(&heading) else {
            panic!("docs/cli.md lacks {heading:?}");
        };
        // The subcommand's own section: up to the next `## ` heading.
        let body = &text[at + heading.len()..];
        let section = &body[..body.find("\n## ").unwrap_or(body.len())];
        let mut stack = vec![sub.clone()];
        while let Some(c) = stack.pop() {
            for a in c.get_arguments() {
                if let Some(long) = a.get_long()
                    && !a.is_global_set()
                    && long != "help"
                {
                    let flag = format!("--{long}");
                    let short = a.get_short().map(|s| format!("-{s} "));
                    assert!(
                        section.contains(&flag) || short.is_some_and(|s| section.contains(&s)),
                        "docs/cli.md's section of meshcat {} does not name {flag} of {}",
                        sub.get_name(),
                        c.get_name()
                    );
                }
            }
            stack.extend(c.get_subcommands().cloned());
        }
    }
}
