//! Line charts as PNG and SVG with plotters. Charts draw finished series and compute nothing;
//! text uses DejaVu Sans embedded in the binary (`assets/fonts`, Bitstream Vera licence), so no
//! system font library is needed.

use std::path::Path;
use std::sync::Once;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};

const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is compiled in and known to parse; a failure would only lose text.
        let _ = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT);
    });
}

/// One named line.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// `(x, y)` points in drawing order.
    pub points: Vec<(f64, f64)>,
    /// How the points are drawn.
    pub style: Style,
    /// Vertical error bars, `(lo, hi)` in y units for each point in order (e.g. a 95 %
    /// interval); empty: none. Drawn for marker series.
    pub y_bars: Vec<(f64, f64)>,
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A line with a marker at every point.
    LineMarkers,
    /// Markers only (a scatter).
    Markers,
    /// A thin dashed line without markers (a guide such as a Pareto frontier).
    Guide,
}

impl Series {
    /// A line through `points`.
    pub fn line(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
            style: Style::LineMarkers,
            y_bars: Vec::new(),
        }
    }
}

/// A line chart: title, axis labels with units, a caption naming model, machine and settings.
#[derive(Debug, Clone)]
pub struct LineChart {
    /// Title.
    pub title: String,
    /// Caption under the title (model, machine, settings).
    pub caption: String,
    /// x axis label with unit.
    pub x_label: String,
    /// y axis label with unit.
    pub y_label: String,
    /// Logarithmic x axis (e.g. context lengths 4k…128k).
    pub log_x: bool,
    /// Lines.
    pub series: Vec<Series>,
}

impl LineChart {
    /// Writes `<stem>.png` and `<stem>.svg` into `dir`. Errors: [`Error::Io`] when drawing or
    /// writing fails, naming the file.
    pub fn render(&self, dir: &Path, stem: &str) -> Result<()> {
        render_files(self, (1000, 640), dir, stem)
    }
}

/// A line chart's plotting area: f64 coordinates on both axes.
type Plot<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Series colours, in series order and then repeating (matplotlib's `tab10`).
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

/// A plotters drawing error as the message [`Draw::draw`] returns.
fn area_err<E: std::error::Error + Send + Sync>(x: DrawingAreaErrorKind<E>) -> String {
    x.to_string()
}

impl Draw for LineChart {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let body = header(root, &self.title, &self.caption, 70)?;
        let (x_range, y_range) = self.ranges();
        let mut chart = self.axes(&body, x_range, y_range)?;
        for (i, s) in self.series.iter().enumerate() {
            let c = PALETTE[i % PALETTE.len()];
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (self.tx(x), y)).collect();
            if s.style == Style::Markers {
                draw_markers(&mut chart, s, &pts, c, x_range)?;
            } else if s.style == Style::Guide {
                draw_guide(&mut chart, s, &pts)?;
            } else {
                draw_line(&mut chart, s, &pts, c)?;
            }
        }
        chart
            .configure_series_labels()
            .label_font((FAMILY, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(area_err)?;

        Ok(())
    }
}

impl LineChart {
    /// `x` on the drawn x axis. A log axis is drawn as log₂(x) on a linear axis, so ticks land
    /// on powers of two (4k, 8k, …, 128k for context lengths) and are labelled with the
    /// original values.
    fn tx(&self, x: f64) -> f64 {
        if self.log_x {
            x.log2()
        } else {
            x
        }
    }

    /// The axis ranges `((x0, x1), (y0, y1))`, x in drawn units ([`LineChart::tx`]). y spans
    /// every finite point and error bar, and 0, padded by 8 % (0 stays the bottom unless
    /// values are negative); x spans the points (1–2 without any), rounded out to whole powers
    /// of two on a log axis, else from 0 with 5 % room at the right.
    fn ranges(&self) -> ((f64, f64), (f64, f64)) {
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(move |p| self.tx(p.0)));
        let ys = self
            .series
            .iter()
            .flat_map(|s| {
                s.points
                    .iter()
                    .map(|p| p.1)
                    .chain(s.y_bars.iter().flat_map(|b| [b.0, b.1]))
            })
            .filter(|y| y.is_finite());
        let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
        let (ymin, ymax) = ys.fold((0f64, 0f64), |(a, b), y| (a.min(y), b.max(y)));
        let pad = (ymax - ymin) * 0.08 + 1e-9;
        let (y0, y1) = (if ymin < 0.0 { ymin - pad } else { 0.0 }, ymax + pad);
        let (x0, x1) = if x0.is_finite() && x1 > x0 {
            (x0, x1)
        } else {
            (1.0, 2.0)
        };
        // Linear axes start at zero (no exaggerated differences) and leave room at the right.
        let (x0, x1) = if self.log_x {
            (x0.floor(), x1.ceil())
        } else {
            (x0.min(0.0), x1 + 0.05 * (x1 - x0.min(0.0)))
        };
        ((x0, x1), (y0, y1))
    }

    /// The plotting area on `body` over `x` × `y` (drawn units), with its mesh drawn: 8 y
    /// ticks, 8 x ticks (one per power of two on a log axis), [`compact`] tick labels and the
    /// axis labels. Errors: plotters' drawing errors, as text.
    fn axes<'b, DB: DrawingBackend>(
        &self,
        body: &'b DrawingArea<DB, Shift>,
        (x0, x1): (f64, f64),
        (y0, y1): (f64, f64),
    ) -> std::result::Result<Plot<'b, DB>, String> {
        let log_x = self.log_x;
        let n_x_labels = if log_x { (x1 - x0) as usize + 1 } else { 8 };
        let label_x = move |x: &f64| compact(if log_x { x.exp2() } else { *x });
        let mut builder = ChartBuilder::on(body);
        builder
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80);
        let mut chart = builder
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(area_err)?;
        chart
            .configure_mesh()
            .x_labels(n_x_labels)
            .y_labels(8)
            .x_label_formatter(&label_x)
            .y_label_formatter(&|y: &f64| compact(*y))
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .label_style((FAMILY, 14))
            .axis_desc_style((FAMILY, 16))
            .draw()
            .map_err(area_err)?;
        Ok(chart)
    }
}

/// Draws `s` as markers at `pts` (drawn units) in colour `c`, with its legend entry and its
/// error bars: a vertical stroke lo..hi with caps 1 % of the x range `(x0, x1)` wide (plotters'
/// ErrorBar needs a feature this build leaves out); bars with a non-finite end are left out.
/// Errors: plotters' drawing errors, as text.
fn draw_markers<DB: DrawingBackend>(
    chart: &mut Plot<'_, DB>,
    s: &Series,
    pts: &[(f64, f64)],
    c: RGBColor,
    (x0, x1): (f64, f64),
) -> std::result::Result<(), String> {
    chart
        .draw_series(pts.iter().map(|&p| Circle::new(p, 6, c.filled())))
        .map_err(area_err)?
        .label(s.name.as_str())
        .legend(move |(x, y)| Circle::new((x + 10, y), 5, c.filled()));
    let cap = 0.01 * (x1 - x0);
    for (&(x, _), &(lo, hi)) in pts.iter().zip(&s.y_bars) {
        if !(lo.is_finite() && hi.is_finite()) {
            continue;
        }
        let paths = [
            vec![(x, lo), (x, hi)],
            vec![(x - cap, lo), (x + cap, lo)],
            vec![(x - cap, hi), (x + cap, hi)],
        ];
        chart
            .draw_series(
                paths
                    .into_iter()
                    .map(|p| PathElement::new(p, c.stroke_width(2))),
            )
            .map_err(area_err)?;
    }
    Ok(())
}

/// Draws `s` as a thin dark grey dashed guide through `pts` (drawn units), with its legend
/// entry. Errors: plotters' drawing errors, as text.
fn draw_guide<DB: DrawingBackend>(
    chart: &mut Plot<'_, DB>,
    s: &Series,
    pts: &[(f64, f64)],
) -> std::result::Result<(), String> {
    let grey = RGBColor(60, 60, 60);
    chart
        .draw_series(DashedLineSeries::new(
            pts.iter().copied(),
            6,
            4,
            grey.stroke_width(1),
        ))
        .map_err(area_err)?
        .label(s.name.as_str())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(1)));
    Ok(())
}

/// Draws `s` as a line through `pts` (drawn units) in colour `c` with a marker at every point,
/// with its legend entry. Errors: plotters' drawing errors, as text.
fn draw_line<DB: DrawingBackend>(
    chart: &mut Plot<'_, DB>,
    s: &Series,
    pts: &[(f64, f64)],
    c: RGBColor,
) -> std::result::Result<(), String> {
    chart
        .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
        .map_err(area_err)?
        .label(s.name.as_str())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    chart
        .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
        .map_err(area_err)?;
    Ok(())
}

/// A grid of heat-map panels, one per series (e.g. passkey accuracy per scheme: rows are
/// lengths, columns depths), values 0–100 coloured from red (0) to green (100) and printed in
/// each cell.
#[derive(Debug, Clone)]
pub struct HeatMap {
    /// Title.
    pub title: String,
    /// Caption under the title (model, machine, settings).
    pub caption: String,
    /// Row axis label with unit (drawn on each panel's left).
    pub row_label: String,
    /// Column axis label with unit (drawn under each panel).
    pub col_label: String,
    /// Row names, top to bottom.
    pub rows: Vec<String>,
    /// Column names, left to right.
    pub cols: Vec<String>,
    /// One panel per entry: name and `values[row][col]` (`None`: not measured).
    pub panels: Vec<(String, Vec<Vec<Option<f64>>>)>,
}

impl HeatMap {
    /// Writes `<stem>.png` and `<stem>.svg` into `dir`. Errors: [`Error::Io`] naming the file.
    pub fn render(&self, dir: &Path, stem: &str) -> Result<()> {
        let (_, panel_rows) = self.layout();
        render_files(self, (1000, 90 + 300 * panel_rows as u32), dir, stem)
    }

    /// Panels per row and rows of panels (at most 3 per row).
    fn layout(&self) -> (usize, usize) {
        let per_row = self.panels.len().clamp(1, 3);
        (per_row, self.panels.len().div_ceil(per_row).max(1))
    }
}

impl Draw for HeatMap {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let (per_row, panel_rows) = self.layout();
        let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
        let body = header(root, &self.title, &self.caption, 80)?;
        let areas = body.split_evenly((panel_rows, per_row));
        let (nr, nc) = (self.rows.len().max(1) as i32, self.cols.len().max(1) as i32);
        for ((name, values), area) in self.panels.iter().zip(areas) {
            let (w, h) = area.dim_in_pixel();
            let (left, top_px, bottom) = (70i32, 28i32, 44i32);
            let cw = (w as i32 - left - 12) / nc;
            let ch = (h as i32 - top_px - bottom) / nr;
            area.draw(&Text::new(
                name.as_str(),
                (left, 6),
                (FAMILY, 16).into_font(),
            ))
            .map_err(e)?;
            for (r, row) in values.iter().enumerate() {
                for (c, v) in row.iter().enumerate() {
                    let (x0, y0) = (left + c as i32 * cw, top_px + r as i32 * ch);
                    let fill = match v {
                        Some(v) => {
                            let t = (v / 100.0).clamp(0.0, 1.0);
                            RGBColor(
                                (215.0 * (1.0 - t) + 40.0 * t) as u8,
                                (48.0 * (1.0 - t) + 160.0 * t) as u8,
                                (39.0 * (1.0 - t) + 70.0 * t) as u8,
                            )
                        }
                        None => RGBColor(220, 220, 220),
                    };
                    area.draw(&Rectangle::new(
                        [(x0, y0), (x0 + cw - 2, y0 + ch - 2)],
                        fill.filled(),
                    ))
                    .map_err(e)?;
                    let text = v.map_or("-".to_string(), |v| format!("{v:.0}%"));
                    area.draw(&Text::new(
                        text,
                        (x0 + cw / 2 - 14, y0 + ch / 2 - 8),
                        (FAMILY, 15).into_font().color(&WHITE),
                    ))
                    .map_err(e)?;
                }
            }
            for (r, label) in self.rows.iter().enumerate() {
                area.draw(&Text::new(
                    label.as_str(),
                    (8, top_px + r as i32 * ch + ch / 2 - 8),
                    (FAMILY, 13).into_font(),
                ))
                .map_err(e)?;
            }
            for (c, label) in self.cols.iter().enumerate() {
                area.draw(&Text::new(
                    label.as_str(),
                    (left + c as i32 * cw + cw / 2 - 12, top_px + nr * ch + 4),
                    (FAMILY, 13).into_font(),
                ))
                .map_err(e)?;
            }
            area.draw(&Text::new(
                format!("rows: {} · columns: {}", self.row_label, self.col_label),
                (left, top_px + nr * ch + 22),
                (FAMILY, 12).into_font().color(&RGBColor(90, 90, 90)),
            ))
            .map_err(e)?;
        }
        Ok(())
    }
}

/// Clears `root`, draws the title and the caption in its top `height` pixels, and returns the
/// area below them.
fn header<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    caption: &str,
    height: u32,
) -> std::result::Result<DrawingArea<DB, Shift>, String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (top, body) = root.split_vertically(height);
    top.draw(&Text::new(title, (20, 10), (FAMILY, 24).into_font()))
        .map_err(e)?;
    top.draw(&Text::new(
        caption,
        (20, 43),
        (FAMILY, 14).into_font().color(&RGBColor(90, 90, 90)),
    ))
    .map_err(e)?;
    Ok(body)
}

/// A chart that can draw itself on any plotters backend.
trait Draw {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String>;
}

/// Writes `<stem>.png` and `<stem>.svg` of `size` pixels into `dir`. Errors: [`Error::Io`]
/// naming the file when drawing or writing fails.
fn render_files(chart: &impl Draw, size: (u32, u32), dir: &Path, stem: &str) -> Result<()> {
    register_font();
    let png = dir.join(format!("{stem}.png"));
    let svg = dir.join(format!("{stem}.svg"));
    let draw_err = |p: &Path, e: String| Error::io(p, std::io::Error::other(e));
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        chart.draw(&root).map_err(|e| draw_err(&png, e))?;
        root.present().map_err(|e| draw_err(&png, e.to_string()))?;
    }
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        chart.draw(&root).map_err(|e| draw_err(&svg, e))?;
        root.present().map_err(|e| draw_err(&svg, e.to_string()))?;
    }
    Ok(())
}

/// Tick labels: `4k`, `128k`, `1.5M` for large values (k = 1024, as token counts), plain
/// numbers otherwise.
fn compact(v: f64) -> String {
    let trim = |x: String| x.trim_end_matches('0').trim_end_matches('.').to_string();
    let a = v.abs();
    if a >= 1024.0 * 1024.0 {
        format!("{}M", trim(format!("{:.3}", v / (1024.0 * 1024.0))))
    } else if a >= 1024.0 {
        format!("{}k", trim(format!("{:.1}", v / 1024.0)))
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both files are produced, non-empty, and the SVG holds one line per series (plus its
    /// legend mark) and the title text.
    #[test]
    fn compact_tick_labels() {
        assert_eq!(compact(4096.0), "4k");
        assert_eq!(compact(131072.0), "128k");
        assert_eq!(compact(1536.0), "1.5k");
        assert_eq!(compact(3.0 * 1024.0 * 1024.0), "3M");
        assert_eq!(compact(250.0), "250");
    }

    #[test]
    fn renders_png_and_svg_with_every_series() {
        let dir = std::env::temp_dir().join(format!("kvbench-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chart = LineChart {
            title: "Max concurrent sequences".into(),
            caption: "llama-3-8b · 80 GiB".into(),
            x_label: "context (tokens)".into(),
            y_label: "sequences".into(),
            log_x: true,
            series: ["fp16", "fp8", "int4"]
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    Series::line(
                        *n,
                        vec![
                            (4096.0, 100.0 * (i + 1) as f64),
                            (131072.0, 3.0 * (i + 1) as f64),
                        ],
                    )
                })
                .collect(),
        };
        chart.render(&dir, "c").unwrap();
        assert!(std::fs::metadata(dir.join("c.png")).unwrap().len() > 5_000);
        let svg = std::fs::read_to_string(dir.join("c.svg")).unwrap();
        // Each series: its line and its legend mark in its own colour; no fourth colour.
        for hex in ["#1F77B4", "#FF7F0E", "#2CA02C"] {
            assert_eq!(
                svg.matches(&format!("stroke=\"{hex}\"")).count(),
                2,
                "{hex}"
            );
        }
        assert_eq!(svg.matches("stroke=\"#D62728\"").count(), 0);
        assert!(svg.contains("Max concurrent sequences"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
