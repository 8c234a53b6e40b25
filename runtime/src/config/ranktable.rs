//! The Ascend rank table (`RANK_TABLE_FILE`, HCCL's `hccl.json`): versions 1.0 and 1.2, with
//! the servers at the top (`server_list`) or in groups (`server_group_list`, the cluster
//! scheduler's global rank table). Numbers may be JSON strings, as HCCL writes them.

use serde_json::Value;

/// What hccn takes from a rank table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankTable {
    pub version: String,
    /// Servers in file order.
    pub servers: Vec<Server>,
    /// A digest of the table's content (not its layout): every rank that reads the same table
    /// gets the same one, for the store's port.
    pub digest: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Where the server's processes listen: `container_ip`, else `server_ip`, else `host_ip`,
    /// else `server_id` (an address in HCCL's tables).
    pub address: String,
    /// (rank, NPU device id), in rank order.
    pub devices: Vec<(u32, i32)>,
}

/// Where one rank sits in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub size: u32,
    /// Index of its server in the table.
    pub server: u32,
    pub local_rank: u32,
    pub local_size: u32,
    pub device_id: i32,
}

const VERSIONS: [&str; 2] = ["1.0", "1.2"];

impl RankTable {
    pub fn parse(text: &str) -> Result<RankTable, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let version = field_str(&v, "version").ok_or("no \"version\"")?;
        if !VERSIONS.contains(&version.as_str()) {
            return Err(format!("version {version:?} is not one hccn reads ({})", VERSIONS.join(", ")));
        }
        if let Some(status) = field_str(&v, "status") {
            if status != "completed" {
                return Err(format!("status is {status:?}, not \"completed\": the table is still being written"));
            }
        }
        let lists: Vec<&Value> = match (v.get("server_list"), v.get("server_group_list")) {
            (Some(list), _) => vec![list],
            (None, Some(Value::Array(groups))) => groups.iter().filter_map(|g| g.get("server_list")).collect(),
            _ => return Err("neither \"server_list\" nor \"server_group_list\"".to_owned()),
        };
        let mut servers = Vec::new();
        for list in lists {
            let list = list.as_array().ok_or("\"server_list\" is not a list")?;
            for (i, s) in list.iter().enumerate() {
                servers.push(server(s).map_err(|why| format!("server {i}: {why}"))?);
            }
        }
        let table = RankTable { version, servers, digest: fnv1a(v.to_string().as_bytes()) };
        table.check_ranks()?;
        Ok(table)
    }

    pub fn size(&self) -> u32 {
        self.servers.iter().map(|s| s.devices.len() as u32).sum()
    }

    /// Rank ids are 0..size, each once.
    fn check_ranks(&self) -> Result<(), String> {
        let mut seen = vec![false; self.size() as usize];
        for (rank, _) in self.servers.iter().flat_map(|s| &s.devices) {
            match seen.get_mut(*rank as usize) {
                Some(s) if !*s => *s = true,
                Some(_) => return Err(format!("rank_id {rank} appears twice")),
                None => return Err(format!("rank_id {rank} is not below the table's {} devices", seen.len())),
            }
        }
        if seen.is_empty() {
            return Err("no device".to_owned());
        }
        Ok(())
    }

    pub fn place(&self, rank: u32) -> Option<Place> {
        self.servers.iter().enumerate().find_map(|(i, s)| {
            let local = s.devices.iter().position(|(r, _)| *r == rank)?;
            Some(Place {
                size: self.size(),
                server: i as u32,
                local_rank: local as u32,
                local_size: s.devices.len() as u32,
                device_id: s.devices[local].1,
            })
        })
    }

    /// The server of rank 0 (which hosts the store).
    pub fn rank0_server(&self) -> Option<&Server> {
        self.servers.iter().find(|s| s.devices.iter().any(|(r, _)| *r == 0))
    }
}

fn server(s: &Value) -> Result<Server, String> {
    let address = ["container_ip", "server_ip", "host_ip", "server_id"]
        .iter()
        .find_map(|k| field_str(s, k).filter(|a| !a.is_empty()))
        .ok_or("no \"server_id\"")?;
    let list = s.get("device").and_then(Value::as_array).ok_or("no \"device\" list")?;
    let mut devices = Vec::new();
    for d in list {
        let rank = field_num(d, "rank_id")?;
        let device = field_num(d, "device_id")?;
        let device = i32::try_from(device).map_err(|_| format!("device_id {device} is too large"))?;
        devices.push((rank, device));
    }
    devices.sort_unstable();
    Ok(Server { address, devices })
}

fn field_str(v: &Value, key: &str) -> Option<String> {
    match v.get(key)? {
        Value::String(s) => Some(s.trim().to_owned()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn field_num(v: &Value, key: &str) -> Result<u32, String> {
    let text = field_str(v, key).ok_or_else(|| format!("a device has no \"{key}\""))?;
    text.parse().map_err(|_| format!("\"{key}\": {text:?} is not a number"))
}

/// FNV-1a, 64 bits: stable across processes and builds, unlike std's hasher.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub const V10: &str = r#"{"status":"completed","version":"1.0","server_count":"2","server_list":[
        {"server_id":"10.0.0.1","device":[{"device_id":"4","device_ip":"192.168.1.8","rank_id":"1"},
                                          {"device_id":"0","device_ip":"192.168.1.9","rank_id":"0"}]},
        {"server_id":"10.0.0.2","device":[{"device_id":"0","device_ip":"192.168.1.10","rank_id":"2"}]}]}"#;

    const V12_GROUPS: &str = r#"{"version":"1.2","status":"completed","server_group_list":[{"group_id":"2",
        "server_count":"1","server_list":[{"server_id":"node-a","server_ip":"10.1.0.5","device":[
        {"device_id":"0","device_ip":"x","super_device_id":"37748736","device_logical_id":"0","rank_id":"0"},
        {"device_id":"1","device_ip":"x","super_device_id":"37748737","device_logical_id":"1","rank_id":1}]}],
        "super_pod_list":[{"super_pod_id":"0","server_list":[{"server_id":"node-a"}]}]}]}"#;

    #[test]
    fn versions_1_0_and_1_2_give_size_place_and_device() {
        let t = RankTable::parse(V10).expect("1.0");
        assert_eq!(t.size(), 3);
        assert_eq!(t.place(1), Some(Place { size: 3, server: 0, local_rank: 1, local_size: 2, device_id: 4 }));
        assert_eq!(t.place(2), Some(Place { size: 3, server: 1, local_rank: 0, local_size: 1, device_id: 0 }));
        assert_eq!(t.place(3), None);
        assert_eq!(t.rank0_server().map(|s| s.address.as_str()), Some("10.0.0.1"));
        let t = RankTable::parse(V12_GROUPS).expect("1.2 in groups");
        assert_eq!((t.version.as_str(), t.size()), ("1.2", 2));
        assert_eq!(t.rank0_server().map(|s| s.address.as_str()), Some("10.1.0.5"), "server_ip before server_id");
        // The digest follows the content, not the layout.
        let spaced = V10.replace(',', " ,\n ");
        assert_eq!(RankTable::parse(&spaced).map(|s| s.digest), RankTable::parse(V10).map(|s| s.digest));
        assert_ne!(t.digest, RankTable::parse(V10).map(|s| s.digest).unwrap_or_default());
    }

    #[test]
    fn bad_tables_are_refused_with_the_reason() {
        for (text, why) in [
            ("not json", "not JSON"),
            (r#"{"server_list":[]}"#, "no \"version\""),
            (r#"{"version":"2.0","server_list":[]}"#, "not one hccn reads"),
            (r#"{"version":"1.0","status":"initializing","server_list":[]}"#, "still being written"),
            (r#"{"version":"1.0"}"#, "neither"),
            (r#"{"version":"1.0","server_list":[]}"#, "no device"),
            (r#"{"version":"1.0","server_list":[{"device":[]}]}"#, "no \"server_id\""),
            (r#"{"version":"1.0","server_list":[{"server_id":"a","device":[{"rank_id":"0"}]}]}"#, "device_id"),
            (
                r#"{"version":"1.0","server_list":[{"server_id":"a","device":[{"rank_id":"x","device_id":"0"}]}]}"#,
                "not a number",
            ),
            (
                r#"{"version":"1.0","server_list":[{"server_id":"a","device":[{"rank_id":"0","device_id":"0"},{"rank_id":"0","device_id":"1"}]}]}"#,
                "twice",
            ),
            (
                r#"{"version":"1.0","server_list":[{"server_id":"a","device":[{"rank_id":"1","device_id":"0"}]}]}"#,
                "not below",
            ),
        ] {
            let e = RankTable::parse(text).err().unwrap_or_else(|| panic!("{text} was accepted"));
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
