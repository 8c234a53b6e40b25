//! `hccnrun --hostfile`: a job started from one place across several hosts. The host file has
//! one host per line, `NAME [slots=N] [addr=IP]` (`#` starts a comment), as in Open MPI's and
//! DeepSpeed's host files; ranks fill the hosts in order. Each remote rank is started through a
//! configurable command (ssh by default; `ip netns exec {host}` in the tests), with its
//! environment on the command line, since ssh forwards none.

use std::ffi::OsString;
use std::net::{IpAddr, ToSocketAddrs};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub slots: u32,
    /// The address the ranks there listen on (`addr=`, else the name resolved).
    pub addr: Option<IpAddr>,
}

/// Parses a host file's text; errors name the line.
pub fn parse(text: &str) -> Result<Vec<Host>, String> {
    let mut hosts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: String| format!("host file line {}: {why}", i + 1);
        let mut words = line.split_whitespace();
        let name = words.next().unwrap_or_default().to_owned();
        let mut host = Host { name, slots: 1, addr: None };
        for w in words {
            match w.split_once('=') {
                Some(("slots", n)) => {
                    host.slots =
                        n.parse().ok().filter(|&n| n > 0).ok_or_else(|| bad(format!("slots={n} is not a count")))?
                }
                Some(("addr", a)) => {
                    host.addr = Some(a.parse().map_err(|_| bad(format!("addr={a} is not an IP address")))?)
                }
                _ => return Err(bad(format!("unknown field {w:?} (expected slots=N or addr=IP)"))),
            }
        }
        hosts.push(host);
    }
    if hosts.is_empty() {
        return Err("the host file names no host".into());
    }
    Ok(hosts)
}

/// Where a rank runs: its host (None: here, without a remote command), its index among that
/// host's ranks, and how many ranks that host has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place<'a> {
    pub host: Option<&'a Host>,
    /// The host's index among those of the file that run ranks (torchrun's GROUP_RANK).
    pub node: u32,
    pub local: u32,
    pub local_size: u32,
}

/// Ranks fill hosts in file order; `nranks` beyond the slots is an error.
pub fn place(hosts: &[Host], nranks: u32, rank: u32) -> Result<Place<'_>, String> {
    let total: u32 = hosts.iter().map(|h| h.slots).sum();
    if nranks > total {
        return Err(format!(
            "{nranks} ranks do not fit the host file, whose hosts take {total} (slots=N each, 1 by default)"
        ));
    }
    let mut first = 0;
    for (node, h) in hosts.iter().enumerate() {
        let used = h.slots.min(nranks.saturating_sub(first));
        if rank < first + used {
            let host = (!is_here(&h.name)).then_some(h);
            return Ok(Place { host, node: node as u32, local: rank - first, local_size: used });
        }
        first += used;
    }
    Err(format!("rank {rank} is outside a job of {nranks}"))
}

fn is_here(name: &str) -> bool {
    name == "localhost"
}

/// The address a host's ranks listen on.
pub fn listen_addr(host: &Host) -> Result<IpAddr, String> {
    if let Some(a) = host.addr {
        return Ok(a);
    }
    (host.name.as_str(), 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.ip())
        .ok_or_else(|| format!("host {} does not resolve; give it addr=IP in the host file", host.name))
}

/// Quotes a word for a POSIX shell, leaving plain words as they are.
fn shell_quote(w: &str) -> String {
    let plain = !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        return w.to_owned();
    }
    format!("'{}'", w.replace('\'', r"'\''"))
}

/// The command line that starts `program args` with `env` on `host` through `remote` (a
/// template whose `{host}` is replaced by the host's name). ssh hands the remote shell a single
/// string, so for ssh the rank's command is shell-quoted into one word; other launchers
/// (`ip netns exec`, `srun`, `docker exec`) take it as separate arguments.
pub fn remote_argv(
    remote: &str,
    host: &Host,
    env: &[(String, String)],
    program: &OsString,
    args: &[OsString],
) -> Result<Vec<OsString>, String> {
    let mut argv: Vec<OsString> = remote.split_whitespace().map(|w| w.replace("{host}", &host.name).into()).collect();
    if argv.is_empty() {
        return Err("--remote-cmd is empty".into());
    }
    if !remote.contains("{host}") {
        argv.push(host.name.clone().into());
    }
    let mut cmd: Vec<String> = vec!["env".into()];
    cmd.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    for w in std::iter::once(program).chain(args) {
        cmd.push(w.to_str().ok_or_else(|| format!("{w:?} is not UTF-8; remote ranks need text arguments"))?.to_owned());
    }
    let is_ssh = std::path::Path::new(&argv[0]).file_name().is_some_and(|n| n == "ssh");
    if is_ssh {
        argv.push(cmd.iter().map(|w| shell_quote(w)).collect::<Vec<_>>().join(" ").into());
    } else {
        argv.extend(cmd.into_iter().map(OsString::from));
    }
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_slots_addresses_and_comments() {
        let hosts =
            parse("# cluster\nnode-a slots=2\n\nnode-b slots=3 addr=10.0.0.2  # second\nnode-c\n").expect("parse");
        assert_eq!(hosts.len(), 3);
        assert_eq!((hosts[0].slots, hosts[0].addr), (2, None));
        assert_eq!((hosts[1].slots, hosts[1].addr), (3, Some(IpAddr::from([10, 0, 0, 2]))));
        assert_eq!(hosts[2].slots, 1);
        for bad in ["", "# nothing\n", "a slots=0", "a slots=x", "a addr=nowhere", "a gpus=2"] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse("a\nb slots=x").err().is_some_and(|e| e.contains("line 2")));
    }

    #[test]
    fn ranks_fill_hosts_in_order() {
        let hosts = parse("a slots=2\nb slots=2\nlocalhost slots=4").expect("parse");
        let at = |n, r| place(&hosts, n, r).map(|p| (p.host.map(|h| h.name.clone()), p.node, p.local, p.local_size));
        assert_eq!(at(5, 0), Ok((Some("a".into()), 0, 0, 2)));
        assert_eq!(at(5, 3), Ok((Some("b".into()), 1, 1, 2)));
        assert_eq!(at(5, 4), Ok((None, 2, 0, 1)));
        assert_eq!(at(3, 2), Ok((Some("b".into()), 1, 0, 1)));
        assert!(place(&hosts, 9, 0).is_err());
    }

    #[test]
    fn ssh_gets_one_quoted_word_other_launchers_an_argv() {
        let host = Host { name: "n1".into(), slots: 1, addr: None };
        let env = [("HCCN_RANK".to_owned(), "3".to_owned())];
        let (prog, args) = (OsString::from("/bin/train"), vec![OsString::from("a b"), OsString::from("it's")]);
        let ssh = remote_argv("ssh -o BatchMode=yes", &host, &env, &prog, &args).expect("ssh");
        assert_eq!(ssh, ["ssh", "-o", "BatchMode=yes", "n1", r"env HCCN_RANK=3 /bin/train 'a b' 'it'\''s'"]);
        let ns = remote_argv("ip netns exec {host}", &host, &env, &prog, &args).expect("netns");
        assert_eq!(ns, ["ip", "netns", "exec", "n1", "env", "HCCN_RANK=3", "/bin/train", "a b", "it's"]);
        assert!(remote_argv("  ", &host, &env, &prog, &args).is_err());
    }
}
