//! The cost model's link figures in real processes: world rank 0 measures them as the world
//! forms and every rank ends up with the same ones (the figures hccn-perf's header shows), and
//! HCCN_LINK_COST's explicit figures are what the plan is made from.

use std::time::Duration;

use hccn_tests::launch;

const BUILTIN: &str = "local=0.500us:10.000GB/s,shm=1.000us:8.000GB/s,tcp=50.000us:2.500GB/s";

/// hccn-perf over one checked 1 MiB allreduce on `n` ranks, with the agreement logged by every
/// rank.
fn perf(n: u32, env: &[(&str, &str)]) -> launch::Outcome {
    let args = ["-b", "1M", "-e", "1M", "-c", "-w", "1", "-n", "2"];
    let mut all_env = vec![("HCCN_LOG", "hccn_runtime::comm::linkcost=debug")];
    all_env.extend_from_slice(env);
    launch::hccnrun(n, &launch::bin("hccn-perf"), &args, &all_env, Duration::from_secs(60))
}

/// The text after `key` up to the next space, in `line`.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_once(key).and_then(|(_, rest)| rest.split_whitespace().next())
}

/// The `costs=` figures each rank logged as agreed, by rank.
fn agreed(out: &launch::Outcome, n: u32) -> Vec<String> {
    let all = format!("{}{}", out.stdout, out.stderr);
    (0..n)
        .map(|r| {
            let line = all
                .lines()
                .find(|l| l.contains("link costs agreed") && l.contains(&format!(" rank={r} ")))
                .unwrap_or_else(|| panic!("rank {r} logged no agreement: {}", out.describe()));
            field(line, "costs=").unwrap_or_default().to_owned()
        })
        .collect()
}

/// The figures and the 1 MiB algorithm hccn-perf's header names.
fn header(out: &launch::Outcome) -> (String, String) {
    let costs = out.stdout.lines().find_map(|l| l.split_once("# link costs: ").map(|(_, c)| c.trim().to_owned()));
    let algo = out.stdout.lines().find_map(|l| field(l, "1048576 bytes: algorithm ").map(|a| a.trim_end_matches(',')));
    let costs = costs.unwrap_or_else(|| panic!("no link costs in the header: {}", out.describe()));
    (costs, algo.unwrap_or_else(|| panic!("no algorithm in the header: {}", out.describe())).to_owned())
}

fn expect_ok(out: &launch::Outcome, what: &str) {
    assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
    assert!(out.stdout.contains("Wrong elements       : 0 OK"), "{what}: {}", out.describe());
}

/// The figures of `kind` (`shm`, `tcp`) in a `costs=` text.
fn kind<'a>(costs: &'a str, kind: &str) -> &'a str {
    costs.split(',').find_map(|k| k.strip_prefix(&format!("{kind}="))).unwrap_or("")
}

#[test]
fn every_rank_agrees_on_the_figures_rank_0_measured() {
    for (n, transport, measured) in [(3, "auto", "shm"), (3, "tcp", "tcp"), (4, "auto", "shm")] {
        let what = format!("{n} ranks, HCCN_TRANSPORT={transport}");
        let out = perf(n, &[("HCCN_TRANSPORT", transport)]);
        expect_ok(&out, &what);
        let figures = agreed(&out, n);
        assert!(figures.iter().all(|f| *f == figures[0]), "{what}: ranks disagree: {figures:?}");
        assert_eq!(header(&out).0, figures[0], "{what}: hccn-perf shows the agreed figures");
        let rank0 = format!("{}{}", out.stdout, out.stderr);
        assert!(rank0.contains("source=\"measured\""), "{what}: {}", out.describe());
        // Measured, unless a disturbed measurement fell back to the built-in figures, which
        // the runtime says.
        let fell_back = rank0.contains("using the built-in");
        assert!(
            fell_back || kind(&figures[0], measured) != kind(BUILTIN, measured),
            "{what}: {measured} still has the built-in figures: {}",
            figures[0]
        );
        // The kind that was not measured keeps its built-in figures.
        let other = if measured == "shm" { "tcp" } else { "shm" };
        assert_eq!(kind(&figures[0], other), kind(BUILTIN, other), "{what}");
        let took: f64 = rank0
            .lines()
            .find_map(|l| field(l, "took_ms="))
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{what}: no took_ms: {}", out.describe()));
        assert!(took < 2000.0, "{what}: agreeing took {took} ms");
    }
}

#[test]
fn explicit_figures_are_what_the_plan_uses() {
    // Two ranks over shared memory, 1 MiB: at 0.1 µs per message the ring (two half-size
    // exchanges, half the reduction); at 5 ms per message one whole exchange (recursive doubling).
    for (value, shm, algo) in
        [("shm=0.1us:8GB/s", "0.100us:8.000GB/s", "ring"), ("SHM = 5ms : 8000MB/s", "5000.000us:8.000GB/s", "rd")]
    {
        let out = perf(2, &[("HCCN_LINK_COST", value)]);
        expect_ok(&out, value);
        let (costs, chosen) = header(&out);
        assert_eq!(kind(&costs, "shm"), shm, "HCCN_LINK_COST={value}: {costs}");
        assert_eq!(kind(&costs, "tcp"), kind(BUILTIN, "tcp"), "unnamed kinds keep the built-in figures");
        assert_eq!(chosen, algo, "HCCN_LINK_COST={value}: {}", out.describe());
        assert_eq!(agreed(&out, 2), vec![costs.clone(), costs], "{value}");
    }
    let out = perf(2, &[("HCCN_LINK_COST", "default")]);
    expect_ok(&out, "default");
    assert_eq!(header(&out).0, BUILTIN);
}

#[test]
fn a_malformed_value_fails_the_job_and_names_the_variable() {
    let out = perf(2, &[("HCCN_LINK_COST", "shm=fast")]);
    assert_ne!(out.code, Some(0), "{}", out.describe());
    assert!(out.stderr.contains("HCCN_LINK_COST") && out.stderr.contains("shm=fast"), "{}", out.describe());
}
