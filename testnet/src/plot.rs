//! Charts (SVG or PNG) and CSV files for the paper's figures.
//!
//! Charts are drawn with `plotters` without any system library: text is laid
//! out and, for PNG, rasterised with `ab_glyph` from the DejaVu Sans font
//! embedded by the `dejavu` crate. SVG files carry text as `<text>` elements
//! (`font-family="sans-serif"`), so viewers render it with their own fonts.
//!
//! A logarithmic y axis is drawn by plotting `log10(y)` on a linear axis with
//! decade ticks labelled `1e-40`, …, `0.1`, `1`; it handles ranges as wide as
//! Fig. 2's 1e-45..1. Points that cannot be shown (non-finite coordinates, or
//! `y <= 0` on a log axis) are skipped and split a line into separate runs.

use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeriesStyle {
    /// A solid line with a marker on every point.
    Line,
    /// A dashed line without markers (reference curves, bounds).
    Dashed,
    /// Markers only (measurements).
    Points,
}

/// One named curve of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Data points `(x, y)`, drawn in the given order.
    pub points: Vec<(f64, f64)>,
    /// Line, dashed line or markers.
    pub style: SeriesStyle,
}

/// A 2-D chart with any number of series.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// Caption above the plot.
    pub title: String,
    /// Text under the x axis.
    pub x_label: String,
    /// Text left of the y axis.
    pub y_label: String,
    /// Logarithmic y axis (decades); non-positive y values are skipped.
    pub log_y: bool,
    /// The curves, drawn in order with distinct colours.
    pub series: Vec<Series>,
}

/// Image size in pixels.
const SIZE: (u32, u32) = (960, 600);

/// Distinct, print-friendly colours (Tableau 10), cycled through by series.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The font family plotters asks for by default.
const FONT: &str = "sans-serif";

/// Writes `chart` as an image; the format follows the extension of `path`
/// (`.svg` or `.png`). Parent directories are created as needed.
pub fn write_chart(chart: &Chart, path: &Path) -> anyhow::Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let svg = match ext.as_deref() {
        Some("svg") => true,
        Some("png") => false,
        _ => bail!("cannot tell the image format of {}: use a .svg or .png extension", path.display()),
    };
    register_fonts()?;
    create_parent(path)?;
    if svg {
        let root = SVGBackend::new(path, SIZE).into_drawing_area();
        draw(chart, &root)?;
        root.present().map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
    } else {
        let root = BitMapBackend::new(path, SIZE).into_drawing_area();
        draw(chart, &root)?;
        root.present().map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Writes a CSV file with a header line and one line per row. Fields that
/// contain commas, quotes or newlines are quoted. Every row must have as many
/// fields as the header. Parent directories are created as needed.
pub fn write_csv(path: &Path, header: &[&str], rows: &[Vec<String>]) -> anyhow::Result<()> {
    create_parent(path)?;
    let mut w = csv::Writer::from_path(path).with_context(|| format!("creating {}", path.display()))?;
    w.write_record(header).with_context(|| format!("writing {}", path.display()))?;
    for (i, row) in rows.iter().enumerate() {
        if row.len() != header.len() {
            bail!("row {i} of {} has {} fields, the header has {}", path.display(), row.len(), header.len());
        }
        w.write_record(row).with_context(|| format!("writing {}", path.display()))?;
    }
    w.flush().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn create_parent(path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

/// Registers the embedded font once per process (plotters keeps a global table).
fn register_fonts() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        bail!("the embedded DejaVu Sans font could not be loaded")
    }
}

/// A point as plotted: y is `log10(y)` on a log axis.
type Pt = (f64, f64);

/// Splits a series into runs of drawable points.
fn runs(series: &Series, log_y: bool) -> Vec<Vec<Pt>> {
    let mut out = vec![];
    let mut cur: Vec<Pt> = vec![];
    for &(x, y) in &series.points {
        let y = if log_y && y > 0.0 {
            y.log10()
        } else if log_y {
            f64::NAN
        } else {
            y
        };
        if x.is_finite() && y.is_finite() {
            cur.push((x, y));
        } else if !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// One axis: range, major ticks (labelled), minor ticks.
///
/// It is its own plotters coordinate so that the tick positions are ours
/// (plotters' built-in log axis labels far too many decades for 1e-45..1).
#[derive(Clone, Debug)]
struct Axis {
    range: Range<f64>,
    major: Vec<f64>,
    minor: Vec<f64>,
    /// Decimal places for labels of a linear axis.
    decimals: usize,
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let frac = (value - self.range.start) / (self.range.end - self.range.start);
        let pixels = f64::from(limit.1 - limit.0) * frac;
        // Float-to-int `as` saturates, so far-out values cannot overflow.
        limit.0.saturating_add((pixels + 1e-3).floor() as i32)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.minor.clone()
        } else {
            self.major.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

impl Axis {
    fn label(&self, v: f64) -> String {
        format!("{:.*}", self.decimals, v)
    }
}

/// How much room to leave around the data on a linear axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pad {
    /// Range exactly as given.
    None,
    /// 2% on both sides, so edge markers are not cut.
    Both,
    /// 5% headroom above; below too unless the range starts at zero.
    AboveAndNonZeroBelow,
}

/// A linear axis with "nice" ticks (1, 2 or 5 times a power of ten).
fn linear_axis(min: f64, max: f64, pad: Pad) -> Axis {
    let (mut lo, mut hi) = (min, max);
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        lo -= d;
        hi += d;
    } else {
        let span = hi - lo;
        match pad {
            Pad::None => {}
            Pad::Both => {
                lo -= span * 0.02;
                hi += span * 0.02;
            }
            Pad::AboveAndNonZeroBelow => {
                if lo != 0.0 {
                    lo -= span * 0.05;
                }
                hi += span * 0.05;
            }
        }
    }
    let raw = (hi - lo) / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|f| f * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    let major: Vec<f64> = (first..=last).map(|i| i as f64 * step).collect();
    let minor_step = step / 5.0;
    let minor =
        ((lo / minor_step).ceil() as i64..=(hi / minor_step).floor() as i64).map(|i| i as f64 * minor_step).collect();
    let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
    Axis { range: lo..hi, major, minor, decimals }
}

/// A log axis in log10 units, from whole decade to whole decade (plus a
/// sliver so markers on the boundary decades are not cut).
fn log_axis(min: f64, max: f64) -> Axis {
    let mut lo = min.floor();
    let mut hi = max.ceil();
    if hi <= lo {
        lo -= 1.0;
        hi += 1.0;
    }
    let span = hi - lo;
    // At most ~12 labelled decades; label every 1, 2, 5, 10, ... decades.
    let step =
        [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0].into_iter().find(|s| span / s <= 12.0).unwrap_or((span / 12.0).ceil());
    let major: Vec<f64> = ((lo / step).ceil() as i64..=(hi / step).floor() as i64).map(|i| i as f64 * step).collect();
    let minor: Vec<f64> = if span <= 8.0 {
        // 2x .. 9x within each decade.
        (lo as i64..hi as i64).flat_map(|d| (2..10).map(move |j| d as f64 + f64::from(j).log10())).collect()
    } else {
        // Five light lines per labelled interval, on whole decades.
        let minor_step = (step / 5.0).max(1.0);
        ((lo / minor_step).ceil() as i64..=(hi / minor_step).floor() as i64).map(|i| i as f64 * minor_step).collect()
    };
    let sliver = (span * 0.01).min(0.1);
    Axis { range: lo - sliver..hi + sliver, major, minor, decimals: 0 }
}

/// Label for a decade tick `v = log10(y)`.
fn decade_label(v: f64) -> String {
    let k = v.round() as i32;
    if (-3..=0).contains(&k) {
        format!("{:.*}", (-k) as usize, 10f64.powi(k))
    } else if (1..=4).contains(&k) {
        format!("{}", 10i64.pow(k as u32))
    } else {
        format!("1e{k}")
    }
}

/// Where the legend goes: the corner with the fewest data points under it.
fn legend_position(all: &[Pt], x: &Range<f64>, y: &Range<f64>) -> SeriesLabelPosition {
    let corners = [
        (SeriesLabelPosition::UpperRight, true, true),
        (SeriesLabelPosition::UpperLeft, false, true),
        (SeriesLabelPosition::LowerRight, true, false),
        (SeriesLabelPosition::LowerLeft, false, false),
    ];
    let mut best = (usize::MAX, SeriesLabelPosition::UpperRight);
    for (pos, right, upper) in corners {
        let count = all
            .iter()
            .filter(|(px, py)| {
                let fx = (px - x.start) / (x.end - x.start);
                let fy = (py - y.start) / (y.end - y.start);
                let in_x = if right { fx > 0.55 } else { fx < 0.45 };
                let in_y = if upper { fy > 0.6 } else { fy < 0.4 };
                in_x && in_y
            })
            .count();
        if count < best.0 {
            best = (count, pos);
        }
    }
    best.1
}

fn draw<DB: DrawingBackend>(chart: &Chart, root: &DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing chart: {e}");
    root.fill(&WHITE).map_err(err)?;

    let runs: Vec<Vec<Vec<Pt>>> = chart.series.iter().map(|s| runs(s, chart.log_y)).collect();
    let all: Vec<Pt> = runs.iter().flatten().flatten().copied().collect();
    let bounds = |f: fn(&Pt) -> f64| {
        all.iter().map(f).fold(None, |acc: Option<(f64, f64)>, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
    };
    let (x_min, x_max) = bounds(|p| p.0).unwrap_or((0.0, 1.0));
    let x_axis = linear_axis(x_min, x_max, Pad::Both);
    let y_axis = match (chart.log_y, bounds(|p| p.1)) {
        (true, Some((lo, hi))) => log_axis(lo, hi),
        (true, None) => log_axis(-3.0, 0.0),
        // Start at zero when that does not squash the data (rates, counts).
        (false, Some((lo, hi))) => {
            let lo = if lo >= 0.0 && lo <= hi / 2.0 { 0.0 } else { lo };
            linear_axis(lo, hi, Pad::AboveAndNonZeroBelow)
        }
        (false, None) => linear_axis(0.0, 1.0, Pad::None),
    };

    let mut ctx = ChartBuilder::on(root)
        .caption(&chart.title, (FONT, 26))
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(85)
        .build_cartesian_2d(x_axis.clone(), y_axis.clone())
        .map_err(err)?;

    let log_y = chart.log_y;
    let x_fmt = |v: &f64| x_axis.label(*v);
    let y_fmt = |v: &f64| {
        if log_y {
            decade_label(*v)
        } else {
            y_axis.label(*v)
        }
    };
    ctx.configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 17))
        .bold_line_style(BLACK.mix(0.15))
        .light_line_style(BLACK.mix(0.05))
        .draw()
        .map_err(err)?;

    for (i, (series, runs)) in chart.series.iter().zip(&runs).enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let line = color.stroke_width(2);
        let mut first = true;
        // A series with no drawable point still gets its legend entry.
        let empty = vec![vec![]];
        let runs = if runs.is_empty() { &empty } else { runs };
        for run in runs {
            let anno = match series.style {
                SeriesStyle::Line => {
                    ctx.draw_series(LineSeries::new(run.iter().copied(), line)).map_err(err)?;
                    ctx.draw_series(run.iter().map(|&p| Circle::new(p, 3, color.filled()).into_dyn())).map_err(err)?
                }
                SeriesStyle::Dashed => {
                    ctx.draw_series(DashedLineSeries::new(run.iter().copied(), 8, 5, line)).map_err(err)?
                }
                SeriesStyle::Points => {
                    ctx.draw_series(run.iter().map(|&p| Circle::new(p, 4, color.filled()).into_dyn())).map_err(err)?
                }
            };
            if first {
                first = false;
                anno.label(series.name.as_str());
                // The small sample drawn next to the legend entry.
                match series.style {
                    SeriesStyle::Line => anno.legend(move |(x, y)| {
                        EmptyElement::at((x, y))
                            + PathElement::new(vec![(0, 0), (24, 0)], line)
                            + Circle::new((12, 0), 3, color.filled())
                    }),
                    SeriesStyle::Dashed => anno.legend(move |(x, y)| {
                        EmptyElement::at((x, y))
                            + PathElement::new(vec![(0, 0), (9, 0)], line)
                            + PathElement::new(vec![(15, 0), (24, 0)], line)
                    }),
                    SeriesStyle::Points => {
                        anno.legend(move |(x, y)| EmptyElement::at((x, y)) + Circle::new((12, 0), 4, color.filled()))
                    }
                };
            }
        }
    }

    if !chart.series.is_empty() {
        ctx.configure_series_labels()
            .position(legend_position(&all, &x_axis.range, &y_axis.range))
            .label_font((FONT, 15))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_chart(log_y: bool) -> Chart {
        let xs: Vec<f64> = (0..=20).map(|i| f64::from(i) * 0.05).collect();
        Chart {
            title: "Probability to break exclusivity".to_string(),
            x_label: "m/n".to_string(),
            y_label: "P(violation)".to_string(),
            log_y,
            series: vec![
                Series {
                    name: "n=32".to_string(),
                    points: xs.iter().map(|&x| (x, 1e-45f64.powf(1.0 - x))).collect(),
                    style: SeriesStyle::Line,
                },
                Series {
                    name: "n=8 (with zero)".to_string(),
                    points: xs.iter().map(|&x| (x, if x == 0.5 { 0.0 } else { 1e-11f64.powf(1.0 - x) })).collect(),
                    style: SeriesStyle::Dashed,
                },
                Series {
                    name: "measured".to_string(),
                    points: vec![(0.25, 1e-3), (0.5, -1.0), (0.75, 0.1), (f64::NAN, 1.0)],
                    style: SeriesStyle::Points,
                },
            ],
        }
    }

    #[test]
    fn svg_contains_title_and_series() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        for log_y in [true, false] {
            let path = dir.path().join(format!("chart-{log_y}.svg"));
            write_chart(&sample_chart(log_y), &path)?;
            let svg = std::fs::read_to_string(&path)?;
            assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
            for text in ["Probability to break exclusivity", "n=32", "n=8 (with zero)"] {
                assert!(svg.contains(text), "{text} missing");
            }
            assert!(svg.contains("measured"));
            if log_y {
                assert!(svg.contains("1e-45") || svg.contains("1e-40"));
            }
        }
        Ok(())
    }

    #[test]
    fn png_is_written() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sub/chart.png");
        write_chart(&sample_chart(true), &path)?;
        let bytes = std::fs::read(&path)?;
        assert!(bytes.starts_with(b"\x89PNG"));
        Ok(())
    }

    #[test]
    fn degenerate_charts_do_not_fail() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let empty = Chart {
            title: "empty".to_string(),
            x_label: "x".to_string(),
            y_label: "y".to_string(),
            log_y: true,
            series: vec![Series {
                name: "nothing positive".to_string(),
                points: vec![(1.0, 0.0), (2.0, -5.0)],
                style: SeriesStyle::Line,
            }],
        };
        write_chart(&empty, &dir.path().join("empty.svg"))?;
        let flat = Chart {
            log_y: false,
            series: vec![Series {
                name: "one point".to_string(),
                points: vec![(3.0, 7.0)],
                style: SeriesStyle::Points,
            }],
            ..empty.clone()
        };
        write_chart(&flat, &dir.path().join("flat.svg"))?;
        let none = Chart { series: vec![], ..empty };
        write_chart(&none, &dir.path().join("none.png"))?;
        Ok(())
    }

    #[test]
    fn unknown_extension_is_an_error() {
        let dir = std::env::temp_dir().join("sigma-plot-no-ext");
        assert!(write_chart(&sample_chart(false), &dir.join("chart.pdf")).is_err());
        assert!(write_chart(&sample_chart(false), &dir.join("chart")).is_err());
    }

    #[test]
    fn csv_round_trips() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("out/table.csv");
        let rows = vec![
            vec!["1".to_string(), "plain".to_string()],
            vec!["2".to_string(), "a, b".to_string()],
            vec!["3".to_string(), "say \"hi\"\nnext line".to_string()],
        ];
        write_csv(&path, &["n", "text"], &rows)?;
        let mut reader = csv::Reader::from_path(&path)?;
        assert_eq!(reader.headers()?, vec!["n", "text"]);
        let back: Vec<Vec<String>> =
            reader.records().map(|r| r.map(|r| r.iter().map(str::to_string).collect())).collect::<Result<_, _>>()?;
        assert_eq!(back, rows);
        let text = std::fs::read_to_string(&path)?;
        assert!(text.contains("\"a, b\""));
        Ok(())
    }

    #[test]
    fn csv_rejects_ragged_rows() {
        let path = std::env::temp_dir().join(format!("sigma-ragged-{}.csv", std::process::id()));
        let rows = vec![vec!["only one".to_string()]];
        assert!(write_csv(&path, &["a", "b"], &rows).is_err());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn tick_helpers() {
        assert_eq!(decade_label(-45.0), "1e-45");
        assert_eq!(decade_label(-2.0), "0.01");
        assert_eq!(decade_label(0.0), "1");
        assert_eq!(decade_label(3.0), "1000");
        let a = log_axis(-44.2, -0.3);
        assert!(a.range.start < -45.0 && a.range.start > -45.5, "{:?}", a.range);
        assert!(a.range.end > 0.0 && a.range.end < 0.5, "{:?}", a.range);
        assert!(a.major.len() <= 13 && a.major.contains(&-40.0));
        let l = linear_axis(0.0, 200.0, Pad::None);
        assert!(l.major.contains(&0.0) && l.major.contains(&200.0));
        assert_eq!(l.label(50.0), "50");
        let f = linear_axis(0.0, 0.3, Pad::None);
        assert_eq!(f.label(0.05), "0.05");
    }
}
