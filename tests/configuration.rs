//! Every setting has one source. The `RINGREC_*` variables: each one the code names is in
//! `config::VARIABLES`, only `config::var` reads them, and docs/configuration.md holds the
//! table made from the list. The flags of `ringrec train`: each is a declared setting
//! (`TrainConfig::all_settings`) or one of the output's flags.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use ringrec::config::{variables_table, VARIABLES};
use ringrec::train::TrainConfig;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, with its text up to its first `#[cfg(test)]` (unit tests
/// may name made-up variables).
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                let code = text.split("#[cfg(test)]").next().unwrap_or("").to_string();
                out.push((p, code));
            }
        }
    }
    out.sort();
    out
}

/// The `RINGREC_NAME` words of `text`, with their line numbers.
fn variable_names(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("RINGREC_") {
            let tail = &rest[at..];
            let len = tail.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
            // `RINGREC_FAULT_*` names a family: kept with its trailing `_`.
            let name = &tail[..len];
            if name.len() > "RINGREC_".len() {
                found.push((i + 1, name.to_string()));
            }
            rest = &tail[len.max(1)..];
        }
    }
    found
}

#[test]
fn the_scanner_finds_variable_names() {
    let v = variable_names("a RINGREC_FOO_BAR=1 and `RINGREC_*`\nRINGREC_X2, RINGREC_, RINGREC_FAULT_*");
    assert_eq!(v, vec![(1, "RINGREC_FOO_BAR".to_string()), (2, "RINGREC_X2".to_string()), (2, "RINGREC_FAULT_".to_string())]);
}

#[test]
fn every_variable_the_code_names_is_in_the_one_list() {
    let known: BTreeSet<&str> = VARIABLES.iter().map(|v| v.name).collect();
    assert_eq!(known.len(), VARIABLES.len(), "a variable is listed twice");
    let mut unknown = Vec::new();
    for (path, code) in sources(&root().join("src")) {
        for (line, name) in variable_names(&code) {
            let family = name.ends_with('_') && known.iter().any(|k| k.starts_with(name.as_str()));
            if !known.contains(name.as_str()) && !family {
                unknown.push(format!("{}:{line}: {name}", path.display()));
            }
        }
    }
    assert!(unknown.is_empty(), "variables named in src/ but missing from config::VARIABLES (add them there, with their default and meaning):\n{}", unknown.join("\n"));
    for s in TrainConfig::all_settings() {
        if let Some(env) = s.env {
            assert!(known.contains(env), "{} names {env}, which config::VARIABLES lacks", s.flag);
        }
    }
}

#[test]
fn only_config_reads_the_environment_for_ringrec_variables() {
    let mut reads = Vec::new();
    for (path, code) in sources(&root().join("src")) {
        if path.ends_with("src/config.rs") {
            continue;
        }
        for (i, line) in code.lines().enumerate() {
            // (`ringrec launch` forwards every RINGREC_* variable to mpirun: `env::vars()`
            // passes them on without reading one.)
            let reads_env = line.contains("env::var(") || line.contains("env::var_os(");
            let ringrec_var = line.contains("RINGREC_") || line.contains("LIB_DIR_VAR");
            let clap_env = line.contains("#[arg(") && line.contains("env = \"RINGREC_");
            if (reads_env && ringrec_var) || clap_env {
                reads.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(reads.is_empty(), "RINGREC_* variables must be read through ringrec::config::var (or cli_default for a flag's default):\n{}", reads.join("\n"));
}

#[test]
fn the_documented_table_is_the_one_list() {
    let doc = std::fs::read_to_string(root().join("docs/configuration.md")).expect("docs/configuration.md");
    let table = variables_table();
    assert!(doc.contains(&table), "docs/configuration.md must hold the table made from config::VARIABLES, verbatim; replace its table with the output of `ringrec info --variables` (up to `set here`):\n\n{table}");
    let printed = Command::new(env!("CARGO_BIN_EXE_ringrec")).args(["info", "--variables"]).env("RINGREC_TABLE_SEED", "7").output().unwrap();
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.starts_with(&table) && printed.contains("set here: RINGREC_TABLE_SEED=7"), "`ringrec info --variables` prints the table:\n{printed}");
    let rows = doc.lines().filter(|l| l.starts_with("| `RINGREC_")).count();
    assert_eq!(rows, VARIABLES.len(), "docs/configuration.md has variable rows outside the generated table");
}

#[test]
fn every_train_flag_is_a_setting_or_an_output_flag() {
    let help = Command::new(env!("CARGO_BIN_EXE_ringrec")).args(["train", "--help"]).output().unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    let flags: BTreeSet<String> = text.split_whitespace().filter(|w| w.starts_with("--") && w.len() > 2).map(|w| w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()).filter(|w| w.starts_with("--")).collect();
    let settings: BTreeSet<String> = TrainConfig::all_settings().into_iter().map(|s| s.flag.to_string()).collect();
    let output: BTreeSet<String> = ["--progress-dir", "--json", "--no-progress", "--help"].iter().map(|s| s.to_string()).collect();
    // Every setting is a flag of `ringrec train`.
    let missing: Vec<&String> = settings.iter().filter(|f| !text.contains(&format!("{f} ")) && !text.contains(&format!("{f}\n"))).collect();
    assert!(missing.is_empty(), "settings that `ringrec train --help` lacks: {missing:?}");
    // Every option line's flag is a setting or an output flag.
    let options: BTreeSet<String> = text.lines().filter_map(|l| l.trim_start().strip_prefix("--")).map(|l| format!("--{}", l.split([' ', '<']).next().unwrap_or(""))).collect();
    let stray: Vec<&String> = options.iter().filter(|f| !settings.contains(*f) && !output.contains(*f)).collect();
    assert!(stray.is_empty(), "flags of `ringrec train` that are not declared settings: {stray:?}");
    assert!(flags.len() >= settings.len());
}
