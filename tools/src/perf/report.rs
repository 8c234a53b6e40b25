//! hccn-perf's results: the table nccl-tests prints (out-of-place and in-place columns side by
//! side, and with `-I 1` each side's per-iteration summary), and the same rows as JSON or CSV.

use std::io::{self, Write};
use std::path::Path;

use serde_json::{json, Value};

/// Per-iteration times of one cell, in microseconds (each iteration timed by its slowest rank).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IterStats {
    pub min: f64,
    pub max: f64,
    pub avg: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub stdev: f64,
    /// The coefficient of variation, stdev / avg, in percent.
    pub cv_pct: f64,
}

/// The nearest-rank percentile `p` of sorted `v` (as nccl-tests takes it).
fn percentile(v: &[f64], p: usize) -> f64 {
    let n = v.len();
    v[(n * p).div_ceil(100).clamp(1, n) - 1]
}

impl IterStats {
    /// `None` for no samples.
    pub fn of(times_us: &[f64]) -> Option<IterStats> {
        if times_us.is_empty() {
            return None;
        }
        let mut v = times_us.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let avg = v.iter().sum::<f64>() / n;
        let stdev = (v.iter().map(|t| (t - avg) * (t - avg)).sum::<f64>() / n).sqrt();
        Some(IterStats {
            min: v[0],
            max: v[v.len() - 1],
            avg,
            p50: v[v.len() / 2],
            p95: percentile(&v, 95),
            p99: percentile(&v, 99),
            stdev,
            cv_pct: if avg > 0.0 { stdev / avg * 100.0 } else { 0.0 },
        })
    }
}

/// One side of a row: out-of-place or in-place.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// Wrong elements over all ranks, with `-c`.
    pub wrong: Option<u64>,
    pub per_iter: Option<IterStats>,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub bytes: u64,
    pub count: u64,
    pub dtype: &'static str,
    pub redop: &'static str,
    /// -1 for an operation without a root.
    pub root: i64,
    pub out_of_place: Option<Cell>,
    pub in_place: Option<Cell>,
}

/// `v` in `width` characters: two decimals while they fit, then fewer, then an exponent
/// (nccl-tests' columns).
fn fixed(v: f64, width: usize) -> String {
    for decimals in [2, 1, 0] {
        let s = format!("{v:>width$.decimals$}");
        if s.len() <= width {
            return s;
        }
    }
    format!("{v:>width$.0e}")
}

/// The three header lines of the table.
pub fn header(per_iter: bool) -> Vec<String> {
    let lead = |a: &str, b: &str| format!("# {a:>10}  {b:>12}  {:>8}  {:>6}  {:>6}", "", "", "");
    let names = |a: &str, b: &str, c: &str, d: &str, e: &str| format!("# {a:>10}  {b:>12}  {c:>8}  {d:>6}  {e:>6}");
    let side = |i: [&str; 4], extra: [&str; 4]| {
        let mut s = format!("  {:>7}  {:>6}  {:>6}  {:>6}", i[0], i[1], i[2], i[3]);
        if per_iter {
            s.push_str(&format!("  {:>7}  {:>7}  {:>7}  {:>7}", extra[0], extra[1], extra[2], extra[3]));
        }
        s
    };
    let titles = if per_iter {
        "              out-of-place (+ per-iteration)                   in-place (+ per-iteration)"
    } else {
        "           out-of-place                       in-place"
    };
    let cols = side(["time", "algbw", "busbw", "#wrong"], ["i_min", "i_max", "i_p99", "i_cv%"]);
    let units = side(["(us)", "(GB/s)", "(GB/s)", ""], ["(us)", "(us)", "(us)", "(%)"]);
    vec![
        format!("{}{titles}", lead("", "")),
        format!("{}{cols}{cols}", names("size", "count", "type", "redop", "root")),
        format!("{}{units}{units}", names("(B)", "(elements)", "", "", "")).trim_end().to_owned(),
    ]
}

fn cell_text(c: Option<&Cell>, per_iter: bool) -> String {
    let Some(c) = c else {
        let mut s = format!("  {:>7}  {:>6}  {:>6}  {:>6}", "N/A", "N/A", "N/A", "N/A");
        if per_iter {
            s.push_str(&format!("  {:>7}  {:>7}  {:>7}  {:>7}", "N/A", "N/A", "N/A", "N/A"));
        }
        return s;
    };
    let wrong = c.wrong.map_or("N/A".to_owned(), |w| w.to_string());
    let mut s = format!("  {}  {}  {}  {wrong:>6}", fixed(c.us, 7), fixed(c.algbw, 6), fixed(c.busbw, 6));
    if per_iter {
        match &c.per_iter {
            Some(i) => s.push_str(&format!(
                "  {}  {}  {}  {}",
                fixed(i.min, 7),
                fixed(i.max, 7),
                fixed(i.p99, 7),
                fixed(i.cv_pct, 7)
            )),
            None => s.push_str(&format!("  {:>7}  {:>7}  {:>7}  {:>7}", "N/A", "N/A", "N/A", "N/A")),
        }
    }
    s
}

/// A row as the table shows it.
pub fn line(r: &Row, per_iter: bool) -> String {
    format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}",
        r.bytes,
        r.count,
        r.dtype,
        r.redop,
        r.root,
        cell_text(r.out_of_place.as_ref(), per_iter),
        cell_text(r.in_place.as_ref(), per_iter)
    )
}

/// What `-J FILE` writes, by FILE's suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Csv,
}

impl Format {
    pub fn of(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "json" => Some(Format::Json),
            "csv" => Some(Format::Csv),
            _ => None,
        }
    }
}

fn cell_json(c: Option<&Cell>) -> Value {
    let Some(c) = c else { return Value::Null };
    let mut v = json!({"time": c.us, "alg_bw": c.algbw, "bus_bw": c.busbw, "nwrong": c.wrong});
    if let Some(i) = &c.per_iter {
        v["per_iter"] = json!({
            "min_us": i.min, "max_us": i.max, "avg_us": i.avg, "p50_us": i.p50, "p95_us": i.p95,
            "p99_us": i.p99, "stdev_us": i.stdev, "cv_pct": i.cv_pct,
        });
    }
    v
}

/// The whole run as JSON: `config` as given, one object per row, the totals.
pub fn json(config: Value, rows: &[Row], wrong: Option<u64>, avg_busbw: f64) -> Value {
    let results: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "size": r.bytes, "count": r.count, "type": r.dtype, "redop": r.redop, "root": r.root,
                "out_of_place": cell_json(r.out_of_place.as_ref()),
                "in_place": cell_json(r.in_place.as_ref()),
            })
        })
        .collect();
    json!({
        "config": config,
        "results": results,
        "wrong_elements": wrong.map(|w| json!({"count": w, "okay": w == 0})),
        "average_bus_bandwidth": avg_busbw,
    })
}

/// The rows as CSV, one line per row after a header; empty fields where a side or a figure
/// does not apply.
pub fn csv(op: &str, rows: &[Row], per_iter: bool) -> String {
    let mut head: Vec<String> = ["op", "size", "count", "type", "redop", "root"].map(String::from).to_vec();
    let iter_fields: &[&str] = if per_iter { &["i_min_us", "i_max_us", "i_p99_us", "i_cv_pct"] } else { &[] };
    for side in ["oop", "ip"] {
        let fields = ["time_us", "algbw_gbs", "busbw_gbs", "wrong"].iter().chain(iter_fields);
        head.extend(fields.map(|f| format!("{side}_{f}")));
    }
    let mut out = head.join(",") + "\n";
    for r in rows {
        let mut f = vec![op.to_owned(), r.bytes.to_string(), r.count.to_string(), r.dtype.into(), r.redop.into()];
        f.push(r.root.to_string());
        for c in [&r.out_of_place, &r.in_place] {
            let mut cells = vec![String::new(); if per_iter { 8 } else { 4 }];
            if let Some(c) = c {
                cells[0] = format!("{:.3}", c.us);
                cells[1] = format!("{:.4}", c.algbw);
                cells[2] = format!("{:.4}", c.busbw);
                cells[3] = c.wrong.map(|w| w.to_string()).unwrap_or_default();
                if let (true, Some(i)) = (per_iter, &c.per_iter) {
                    cells[4..].clone_from_slice(&[i.min, i.max, i.p99, i.cv_pct].map(|x| format!("{x:.3}")));
                }
            }
            f.extend(cells);
        }
        out.push_str(&(f.join(",") + "\n"));
    }
    out
}

/// Writes `text` to `path`, replacing what was there.
pub fn write(path: &Path, text: &str) -> io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(wrong: Option<u64>) -> Row {
        let cell = Cell { us: 12.345, algbw: 0.5, busbw: 0.75, wrong, per_iter: IterStats::of(&[10.0, 12.0, 20.0]) };
        Row { bytes: 1024, count: 256, dtype: "fp32", redop: "sum", root: -1, out_of_place: Some(cell), in_place: None }
    }

    #[test]
    fn columns_line_up_with_the_header() {
        for per_iter in [false, true] {
            let h = header(per_iter);
            let l = line(&row(Some(0)), per_iter);
            let cols = l.split_whitespace().count();
            assert_eq!(cols, if per_iter { 21 } else { 13 }, "{l}");
            assert_eq!(h[1].split_whitespace().count(), cols + 1, "the # and the names: {h:?}");
            assert_eq!(h[1].len(), l.len(), "{h:?}\n{l}");
        }
        assert!(line(&row(None), false).contains("  N/A"), "no check: N/A");
        assert_eq!(fixed(123456.0, 7), " 123456");
        assert_eq!(fixed(1234567.0, 7), "1234567");
        assert_eq!(fixed(12345678.0, 7), "    1e7");
    }

    #[test]
    fn per_iteration_statistics() {
        let s = IterStats::of(&[4.0, 1.0, 3.0, 2.0]).expect("stats");
        assert_eq!((s.min, s.max, s.p50, s.p99, s.avg), (1.0, 4.0, 3.0, 4.0, 2.5));
        assert!((s.cv_pct - 44.72).abs() < 0.01, "{s:?}");
        assert_eq!(IterStats::of(&[]), None);
    }

    #[test]
    fn json_and_csv_carry_the_rows() {
        let rows = [row(Some(0))];
        let j = json(json!({"op": "allreduce"}), &rows, Some(0), 0.75);
        assert_eq!(j["results"][0]["out_of_place"]["nwrong"], 0);
        assert_eq!(j["results"][0]["in_place"], Value::Null);
        assert_eq!(j["wrong_elements"]["okay"], true);
        let c = csv("allreduce", &rows, true);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
        assert!(lines[1].starts_with("allreduce,1024,256,fp32,sum,-1,12.345,0.5000,0.7500,0,10.000,20.000,20.000,"));
        assert_eq!(Format::of(Path::new("r.JSON")), Some(Format::Json));
        assert_eq!(Format::of(Path::new("r.txt")), None);
    }
}
