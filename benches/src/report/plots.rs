//! The report's figures as plain SVG: grouped bars, lines, and a grid of zones.

use std::fmt::Write as _;

use super::zones::ZoneMap;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 120.0;

/// Colour-blind-safe palette (Okabe–Ito), then greys.
const COLOURS: [&str; 10] = [
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
    "#999999", "#666666",
];

pub fn colour(i: usize) -> &'static str {
    COLOURS[i % COLOURS.len()]
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A named series of values, one per category (`None`: no bar).
pub struct Bars {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// A named series of (x, y) points.
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

/// A y axis: linear from `lo` or logarithmic.
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Axis {
    fn new(values: impl Iterator<Item = f64>, log: bool, from_zero: bool) -> Axis {
        let vals: Vec<f64> = values
            .filter(|v| v.is_finite() && (!log || *v > 0.0))
            .collect();
        let max = vals.iter().cloned().fold(f64::MIN, f64::max);
        let min = vals.iter().cloned().fold(f64::MAX, f64::min);
        if vals.is_empty() {
            return Axis {
                lo: if log { 1.0 } else { 0.0 },
                hi: if log { 10.0 } else { 1.0 },
                log,
            };
        }
        if log {
            Axis {
                lo: 10f64.powf(min.log10().floor()),
                hi: 10f64.powf(max.log10().ceil().max(min.log10().floor() + 1.0)),
                log,
            }
        } else {
            let lo = if from_zero { 0.0f64.min(min) } else { min };
            let hi = if max > lo { max } else { lo + 1.0 };
            let step = nice_step((hi - lo) / 5.0);
            Axis {
                lo: (lo / step).floor() * step,
                hi: (hi / step).ceil() * step,
                log,
            }
        }
    }

    /// Position in 0..=1.
    fn frac(&self, v: f64) -> f64 {
        if self.log {
            (v.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (
                self.lo.log10().round() as i32,
                self.hi.log10().round() as i32,
            );
            (a..=b).map(|e| 10f64.powi(e)).collect()
        } else {
            let step = nice_step((self.hi - self.lo) / 5.0);
            let n = ((self.hi - self.lo) / step).round() as usize;
            (0..=n).map(|i| self.lo + i as f64 * step).collect()
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw * 0.999)
        .unwrap_or(10.0 * p)
}

fn tick_label(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if v.abs() >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The frame shared by bar and line charts: title, y axis with grid, legend.
struct Frame {
    svg: String,
    plot_w: f64,
    plot_h: f64,
}

impl Frame {
    fn new(title: &str, y_label: &str, axis: &Axis, legend: &[(&str, &str, bool)]) -> Frame {
        let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">{}</text>\n\
             <text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
            LEFT + plot_w / 2.0,
            esc(title),
            TOP + plot_h / 2.0,
            esc(y_label)
        );
        for t in axis.ticks() {
            let y = TOP + plot_h * (1.0 - axis.frac(t));
            writeln!(
                svg,
                "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
                 <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT + plot_w,
                LEFT - 6.0,
                y + 4.0,
                tick_label(t)
            )
            .unwrap();
        }
        writeln!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{}\" stroke=\"black\"/>\
             <line x1=\"{LEFT}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"black\"/>",
            TOP + plot_h,
            LEFT + plot_w,
            TOP + plot_h,
            TOP + plot_h
        )
        .unwrap();
        for (i, (name, col, dashed)) in legend.iter().enumerate() {
            let (x, y) = (WIDTH - RIGHT + 16.0, TOP + 10.0 + i as f64 * 20.0);
            let dash = if *dashed {
                " stroke-dasharray=\"6 3\""
            } else {
                ""
            };
            writeln!(
                svg,
                "<line x1=\"{x}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\" stroke=\"{col}\" stroke-width=\"8\"{dash}/>\
                 <text x=\"{}\" y=\"{}\">{}</text>",
                x + 18.0,
                x + 24.0,
                y + 4.0,
                esc(name)
            )
            .unwrap();
        }
        Frame {
            svg,
            plot_w,
            plot_h,
        }
    }

    fn finish(mut self) -> String {
        self.svg.push_str("</svg>\n");
        self.svg
    }
}

/// Grouped bars: one group per category, one bar per series.
pub fn bars(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[Bars],
    log: bool,
) -> String {
    let all = series
        .iter()
        .flat_map(|s| s.values.iter().flatten().cloned());
    let axis = Axis::new(all, log, true);
    let legend: Vec<(&str, &str, bool)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), colour(i), false))
        .collect();
    let mut f = Frame::new(title, y_label, &axis, &legend);
    let group = f.plot_w / categories.len().max(1) as f64;
    let bar = group * 0.8 / series.len().max(1) as f64;
    for (c, cat) in categories.iter().enumerate() {
        let x0 = LEFT + c as f64 * group + group * 0.1;
        for (s, ser) in series.iter().enumerate() {
            let Some(v) = ser.values.get(c).copied().flatten() else {
                continue;
            };
            let h = f.plot_h * axis.frac(v).clamp(0.0, 1.0);
            writeln!(
                f.svg,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\">\
                 <title>{}: {}</title></rect>",
                x0 + s as f64 * bar,
                TOP + f.plot_h - h,
                bar.max(1.0),
                colour(s),
                esc(&ser.name),
                tick_label(v)
            )
            .unwrap();
        }
        let (x, y) = (x0 + group * 0.4, TOP + f.plot_h + 12.0);
        writeln!(
            f.svg,
            "<text transform=\"translate({x:.1},{y}) rotate(35)\" text-anchor=\"start\">{}</text>",
            esc(cat)
        )
        .unwrap();
    }
    f.finish()
}

/// Lines over a numeric x axis.
pub fn lines(title: &str, x_label: &str, y_label: &str, series: &[Line]) -> String {
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let axis = Axis::new(ys, false, true);
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let x_axis = Axis::new(xs, false, false);
    let legend: Vec<(&str, &str, bool)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), colour(i), s.dashed))
        .collect();
    let mut f = Frame::new(title, y_label, &axis, &legend);
    let at = |x: f64, y: f64, f: &Frame| {
        (
            LEFT + f.plot_w * x_axis.frac(x),
            TOP + f.plot_h * (1.0 - axis.frac(y)),
        )
    };
    for t in x_axis.ticks() {
        let (x, _) = at(t, axis.lo, &f);
        writeln!(
            f.svg,
            "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            TOP + f.plot_h + 18.0,
            tick_label(t)
        )
        .unwrap();
    }
    writeln!(
        f.svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        LEFT + f.plot_w / 2.0,
        TOP + f.plot_h + 44.0,
        esc(x_label)
    )
    .unwrap();
    for (i, s) in series.iter().enumerate() {
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| {
                let (px, py) = at(x, y, &f);
                format!("{px:.1},{py:.1}")
            })
            .collect();
        let dash = if s.dashed {
            " stroke-dasharray=\"6 3\""
        } else {
            ""
        };
        writeln!(
            f.svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{dash}/>",
            pts.join(" "),
            colour(i)
        )
        .unwrap();
        for p in &pts {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            writeln!(
                f.svg,
                "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{}\"/>",
                colour(i)
            )
            .unwrap();
        }
    }
    f.finish()
}

/// One square per zone, coloured by the stream that owns it; free and metadata zones grey.
pub fn zone_grid(title: &str, map: &ZoneMap) -> String {
    const CELL: f64 = 18.0;
    const COLS: u32 = 32;
    let rows = map.zones.div_ceil(COLS);
    let mut owners: Vec<&str> = map.owners.iter().map(|(_, o)| o.as_str()).collect();
    owners.sort();
    owners.dedup();
    let grid_h = rows as f64 * CELL;
    let height = TOP + grid_h.max(owners.len() as f64 * 20.0 + 20.0) + 30.0;
    let width = LEFT / 2.0 + COLS as f64 * CELL + RIGHT + 40.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"24\" font-size=\"16\">{}</text>\n",
        LEFT / 2.0,
        esc(title)
    );
    for zone in 0..map.zones {
        let owner = map
            .owners
            .iter()
            .find(|(z, _)| *z == zone)
            .map(|(_, o)| o.as_str());
        let fill = owner
            .and_then(|o| owners.iter().position(|x| *x == o))
            .map_or("#e8e8e8", colour);
        let (x, y) = (
            LEFT / 2.0 + (zone % COLS) as f64 * CELL,
            TOP + (zone / COLS) as f64 * CELL,
        );
        writeln!(
            svg,
            "<rect x=\"{x}\" y=\"{y}\" width=\"{}\" height=\"{}\" fill=\"{fill}\" stroke=\"white\">\
             <title>zone {zone}: {}</title></rect>",
            CELL - 1.0,
            CELL - 1.0,
            esc(owner.unwrap_or("free or metadata"))
        )
        .unwrap();
    }
    let legend_x = LEFT / 2.0 + COLS as f64 * CELL + 20.0;
    let items = owners
        .iter()
        .enumerate()
        .map(|(i, o)| (colour(i), *o))
        .chain([("#e8e8e8", "free or metadata")]);
    for (i, (col, name)) in items.enumerate() {
        let y = TOP + i as f64 * 20.0;
        writeln!(
            svg,
            "<rect x=\"{legend_x}\" y=\"{y}\" width=\"14\" height=\"14\" fill=\"{col}\"/>\
             <text x=\"{}\" y=\"{}\">{}</text>",
            legend_x + 20.0,
            y + 11.0,
            esc(name)
        )
        .unwrap();
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_ticks_are_round() {
        assert_eq!(nice_step(0.17), 0.2);
        assert_eq!(nice_step(3.0), 5.0);
        let a = Axis::new([1.02, 1.94].into_iter(), false, true);
        assert_eq!((a.lo, a.hi), (0.0, 2.0));
        let log = Axis::new([150.0, 320_000.0].into_iter(), true, true);
        assert_eq!(log.ticks(), vec![100.0, 1e3, 1e4, 1e5, 1e6]);
        assert_eq!(tick_label(320_000.0), "320k");
    }

    #[test]
    fn charts_are_svg_with_one_mark_per_value() {
        let svg = bars(
            "ops",
            "ops/s",
            &["a".into(), "b".into()],
            &[Bars {
                name: "x".into(),
                values: vec![Some(1.0), None],
            }],
            false,
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<title>x:").count(), 1);
        let map = ZoneMap {
            zones: 4,
            owners: vec![(2, "db/stream 1".into())],
        };
        let grid = zone_grid("zones", &map);
        assert_eq!(grid.matches("<title>zone ").count(), 4);
        assert!(grid.contains("zone 2: db/stream 1"));
    }
}
