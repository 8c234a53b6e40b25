//! Slurm's compressed lists: host lists (`node[01-04,07],login1`) and task counts per node
//! (`4(x2),3`), expanded as Slurm's own `scontrol show hostnames` does.

/// Most hosts one list may expand to: more is a mistake (or an attack), not a cluster.
const MAX_HOSTS: usize = 1 << 20;

/// Every host name of a compressed list, in order: `a[1-3,5]b` is `a1b a2b a3b a5b`, ranges keep
/// their zero padding (`n[08-10]` is `n08 n09 n10`), several bracket groups in one name multiply
/// out, and commas inside brackets do not split names.
pub fn expand_hosts(list: &str) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for name in split_top(list)? {
        let name = name.trim();
        if name.is_empty() {
            continue;
        }
        expand_one(name, &mut hosts)?;
        if hosts.len() > MAX_HOSTS {
            return Err(format!("{list:?} names more than {MAX_HOSTS} hosts"));
        }
    }
    if hosts.is_empty() {
        return Err(format!("{list:?} names no host"));
    }
    Ok(hosts)
}

/// Splits at commas outside brackets.
fn split_top(list: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, ch) in list.char_indices() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("{list:?}: unbalanced brackets"));
        }
    }
    if depth != 0 {
        return Err(format!("{list:?}: unbalanced brackets"));
    }
    parts.push(&list[start..]);
    Ok(parts)
}

/// One name with any number of `[ranges]`, appended to `out`.
fn expand_one(name: &str, out: &mut Vec<String>) -> Result<(), String> {
    let Some(open) = name.find('[') else {
        out.push(name.to_owned());
        return Ok(());
    };
    let close = name[open..].find(']').map(|c| open + c).ok_or_else(|| format!("{name:?}: unbalanced brackets"))?;
    let (prefix, ranges, rest) = (&name[..open], &name[open + 1..close], &name[close + 1..]);
    let mut tails = Vec::new();
    expand_one(rest, &mut tails)?;
    for range in ranges.split(',') {
        for n in numbers(range.trim()).map_err(|why| format!("{name:?}: {why}"))? {
            for tail in &tails {
                out.push(format!("{prefix}{n}{tail}"));
                if out.len() > MAX_HOSTS {
                    return Err(format!("{name:?} names more than {MAX_HOSTS} hosts"));
                }
            }
        }
    }
    Ok(())
}

/// `7` or `01-04` as the strings of its numbers, zero-padded to the width of the first bound.
fn numbers(range: &str) -> Result<Vec<String>, String> {
    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
    let parse = |s: &str| {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{range:?} is not a number or a range of numbers"));
        }
        s.parse::<u64>().map_err(|_| format!("{range:?} is too large"))
    };
    let (a, b) = (parse(lo)?, parse(hi)?);
    if b < a {
        return Err(format!("{range:?} runs backwards"));
    }
    if b - a >= MAX_HOSTS as u64 {
        return Err(format!("{range:?} names more than {MAX_HOSTS} hosts"));
    }
    let width = if lo.starts_with('0') { lo.len() } else { 0 };
    Ok((a..=b).map(|n| format!("{n:0width$}")).collect())
}

/// `SLURM_STEP_TASKS_PER_NODE`: `2(x3),1` is 2, 2, 2, 1 tasks on nodes 0..=3.
pub fn expand_counts(list: &str) -> Result<Vec<u32>, String> {
    let mut counts = Vec::new();
    for item in list.split(',').map(str::trim) {
        let (count, times) = match item.split_once("(x") {
            Some((c, t)) => (c, t.strip_suffix(')').ok_or_else(|| format!("{list:?}: {item:?} lacks its ')'"))?),
            None => (item, "1"),
        };
        let count: u32 = count.trim().parse().map_err(|_| format!("{list:?}: {item:?} is not COUNT or COUNT(xN)"))?;
        let times: usize = times.trim().parse().map_err(|_| format!("{list:?}: {item:?} is not COUNT or COUNT(xN)"))?;
        if counts.len() + times > MAX_HOSTS {
            return Err(format!("{list:?} names more than {MAX_HOSTS} nodes"));
        }
        counts.extend(std::iter::repeat_n(count, times));
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &str) -> Vec<String> {
        expand_hosts(list).unwrap_or_else(|e| panic!("{list:?}: {e}"))
    }

    #[test]
    fn host_lists_expand_as_slurm_does() {
        for (list, want) in [
            ("node1", vec!["node1"]),
            ("node[01-04,07]", vec!["node01", "node02", "node03", "node04", "node07"]),
            ("a[1-2],b,c[9-10]", vec!["a1", "a2", "b", "c9", "c10"]),
            ("n[008-010]", vec!["n008", "n009", "n010"]),
            ("gnode[10,20,25,37]", vec!["gnode10", "gnode20", "gnode25", "gnode37"]),
            ("r[1-2]n[1-2]", vec!["r1n1", "r1n2", "r2n1", "r2n2"]),
            ("rack[1-2]-x", vec!["rack1-x", "rack2-x"]),
            ("10.0.0.[1-2]", vec!["10.0.0.1", "10.0.0.2"]),
            (" a , b ", vec!["a", "b"]),
        ] {
            assert_eq!(hosts(list), want, "{list:?}");
        }
    }

    #[test]
    fn malformed_host_lists_are_refused_with_the_reason() {
        for (list, why) in [
            ("node[1-4", "unbalanced"),
            ("node1-4]", "unbalanced"),
            ("node[[1]]", "unbalanced"),
            ("node[4-1]", "backwards"),
            ("node[a-b]", "not a number"),
            ("node[]", "not a number"),
            ("node[1-99999999999999999999]", "too large"),
            ("node[0-9999999]", "more than"),
            ("", "no host"),
            (",", "no host"),
        ] {
            let e = expand_hosts(list).err().unwrap_or_else(|| panic!("{list:?} was accepted"));
            assert!(e.contains(why), "{list:?}: {e}");
        }
    }

    #[test]
    fn task_counts_expand() {
        assert_eq!(expand_counts("4"), Ok(vec![4]));
        assert_eq!(expand_counts("2(x3),1"), Ok(vec![2, 2, 2, 1]));
        assert_eq!(expand_counts("1,2(x2)"), Ok(vec![1, 2, 2]));
        for bad in ["", "x", "2(x", "2(xa)", "-1", "2(x99999999)"] {
            assert!(expand_counts(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
