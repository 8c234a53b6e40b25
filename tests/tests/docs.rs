//! The project's own rules that code can check: every HCCN_* variable is parsed in config.rs
//! only and listed in the README's one table; every code block of the docs (the README, the
//! READMEs under bindings/ and examples/, docs/*.md) is run here (`runnable`, with the
//! `file=NAME` blocks it uses), names what runs it (`covered-by=PATH`), is output or a diagram
//! (`text`) or says why it cannot run (`not-runnable: REASON`); and what the README says about
//! a run it shows (outputs, the heat map's caption, the sizes it states) holds for that run.

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

/// The Markdown files whose code blocks are checked: the README, every README.md under
/// bindings/ and examples/, and docs/*.md.
fn doc_files() -> Vec<PathBuf> {
    fn readmes(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() && !p.ends_with("build") {
                readmes(&p, out);
            } else if p.file_name().is_some_and(|n| n == "README.md") {
                out.push(p);
            }
        }
    }
    let mut files = vec![root().join("README.md")];
    readmes(&root().join("bindings"), &mut files);
    readmes(&root().join("examples"), &mut files);
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn shown(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

/// How a block is checked, from the words after its language.
#[derive(Debug, PartialEq)]
enum Check<'a> {
    /// `text`: output or a diagram, nothing to run.
    Text,
    /// `runnable`: run by [`runnable_blocks_run_as_shown`], in order, from a scratch copy of
    /// the repository's layout.
    Runnable,
    /// `covered-by=PATH`: the test or script at PATH runs what the block shows.
    CoveredBy(&'a str),
    /// `file=NAME`: written as NAME next to the file's runnable blocks, which use it.
    File(&'a str),
    /// `not-runnable: REASON`: why no test can run it (hardware, a user's own program, ...).
    NotRunnable(String),
}

fn check_of(info: &str) -> Result<Check<'_>, String> {
    let mut words = info.split_whitespace();
    let lang = words
        .next()
        .ok_or("a block without a language: `text` for output or diagrams, else its language and how it is checked")?;
    if lang == "text" {
        return Ok(Check::Text);
    }
    let rest: Vec<&str> = words.collect();
    match rest.as_slice() {
        ["runnable"] => Ok(Check::Runnable),
        [w] if w.starts_with("covered-by=") => Ok(Check::CoveredBy(&w["covered-by=".len()..])),
        [w] if w.starts_with("file=") => Ok(Check::File(&w["file=".len()..])),
        ["not-runnable:", reason @ ..] if reason.len() >= 3 => Ok(Check::NotRunnable(reason.join(" "))),
        _ => Err(format!(
            "`{info}`: say how the block is checked: `{lang} runnable`, `{lang} covered-by=PATH`, \
             `{lang} file=NAME` (used by a runnable block) or `{lang} not-runnable: the reason`"
        )),
    }
}

/// Every code block of the docs says how it is checked (see [`Check`]): run here, run by a
/// named test or script (which exists), a file a runnable block uses, or not runnable for a
/// stated reason. Output and diagrams are `text`.
#[test]
fn every_code_block_of_the_docs_is_run_or_says_how_it_is_checked() {
    let mut runnable = 0;
    let mut problems = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).expect("read a doc file");
        let blocks = fenced_blocks(&text);
        for b in &blocks {
            let at = format!("{} line {}", shown(&file), b.line);
            match check_of(&b.info) {
                Err(e) => problems.push(format!("{at}: {e}")),
                Ok(Check::Runnable) => runnable += 1,
                Ok(Check::CoveredBy(path)) if !root().join(path).exists() => {
                    problems.push(format!("{at}: covered-by={path} does not exist"))
                }
                Ok(Check::File(name)) => {
                    let used = blocks.iter().any(|o| check_of(&o.info) == Ok(Check::Runnable) && o.body.contains(name));
                    if !used {
                        problems.push(format!("{at}: file={name}, but no runnable block of the file uses {name}"));
                    }
                }
                Ok(_) => {}
            }
        }
    }
    assert!(problems.is_empty(), "code blocks that do not say how they are checked:\n{}", problems.join("\n"));
    assert!(runnable >= 5, "only {runnable} runnable blocks in the docs");
}

/// `NAME MB` right after `marker` in `text` (the README's stated sizes), in bytes.
fn stated_megabytes(text: &str, marker: &str) -> f64 {
    let rest = text.split(marker).nth(1).unwrap_or_else(|| panic!("README.md no longer says {marker:?}"));
    let number = rest.split_whitespace().next().and_then(|n| n.parse::<f64>().ok());
    number.unwrap_or_else(|| panic!("no figure after {marker:?}")) * 1e6
}

/// A size the README states, within 15 % of what was built (sizes move as the code grows: the
/// README must move with them).
fn check_stated_size(text: &str, marker: &str, file: &Path) {
    let stated = stated_megabytes(text, marker);
    let actual = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0) as f64;
    assert!(
        (actual - stated).abs() <= 0.15 * stated,
        "README.md says {marker:?} {:.1} MB, but {} is {:.1} MB",
        stated / 1e6,
        file.display(),
        actual / 1e6
    );
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

/// A scratch directory laid out as the repository for a doc file's runnable blocks, with its
/// `file=` blocks written into it: include/, examples/, scripts/, packaging/ and bindings/
/// linked, target/release this build, and bin/ holding `hccnrun` (this build's) and `python`
/// (the torch venv's, with numpy; it imports the source tree's hccn with this build's library).
fn scratch_for(blocks: &[Block], work: &Path) {
    for dir in ["include", "examples", "scripts", "packaging", "bindings"] {
        std::os::unix::fs::symlink(root().join(dir), work.join(dir)).expect("symlink");
    }
    std::fs::create_dir_all(work.join("target")).expect("mkdir target");
    std::os::unix::fs::symlink(launch::bin_dir(), work.join("target/release")).expect("symlink target/release");
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir bin");
    std::os::unix::fs::symlink(launch::bin("hccnrun"), bin.join("hccnrun")).expect("symlink hccnrun");
    std::fs::write(bin.join("python"), format!("#!/bin/sh\nexec {} \"$@\"\n", hccn_tests::torch::PYTHON))
        .expect("python");
    std::fs::set_permissions(bin.join("python"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    for b in blocks {
        if let Ok(Check::File(name)) = check_of(&b.info) {
            std::fs::write(work.join(name), &b.body).expect("write a file= block");
        }
    }
}

/// What a doc says about the run of one of its blocks, checked against that run.
fn check_what_the_block_shows(file: &Path, text: &str, b: &Block, out: &launch::Outcome, work: &Path) {
    let at = format!("{} line {}", shown(file), b.line);
    if b.body.contains("hccnrun -n 4 ./app") {
        for r in 0..4 {
            let want = format!("[{r}] rank {r} of 4: 4 8 12 6");
            assert!(out.stdout.contains(&want), "{at}: no {want:?}: {}", out.describe());
        }
    }
    if b.body.contains("./app_static") {
        assert!(out.stdout.contains("[1] rank 1 of 2: 2 4 6 1"), "{}", out.describe());
        check_stated_size(text, "A static program is about", &work.join("app_static"));
        check_stated_size(text, "the library is under 10 MB:", &work.join("hccn/lib/libhccn.so.1"));
    }
    if b.body.contains("--heatmap heat.png") {
        check_heat_map_caption(text, out);
        for png in ["heat.png", "heat-time.png", "timeline.png"] {
            assert!(work.join(png).exists(), "{at}: no {png}");
        }
    }
    if b.body.contains("hccnrun -n 2 ./allreduce") {
        for r in 0..2 {
            let want = format!("[{r}] rank {r} of 2: allreduce of 1024 floats ok (data[1023] = 3069)");
            assert!(out.stdout.contains(&want), "{at}: no {want:?}: {}", out.describe());
        }
    }
    if b.body.contains("python tour.py") {
        for r in 0..3 {
            let want = format!("[{r}] rank {r} of 3: ok");
            assert!(out.stdout.contains(&want), "{at}: no {want:?}: {}", out.describe());
        }
    }
}

/// Runs each `runnable` block of every doc file in order, as a user would from the repository's
/// root: a scratch directory laid out as the repository (see [`scratch_for`]) that is HOME and
/// holds the file's `file=` blocks (the README's C program as app.c, ...).
#[test]
fn runnable_blocks_run_as_shown() {
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).expect("read a doc file");
        let blocks = fenced_blocks(&text);
        if !blocks.iter().any(|b| check_of(&b.info) == Ok(Check::Runnable)) {
            continue;
        }
        assert!(
            Path::new(hccn_tests::torch::PYTHON).exists(),
            "{} is missing: run scripts/setup-python.sh torch",
            hccn_tests::torch::PYTHON
        );
        let tmp = TempDir::new("docs");
        let work = tmp.path();
        scratch_for(&blocks, work);
        let path = format!("{}:{}", work.join("bin").display(), std::env::var("PATH").unwrap_or_default());
        for b in blocks.iter().filter(|b| check_of(&b.info) == Ok(Check::Runnable)) {
            let mut cmd = clean("bash");
            cmd.args(["-euo", "pipefail", "-c", &b.body])
                .current_dir(work)
                .env("HOME", work)
                .env("PATH", &path)
                .env("PYTHONPATH", root().join("bindings/python"))
                .env("HCCN_LIB", launch::bin_dir().join("libhccn.so"));
            let out = launch::run(cmd, Duration::from_secs(300));
            assert_eq!(out.code, Some(0), "{} line {}:\n{}\n{}", shown(&file), b.line, b.body, out.describe());
            check_what_the_block_shows(&file, &text, b, &out, work);
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
