//! The two pictures of `hccn-trace`, drawn with plotters on a bitmap: the rank x rank heat map
//! of bytes sent and the per-rank timeline of operations. Text needs a TrueType font, looked up
//! at a few usual system paths; without one the pictures are drawn without labels.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::model::Trace;

/// Heat map size in pixels (the grid is `GRID` square at `(GRID_X, GRID_Y)`).
pub const HEATMAP_SIZE: (u32, u32) = (780, 700);
const GRID: i32 = 600;
const GRID_X: i32 = 70;
const GRID_Y: i32 = 60;

/// Timeline width; its height grows with the number of ranks.
pub const TIMELINE_WIDTH: u32 = 1200;
const LANE_X: i32 = 80;
const LANE_TOP: i32 = 50;

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Whether labels can be drawn: registers the first font found, once.
pub fn have_font() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        FONT_PATHS.iter().filter_map(|p| std::fs::read(p).ok()).any(|bytes| {
            // plotters keeps registered fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
        })
    })
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn err(e: impl std::fmt::Display) -> String {
    format!("drawing failed: {e}")
}

fn label(area: &Area<'_>, text: &str, at: (i32, i32), size: u32) -> Result<(), String> {
    if !have_font() {
        return Ok(());
    }
    area.draw(&Text::new(text.to_owned(), at, ("sans-serif", size).into_font().color(&BLACK))).map_err(err)
}

fn rect(area: &Area<'_>, from: (i32, i32), to: (i32, i32), color: RGBColor) -> Result<(), String> {
    area.draw(&Rectangle::new([from, to], color.filled())).map_err(err)
}

/// White for nothing to dark blue for the most.
fn shade(v: u64, max: u64) -> RGBColor {
    let t = if max == 0 { 0.0 } else { v as f64 / max as f64 };
    let mix = |lo: f64, hi: f64| (lo + (hi - lo) * t).round() as u8;
    RGBColor(mix(255.0, 8.0), mix(255.0, 48.0), mix(255.0, 107.0))
}

/// Human-readable bytes.
pub fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Pixel edge `i` of `n` cells over `len` pixels starting at `start`.
fn edge(start: i32, len: i32, i: usize, n: usize) -> i32 {
    start + (i64::from(len) * i as i64 / n.max(1) as i64) as i32
}

/// What a heat map shows: bytes sent, or time spent sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    Bytes,
    Time,
}

/// Rank x rank bytes sent (or time spent sending): row = source, column = destination.
pub fn heatmap(trace: &Trace, measure: Measure, path: &Path) -> Result<(), String> {
    let (m, title, top) = match measure {
        Measure::Bytes => {
            (trace.matrix(), "bytes sent: source rank (row) -> destination rank (column)", human as fn(u64) -> String)
        }
        Measure::Time => (
            trace.time_matrix(),
            "time sending: source rank (row) -> destination rank (column)",
            (|us| format!("{:.1} ms", us as f64 / 1e3)) as fn(u64) -> String,
        ),
    };
    let n = m.len();
    let max = m.iter().flatten().copied().max().unwrap_or(0);
    let area = BitMapBackend::new(path, HEATMAP_SIZE).into_drawing_area();
    area.fill(&WHITE).map_err(err)?;
    for (src, row) in m.iter().enumerate() {
        for (dst, &v) in row.iter().enumerate() {
            let from = (edge(GRID_X, GRID, dst, n), edge(GRID_Y, GRID, src, n));
            let to = (edge(GRID_X, GRID, dst + 1, n), edge(GRID_Y, GRID, src + 1, n));
            rect(&area, from, to, shade(v, max))?;
        }
    }
    let frame = [(GRID_X, GRID_Y), (GRID_X + GRID, GRID_Y + GRID)];
    area.draw(&Rectangle::new(frame, BLACK.stroke_width(1))).map_err(err)?;
    // Colour bar: the top is the busiest link.
    let (bar_x, bar_w) = (GRID_X + GRID + 30, 20);
    for y in 0..GRID {
        let v = (max as f64 * f64::from(GRID - y) / f64::from(GRID)) as u64;
        rect(&area, (bar_x, GRID_Y + y), (bar_x + bar_w, GRID_Y + y + 1), shade(v, max))?;
    }
    label(&area, title, (GRID_X, 20), 18)?;
    label(&area, &top(max), (bar_x - 10, GRID_Y - 18), 12)?;
    label(&area, "0", (bar_x + 5, GRID_Y + GRID + 5), 12)?;
    if n <= 32 {
        for r in 0..n {
            let mid = (edge(0, GRID, r, n) + edge(0, GRID, r + 1, n)) / 2;
            label(&area, &r.to_string(), (GRID_X - 25, GRID_Y + mid - 6), 12)?;
            label(&area, &r.to_string(), (GRID_X + mid - 4, GRID_Y + GRID + 8), 12)?;
        }
    }
    area.present().map_err(err)
}

const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Lane height for `n` ranks: 30 px, less for many ranks (at least 2).
fn lane_height(n: u32) -> i32 {
    (800 / n.max(1) as i32).clamp(2, 30)
}

/// Height of the timeline picture for `n` ranks.
pub fn timeline_height(n: u32) -> u32 {
    (LANE_TOP + lane_height(n) * n as i32 + 60) as u32
}

/// One lane per rank, one rectangle per operation, coloured by operation.
pub fn timeline(trace: &Trace, path: &Path) -> Result<(), String> {
    let n = trace.ranks;
    let lane = lane_height(n);
    let size = (TIMELINE_WIDTH, timeline_height(n));
    let area = BitMapBackend::new(path, size).into_drawing_area();
    area.fill(&WHITE).map_err(err)?;
    let t0 = trace.ops.iter().map(|o| o.start_us).fold(f64::INFINITY, f64::min);
    let t1 = trace.ops.iter().map(|o| o.start_us + o.dur_us).fold(f64::NEG_INFINITY, f64::max);
    let span = (t1 - t0).max(1.0);
    let width = TIMELINE_WIDTH as i32 - LANE_X - 20;
    let mut names: Vec<&str> = trace.ops.iter().map(|o| o.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let color = |name: &str| PALETTE[names.iter().position(|n| *n == name).unwrap_or(0) % PALETTE.len()];
    let x = |t: f64| LANE_X + ((t - t0) / span * f64::from(width)) as i32;
    for r in 0..n as i32 {
        let shade = if r % 2 == 0 { RGBColor(245, 245, 245) } else { WHITE };
        let top = LANE_TOP + r * lane;
        rect(&area, (LANE_X, top), (LANE_X + width, top + lane), shade)?;
        if lane >= 12 {
            label(&area, &format!("rank {r}"), (10, top + lane / 2 - 6), 12)?;
        }
    }
    for o in &trace.ops {
        let top = LANE_TOP + o.rank as i32 * lane;
        let x0 = x(o.start_us);
        let x1 = x(o.start_us + o.dur_us).max(x0 + 1);
        rect(&area, (x0, top + 1), (x1, top + lane - 1), color(&o.name))?;
    }
    let bottom = LANE_TOP + lane * n as i32;
    label(&area, &format!("operations per rank over {:.3} ms", span / 1000.0), (LANE_X, 15), 18)?;
    let mut lx = LANE_X;
    for name in &names {
        rect(&area, (lx, bottom + 20), (lx + 14, bottom + 34), color(name))?;
        label(&area, name, (lx + 18, bottom + 20), 13)?;
        lx += 30 + 8 * name.len() as i32;
    }
    area.present().map_err(err)
}
