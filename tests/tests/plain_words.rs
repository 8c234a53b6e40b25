//! Messages in the user's words: what a user can read (the text of errors, which
//! `hccn_get_last_error` and every binding pass on; warnings and errors logged; what the tools
//! print; the exceptions of the Python, torch, TensorFlow and MindSpore bindings) never uses
//! the runtime's internal words (board, slot, turn, fold), never names a source file (`*.rs`)
//! and never prints a figure with more than 3 decimals. The source is scanned: the string
//! literals inside the calls that make such messages. A run of hccn-info with `HCCN_LOG=info`
//! checks the figures that only exist at run time.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hccn_tests::launch;
use hccn_tests::scratch::root;

/// The words of the runtime's inside (as whole words, any case, singular or plural).
const INSIDE_WORDS: [&str; 9] = ["board", "boards", "slot", "slots", "turn", "turns", "fold", "folds", "folded"];

/// Where messages are made, and the calls whose string arguments reach users there.
const SOURCES: [(&str, &[&str], &[&str]); 10] = [
    ("runtime/src", &["rs"], RUST_CALLS),
    ("recovery/src", &["rs"], RUST_CALLS),
    ("capi/src", &["rs"], RUST_CALLS),
    ("backend-hccl/src", &["rs"], RUST_CALLS),
    ("tools/src", &["rs"], RUST_CALLS),
    ("bindings/python/hccn", &["py"], PY_CALLS),
    ("bindings/tensorflow", &["py"], PY_CALLS),
    ("bindings/mindspore/hccn_ms", &["py"], PY_CALLS),
    ("bindings/python/csrc", &["cpp", "h"], CPP_CALLS),
    ("bindings/tensorflow", &["cc"], CPP_CALLS),
];

const RUST_CALLS: &[&str] = &[
    "Error::new(",
    "Error::invalid(",
    "Error::timeout(",
    "Error::internal(",
    "Error::rank_failed(",
    "Error::io(",
    "Error::null(",
    ".context(",
    "warn!(",
    "error!(",
    "println!(",
    "eprintln!(",
    "print!(",
    "writeln!(",
    "format_args!(",
    "format!(",
    "Err(",
];
const PY_CALLS: &[&str] = &["raise ", "warnings.warn(", "_invalid(", "print("];
const CPP_CALLS: &[&str] = &["TORCH_CHECK(", "runtime_error(", "errors::", "throw ", "InvalidArgument(", "Internal("];

/// Source files under `dir` with one of `exts`, tests left out.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if !["tests", "build", "__pycache__"].contains(&name) {
                files(&p, exts, out);
            }
        } else if exts.iter().any(|x| name.ends_with(&format!(".{x}"))) && !name.ends_with("tests.rs") {
            out.push(p);
        }
    }
}

/// The text from `start` (just inside an opening parenthesis) to its closing one, strings
/// skipped over.
fn call_text(text: &str, start: usize) -> &str {
    let b = text.as_bytes();
    let (mut i, mut depth, mut quote) = (start, 1, None::<u8>);
    while i < b.len() && depth > 0 {
        match (quote, b[i]) {
            (Some(_), b'\\') => i += 1,
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            // A Rust char literal ('(' say), not a lifetime.
            (None, c @ (b'"' | b'\'')) if c == b'"' || b.get(i + 2) == Some(&b'\'') => quote = Some(c),
            (None, b'(') => depth += 1,
            (None, b')') => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    &text[start..i.min(b.len())]
}

/// The string literals in `code` ("..." always; '...' too in Python), with Rust's line
/// continuations (a backslash, the newline, the next line's indentation) joined.
fn literals(code: &str, single_quotes: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' && !(single_quotes && c == '\'') {
            continue;
        }
        let mut s = String::new();
        while let Some(d) = chars.next() {
            match d {
                '\\' => match chars.next() {
                    Some('\n') => {
                        while chars.peek().is_some_and(|c| c.is_whitespace()) {
                            chars.next();
                        }
                    }
                    Some(e) => {
                        s.push('\\');
                        s.push(e);
                    }
                    None => {}
                },
                d if d == c => break,
                d => s.push(d),
            }
        }
        out.push(s);
    }
    out
}

/// What is wrong with a message `s` (empty: nothing). A text of format fields alone (`{:.4}`)
/// is no message: it formats a figure for a data file (hccn-perf's CSV), which keeps them.
fn faults(s: &str) -> Vec<String> {
    let mut why = Vec::new();
    let words =
        s.split('{')
            .enumerate()
            .map(|(i, part)| if i == 0 { part } else { part.split_once('}').map_or("", |(_, rest)| rest) });
    if !words.collect::<String>().chars().any(char::is_alphabetic) {
        return why;
    }
    // Precision of format fields: `{x:.4}`, `{:>8.5}`, Python's `{x:.6f}` and `%.6f`.
    for (open, _) in s.match_indices('{') {
        let field = &s[open..s[open..].find('}').map_or(s.len(), |c| open + c)];
        if let Some(spec) = field.split_once(':').map(|(_, spec)| spec) {
            if let Some(digits) = spec.split_once('.').map(|(_, d)| d.chars().take_while(char::is_ascii_digit)) {
                let n: String = digits.collect();
                if n.parse::<u32>().is_ok_and(|n| n > 3) {
                    why.push(format!("a figure with {n} decimals"));
                }
            }
        }
    }
    for (at, _) in s.match_indices("%.") {
        let n: String = s[at + 2..].chars().take_while(char::is_ascii_digit).collect();
        if n.parse::<u32>().is_ok_and(|n| n > 3) {
            why.push(format!("a figure with {n} decimals"));
        }
    }
    // Format fields name variables, not words the user reads.
    let mut text = String::new();
    let mut depth = 0;
    for c in s.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = (depth - 1).max(0),
            c if depth == 0 => text.push(c),
            _ => text.push(' '),
        }
    }
    for chunk in text.split_whitespace() {
        let bare = chunk.trim_matches(|c: char| !c.is_alphanumeric() && c != '_');
        if bare.ends_with(".rs") {
            why.push(format!("the source file {bare}"));
        }
        // Paths and file names (`/dev/shm/hccn-board-...`) are what they are.
        if chunk.contains('/') {
            continue;
        }
        let mut rest = chunk;
        while let Some(start) = rest.find(|c: char| c.is_alphabetic()) {
            let word_len = rest[start..].find(|c: char| !c.is_alphanumeric() && c != '_').unwrap_or(rest.len() - start);
            let word = &rest[start..start + word_len];
            let after = rest[start + word_len..].chars().next();
            // `slots=N`: the host file's own keyword (MPI's), which the user writes.
            if INSIDE_WORDS.contains(&word.to_lowercase().as_str()) && after != Some('=') {
                why.push(format!("the word {word:?}"));
            }
            rest = &rest[start + word_len..];
        }
    }
    why
}

/// Every user-visible message of the tree that breaks the rules: `file:line: why: text`.
fn offenders() -> Vec<String> {
    let root = root();
    let mut found = Vec::new();
    for (dir, exts, calls) in SOURCES {
        let mut paths = Vec::new();
        files(&root.join(dir), exts, &mut paths);
        for path in paths {
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            // A Rust file's unit tests are not messages.
            let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            let rel = path.strip_prefix(&root).unwrap_or(&path).display().to_string();
            let python = rel.ends_with(".py");
            for call in calls {
                for (at, _) in text.match_indices(call) {
                    let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
                    let line_text = text[line_start..at].trim_start();
                    if line_text.starts_with("//") || line_text.starts_with('#') {
                        continue;
                    }
                    let body = match call.ends_with('(') {
                        true => call_text(text, at + call.len()),
                        // `raise X(...)`, `errors::X(...)`, `throw X(...)`: up to the call's end.
                        false => {
                            let open = text[at..].find('(').filter(|&o| !text[at..at + o].contains('\n'));
                            open.map_or("", |open| call_text(text, at + open + 1))
                        }
                    };
                    for s in literals(body, python) {
                        let why = faults(&s);
                        if !why.is_empty() {
                            let line = text[..at].matches('\n').count() + 1;
                            found.push(format!("{rel}:{line}: {}: {s:?}", why.join(", ")));
                        }
                    }
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn the_rules_catch_what_they_are_for() {
    // Each internal word in a message (built here, so that no such message is written down).
    let inside = INSIDE_WORDS.map(|w| format!("rank 1 has not reached {w} 2 yet"));
    let bad = ["the cost model of select.rs", "took {secs:.6} s", "ratio %.5f", "# Avg bus bandwidth    : {avg:.4}"];
    for s in inside.iter().map(String::as_str).chain(bad) {
        assert!(!faults(s).is_empty(), "not caught: {s:?}");
    }
    let good = [
        "rank 2 has not joined this call after {:.1} s",
        "node-a slots=N: unknown field",
        "/dev/shm/hccn-board-{}-{}: cannot open",
        "{slot} is the launch rank",
        "returned",
        "{:.4}",
    ];
    for s in good {
        assert!(faults(s).is_empty(), "caught wrongly: {s:?}: {:?}", faults(s));
    }
    assert_eq!(literals("(\"a \\\n     b\", x)", false), vec!["a b".to_owned()]);
}

#[test]
fn user_visible_messages_use_no_internal_words_file_names_or_long_figures() {
    let found = offenders();
    assert!(found.is_empty(), "messages a user reads, to reword in plain words:\n{}", found.join("\n"));
}

#[test]
fn hccn_info_and_its_log_print_no_figure_with_more_than_3_decimals() {
    let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
    cmd.args(["-n", "2"]).arg(launch::bin("hccn-info")).env("HCCN_LOG", "info");
    let out = launch::run(cmd, Duration::from_secs(120));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let long: Vec<&str> = out.stdout.lines().chain(out.stderr.lines()).filter(|l| long_figure(l)).collect();
    assert!(long.is_empty(), "figures with more than 3 decimals: {long:#?}");
}

/// Whether `line` shows a number with more than 3 decimals (a log line's time stamp aside).
fn long_figure(line: &str) -> bool {
    // `2026-12-07T16:34:49.274717Z`: the log's clock, not a figure.
    let text: String =
        line.split_whitespace().filter(|w| !(w.ends_with('Z') && w.contains('T'))).collect::<Vec<_>>().join(" ");
    let b = text.as_bytes();
    (1..b.len()).any(|i| {
        b[i] == b'.'
            && b[i - 1].is_ascii_digit()
            && b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count() > 3
            && !b[..i].iter().rev().take_while(|c| c.is_ascii_digit() || **c == b'.').any(|c| *c == b'.')
    })
}
