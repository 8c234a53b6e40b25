//! The project's own rules that code can check: every HCCN_* variable is parsed in config.rs
//! only and listed in the README's one table; every shell block of the README is either run
//! here (`sh runnable`) or names what checks it (`sh covered-by=PATH`), and what the README
//! says about a run it shows (the heat map's caption) holds for that run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hccn_runtime::config::VARIABLES;
use hccn_tests::launch;
use hccn_tests::scratch::{clean, TempDir};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn readme_table_lists_every_variable() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    for v in VARIABLES {
        let row = format!("| `{}` | {} |", v.name, v.default_text());
        assert!(
            readme.contains(&row),
            "README.md's variable table lacks the row for {} with its default {} (runtime/src/config.rs)",
            v.name,
            v.default_text()
        );
    }
}

#[test]
fn variables_are_read_only_in_config_rs() {
    let mut files = Vec::new();
    for dir in ["runtime/src", "capi/src", "tools/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    for f in files {
        if f.ends_with("config.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for pat in ["var(\"HCCN_", "var_os(\"HCCN_"] {
            assert!(
                !text.contains(pat),
                "{} reads an HCCN_* variable itself; parse it in runtime/src/config.rs",
                f.display()
            );
        }
    }
}

/// A fenced block of a Markdown file: its info string (`sh runnable`), text and first line.
#[derive(Debug)]
struct Block {
    info: String,
    body: String,
    line: usize,
}

fn fenced_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match (open.as_mut(), line.trim_start().strip_prefix("```")) {
            (None, Some(info)) => open = Some(Block { info: info.trim().to_owned(), body: String::new(), line: i + 1 }),
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some(b), None) => {
                b.body.push_str(line);
                b.body.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

/// Every shell block of the README says how it is checked: `sh runnable` (run below) or
/// `sh covered-by=PATH` (the test or script that runs what it shows).
#[test]
fn every_shell_block_of_the_readme_is_run_or_names_what_checks_it() {
    let blocks = fenced_blocks(&readme());
    let mut runnable = 0;
    for b in blocks.iter().filter(|b| b.info.split_whitespace().next() == Some("sh")) {
        let words: Vec<&str> = b.info.split_whitespace().skip(1).collect();
        if words.contains(&"runnable") {
            runnable += 1;
            continue;
        }
        let covered = words.iter().find_map(|w| w.strip_prefix("covered-by="));
        let Some(path) = covered else {
            panic!("README.md line {}: a sh block without `runnable` or `covered-by=PATH`: {}", b.line, b.body)
        };
        assert!(root().join(path).exists(), "README.md line {}: covered-by={path} does not exist", b.line);
    }
    assert!(runnable >= 3, "only {runnable} runnable blocks in README.md");
}

/// `A -> B  bytes` rows of `hccn-trace --summary`'s busiest links.
fn link_bytes(summary: &str, from: u32, to: u32) -> u64 {
    let head = format!("{from} -> {to} ");
    summary
        .lines()
        .find_map(|l| l.strip_prefix(&head))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|b| b.parse().ok())
        .unwrap_or(0)
}

/// What the README's caption of the heat map says, checked against the run it shows.
fn check_heat_map_caption(readme: &str, out: &launch::Outcome) {
    for pairs in ["(0↔2, 1↔3)", "(0↔1, 2↔3)", "ranks 0 and 3 exchange next to nothing", "recursive halving-doubling"]
    {
        assert!(readme.contains(pairs), "the caption no longer says {pairs:?}; update this check with it");
    }
    let algos: Vec<&str> = out.stdout.lines().filter_map(|l| l.split(": algorithm ").nth(1)).collect();
    assert!(!algos.is_empty() && algos.iter().all(|a| a.starts_with("rhd")), "{}", out.describe());
    let first = [link_bytes(&out.stdout, 0, 2), link_bytes(&out.stdout, 2, 0), link_bytes(&out.stdout, 1, 3)];
    let second = [link_bytes(&out.stdout, 0, 1), link_bytes(&out.stdout, 1, 0), link_bytes(&out.stdout, 2, 3)];
    for (far, near) in first.iter().zip(second) {
        let ratio = *far as f64 / near.max(1) as f64;
        assert!(
            (1.9..2.1).contains(&ratio),
            "first pairs should carry twice the bytes: {far} vs {near}: {}",
            out.stdout
        );
    }
    let corner = link_bytes(&out.stdout, 0, 3) + link_bytes(&out.stdout, 3, 0);
    assert!(corner * 1000 < second[0], "0 and 3 exchanged {corner} bytes: {}", out.stdout);
}

/// Runs each `sh runnable` block of the README in order, as a user would from the repository's
/// root: a scratch directory that links include/, examples/, scripts/, packaging/ and target/
/// (built by the suite), holds the README's C program as app.c, and is HOME.
#[test]
fn readme_runnable_commands_run_as_shown() {
    let text = readme();
    let blocks = fenced_blocks(&text);
    let tmp = TempDir::new("readme");
    let work = tmp.path();
    for dir in ["include", "examples", "scripts", "packaging"] {
        std::os::unix::fs::symlink(root().join(dir), work.join(dir)).expect("symlink");
    }
    // target/release is this build (the tests run from it).
    std::fs::create_dir_all(work.join("target")).expect("mkdir target");
    std::os::unix::fs::symlink(launch::bin_dir(), work.join("target/release")).expect("symlink target/release");
    let c = blocks.iter().find(|b| b.info == "c").expect("the README's C program");
    std::fs::write(work.join("app.c"), &c.body).expect("write app.c");

    for b in blocks.iter().filter(|b| b.info.split_whitespace().any(|w| w == "runnable")) {
        let mut cmd = clean("bash");
        cmd.args(["-euo", "pipefail", "-c", &b.body]).current_dir(work).env("HOME", work);
        let out = launch::run(cmd, Duration::from_secs(300));
        assert_eq!(out.code, Some(0), "README.md line {}:\n{}\n{}", b.line, b.body, out.describe());
        if b.body.contains("hccnrun -n 4 ./app") {
            for r in 0..4 {
                let want = format!("[{r}] rank {r} of 4: 4 8 12 6");
                assert!(out.stdout.contains(&want), "README.md line {}: no {want:?}: {}", b.line, out.describe());
            }
        }
        if b.body.contains("./app_static") {
            assert!(out.stdout.contains("[1] rank 1 of 2: 2 4 6 1"), "{}", out.describe());
        }
        if b.body.contains("--heatmap heat.png") {
            check_heat_map_caption(&text, &out);
            for png in ["heat.png", "heat-time.png", "timeline.png"] {
                assert!(work.join(png).exists(), "README.md line {}: no {png}", b.line);
            }
        }
    }
}

/// The artifact names the README shows (`hccn-0.1.0-...`) carry the workspace's version.
#[test]
fn readme_artifact_names_carry_the_workspace_version() {
    let text = readme();
    let want = format!("hccn-{}-", hccn_tests::scratch::workspace_version());
    let mut seen = 0;
    for (i, _) in text.match_indices("hccn-") {
        let rest = &text[i..];
        if rest.as_bytes().get(5).is_some_and(u8::is_ascii_digit) {
            seen += 1;
            assert!(rest.starts_with(&want), "README.md names {:?}, not version {want}", &rest[..rest.len().min(30)]);
        }
    }
    assert!(seen >= 4, "only {seen} versioned artifact names in README.md");
}
