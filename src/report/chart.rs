//! Line charts as PNG and SVG with plotters. Charts draw finished series and compute nothing
//! but their geometry: axis ranges and round ticks ([`super::ticks`]), a legend to the right of
//! the plot area, one colour and marker shape per series. Text uses DejaVu Sans embedded in the
//! binary (`assets/fonts`, Bitstream Vera licence), so no system font library is needed.

use std::ops::Range;
use std::path::Path;
use std::sync::Once;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::ticks::{self, Ticks};
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

/// One named line or scatter.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// `(x, y)` points in drawing order, data units of the chart's axes.
    pub points: Vec<(f64, f64)>,
    /// How the points are drawn.
    pub style: Style,
    /// Vertical error bars, `(lo, hi)` in y units for each point in order (e.g. a 95 %
    /// interval); empty: none; a bar with a non-finite end is left out. Drawn for
    /// [`Style::LineMarkers`] and [`Style::Markers`].
    pub y_bars: Vec<(f64, f64)>,
    /// Whether each point, in order, is drawn hollow (e.g. timed while other processes kept
    /// the machine busy: `contended`); points past the end are filled.
    pub hollow: Vec<bool>,
    /// Marker radius of each point in order, pixels (a third quantity, e.g. KV bytes per
    /// token); empty or past the end: the style's default (5, 6 for a scatter).
    pub sizes: Vec<f64>,
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
    /// A step line without markers: each value holds until the next point's x (a count over
    /// time, such as running sequences).
    Steps,
}

impl Series {
    /// A line with markers through `points` (data units), no error bars, every point filled.
    pub fn line(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
            style: Style::LineMarkers,
            y_bars: Vec::new(),
            hollow: Vec::new(),
            sizes: Vec::new(),
        }
    }

    /// This series with marker radii `sizes` (pixels), one per point in order.
    pub fn with_sizes(mut self, sizes: Vec<f64>) -> Self {
        self.sizes = sizes;
        self
    }

    /// This series drawn as `style`.
    pub fn with_style(mut self, style: Style) -> Self {
        self.style = style;
        self
    }

    /// This series with error bars `(lo, hi)` (y units), one per point in order.
    pub fn with_bars(mut self, y_bars: Vec<(f64, f64)>) -> Self {
        self.y_bars = y_bars;
        self
    }

    /// This series with point `i` drawn hollow where `hollow[i]` is true.
    pub fn with_hollow(mut self, hollow: Vec<bool>) -> Self {
        self.hollow = hollow;
        self
    }

    fn is_hollow(&self, i: usize) -> bool {
        self.hollow.get(i).copied().unwrap_or(false)
    }
}

/// One axis of a line chart: its label and how values are placed and ticked.
#[derive(Debug, Clone)]
pub struct Axis {
    /// Label with unit.
    pub label: String,
    /// Logarithmic (e.g. context lengths 4k…128k, counts spanning decades); values ≤ 0 are
    /// left out.
    pub log: bool,
    /// Round ticks in 1, 2, 5 × 10^k steps or powers of two.
    pub ticks: Ticks,
}

impl Axis {
    /// A linear axis with decimal ticks (ms, requests/s, tokens/s, %, bytes).
    pub fn decimal(label: impl Into<String>) -> Self {
        Axis {
            label: label.into(),
            log: false,
            ticks: Ticks::Decimal,
        }
    }

    /// A linear axis ticked in powers of two and labelled with k = 1024 (tokens, batch sizes,
    /// sequences).
    pub fn binary(label: impl Into<String>) -> Self {
        Axis {
            ticks: Ticks::Binary,
            ..Axis::decimal(label)
        }
    }

    /// This axis on a log scale when `log` is true.
    pub fn log_if(mut self, log: bool) -> Self {
        self.log = log;
        self
    }
}

/// A line chart: title, axes with units, a caption naming model, machine and settings.
#[derive(Debug, Clone)]
pub struct LineChart {
    /// Title.
    pub title: String,
    /// Caption under the title (model, machine, settings).
    pub caption: String,
    /// The x axis.
    pub x: Axis,
    /// The y axis.
    pub y: Axis,
    /// Lines.
    pub series: Vec<Series>,
}

/// Chart size in pixels, and the legend column's width at its right.
const SIZE: (u32, u32) = (1000, 640);
const LEGEND_W: u32 = 250;

impl LineChart {
    /// Writes `<stem>.png` and `<stem>.svg` (1000 × 640 pixels) into `dir`. Errors:
    /// [`Error::Io`] when drawing or writing fails, naming the file.
    pub fn render(&self, dir: &Path, stem: &str) -> Result<()> {
        render_files(self, SIZE, dir, stem)
    }

    /// The chart as SVG text (1000 × 640 pixels), as [`LineChart::render`] writes it; for
    /// tests that check geometry. Panics when plotters fails to draw.
    #[cfg(test)]
    pub(crate) fn svg(&self) -> String {
        register_font();
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
            self.draw(&root).unwrap();
            root.present().unwrap();
        }
        out
    }
}

/// One axis as drawn: its range in drawn units (log₂ of the value on a log axis) and the ticks
/// labelled there, `(position in drawn units, label)`.
#[derive(Debug, Clone)]
struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    ticks: Vec<(f64, String)>,
}

/// Which way an axis is padded: x leaves room at the right, y starts at zero.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    X,
    Y,
}

impl Scale {
    /// The scale of `axis` holding `values` (data units; non-finite ones, and those ≤ 0 on a
    /// log axis, are ignored). Log: out to whole powers ([`ticks::log_range`]; one value `v`:
    /// `v/2 … 2v`), 3 % room either side. Linear x: from 0 (or the least value, if negative)
    /// to 5 % past the largest; one value `v`: `v ± 50 %` (±1 for 0), so it sits in the middle;
    /// none: 0–1. Linear y: from 0 (or 8 % below a negative least value) to 8 % above the
    /// largest; all zero: 0–1.
    fn new(axis: &Axis, values: impl Iterator<Item = f64>, role: Role) -> Scale {
        let (min, max) = values
            .filter(|v| v.is_finite() && (!axis.log || *v > 0.0))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(v), b.max(v))
            });
        let kind = axis.ticks;
        if axis.log {
            let (lo, hi) = if min > max {
                (1.0, 2.0)
            } else {
                ticks::log_range(min, max, kind)
            };
            let pad = 0.03 * (hi.log2() - lo.log2());
            return Scale {
                lo: lo.log2() - pad,
                hi: hi.log2() + pad,
                log: true,
                ticks: ticks::log(lo, hi, kind)
                    .into_iter()
                    .map(|v| (v.log2(), ticks::label(v, v, kind)))
                    .collect(),
            };
        }
        let (lo, hi) = match role {
            _ if min > max => (0.0, 1.0),
            Role::X if min == max => {
                let half = if min == 0.0 { 1.0 } else { 0.5 * min.abs() };
                (min - half, min + half)
            }
            Role::X => {
                let lo = min.min(0.0);
                (lo, max + 0.05 * (max - lo))
            }
            Role::Y => {
                let (a, b) = (min.min(0.0), max.max(0.0));
                let pad = 0.08 * (b - a);
                match (a < 0.0, b > 0.0) {
                    (false, false) => (0.0, 1.0),
                    (neg, pos) => (
                        if neg { a - pad } else { 0.0 },
                        if pos { b + pad } else { 0.0 },
                    ),
                }
            }
        };
        let (t, step) = ticks::linear(lo, hi, kind);
        Scale {
            lo,
            hi,
            log: false,
            ticks: t
                .into_iter()
                .map(|v| (v, ticks::label(v, step, kind)))
                .collect(),
        }
    }

    /// `v` (data units) in drawn units; `None` where the axis cannot show it (not finite, or
    /// ≤ 0 on a log axis).
    fn place(&self, v: f64) -> Option<f64> {
        match (v.is_finite(), self.log) {
            (true, true) if v > 0.0 => Some(v.log2()),
            (true, false) => Some(v),
            _ => None,
        }
    }

    /// The label of the tick nearest `v` (drawn units).
    fn label_at(&self, v: f64) -> String {
        self.ticks
            .iter()
            .min_by(|a, b| (a.0 - v).abs().total_cmp(&(b.0 - v).abs()))
            .map_or_else(String::new, |t| t.1.clone())
    }
}

impl Ranged for Scale {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let t = (v - self.lo) / (self.hi - self.lo);
        limit.0 + ((limit.1 - limit.0) as f64 * t).round() as i32
    }

    /// The ticks for bold lines and labels; no light lines (the mesh asks for those with a
    /// hint that allows them).
    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            return Vec::new();
        }
        self.ticks.iter().map(|t| t.0).collect()
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// A line chart's plotting area: both axes in drawn units.
type Plot<'a, DB> = ChartContext<'a, DB, Cartesian2d<Scale, Scale>>;

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

/// Marker shapes, so that series differ in more than colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Circle,
    Triangle,
    Square,
    Cross,
    Diamond,
}

const SHAPES: [Shape; 5] = [
    Shape::Circle,
    Shape::Triangle,
    Shape::Square,
    Shape::Cross,
    Shape::Diamond,
];

/// Series `i`'s colour and marker shape: the palette in order, the shapes in order, shifted
/// by one each time the palette repeats so that no two of the first 50 series look alike.
fn look(i: usize) -> (RGBColor, Shape) {
    (
        PALETTE[i % PALETTE.len()],
        SHAPES[(i + i / PALETTE.len()) % SHAPES.len()],
    )
}

impl Shape {
    /// The outline of a polygon shape of radius `r` pixels around (0, 0); empty for a circle.
    fn outline(self, r: i32) -> Vec<(i32, i32)> {
        let (s, w) = (r * 9 / 10, (r / 3).max(1));
        match self {
            Shape::Circle => Vec::new(),
            Shape::Triangle => vec![(0, -r - 1), (r + 1, r * 3 / 4), (-r - 1, r * 3 / 4)],
            Shape::Square => vec![(-s, -s), (s, -s), (s, s), (-s, s)],
            Shape::Diamond => vec![(0, -r - 1), (r + 1, 0), (0, r + 1), (-r - 1, 0)],
            Shape::Cross => vec![
                (-w, -r),
                (w, -r),
                (w, -w),
                (r, -w),
                (r, w),
                (w, w),
                (w, r),
                (-w, r),
                (-w, w),
                (-r, w),
                (-r, -w),
                (-w, -w),
            ],
        }
    }
}

/// Draws a marker of `shape`, radius `r` pixels, centred on pixel `at` of `area`, in colour
/// `c`: filled, or hollow (white inside, a 2-pixel outline). Errors: plotters' drawing errors,
/// as text.
fn marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    at: (i32, i32),
    (c, shape): (RGBColor, Shape),
    r: i32,
    filled: bool,
) -> std::result::Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    if shape == Shape::Circle {
        if filled {
            return area.draw(&Circle::new(at, r, c.filled())).map_err(e);
        }
        area.draw(&Circle::new(at, r, WHITE.filled())).map_err(e)?;
        return area.draw(&Circle::new(at, r, c.stroke_width(2))).map_err(e);
    }
    let pts: Vec<(i32, i32)> = shape
        .outline(r)
        .into_iter()
        .map(|(dx, dy)| (at.0 + dx, at.1 + dy))
        .collect();
    if filled {
        return area.draw(&Polygon::new(pts, c.filled())).map_err(e);
    }
    area.draw(&Polygon::new(pts.clone(), WHITE.filled()))
        .map_err(e)?;
    let mut closed = pts;
    closed.push(closed[0]);
    area.draw(&PathElement::new(closed, c.stroke_width(2)))
        .map_err(e)
}

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
        let (w, _) = body.dim_in_pixel();
        let (plot_area, legend_area) = body.split_horizontally(w.saturating_sub(LEGEND_W));
        self.plot(&plot_area, root)?;
        self.legend(&legend_area)
    }
}

impl LineChart {
    /// The axes and every series on `area` (markers drawn on `root`, the backend's whole
    /// area, in pixel coordinates). Errors: plotters' drawing errors, as text.
    fn plot<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let xs = Scale::new(
            &self.x,
            self.series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0)),
            Role::X,
        );
        let ys = Scale::new(
            &self.y,
            self.series.iter().flat_map(|s| {
                let bars = s.y_bars.iter().flat_map(|b| [b.0, b.1]);
                s.points.iter().map(|p| p.1).chain(bars)
            }),
            Role::Y,
        );
        let mut chart = self.axes(area, &xs, &ys)?;
        for (i, s) in self.series.iter().enumerate() {
            draw_series(&mut chart, root, s, look(i))?;
        }
        Ok(())
    }
}

/// Line charts side by side under one title, sharing one legend (the first panel's series:
/// every panel lists the same series in the same order, empty where a panel has no point, so
/// a series has one colour and shape throughout), e.g. one panel per (batch, prompt) slice.
#[derive(Debug, Clone)]
pub struct Panels {
    /// Title.
    pub title: String,
    /// Caption under the title (model, machine, settings).
    pub caption: String,
    /// `(panel name, chart)`; each chart's own title and caption are not drawn.
    pub panels: Vec<(String, LineChart)>,
    /// A line under the legend (e.g. what marker size means).
    pub note: String,
}

impl Panels {
    /// Writes `<stem>.png` and `<stem>.svg` (1000 pixels wide, 420 per row of at most two
    /// panels, plus the header) into `dir`. Errors: [`Error::Io`] naming the file.
    pub fn render(&self, dir: &Path, stem: &str) -> Result<()> {
        render_files(self, self.size(), dir, stem)
    }

    fn size(&self) -> (u32, u32) {
        (1000 + LEGEND_W, 80 + 420 * self.rows() as u32)
    }

    fn rows(&self) -> usize {
        self.panels.len().div_ceil(2).max(1)
    }

    /// The chart as SVG text, as [`Panels::render`] writes it; for tests that check
    /// geometry. Panics when plotters fails to draw.
    #[cfg(test)]
    pub(crate) fn svg(&self) -> String {
        register_font();
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, self.size()).into_drawing_area();
            self.draw(&root).unwrap();
            root.present().unwrap();
        }
        out
    }
}

impl Draw for Panels {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
        let body = header(root, &self.title, &self.caption, 70)?;
        let (w, _) = body.dim_in_pixel();
        let (grid, legend_area) = body.split_horizontally(w.saturating_sub(LEGEND_W));
        let per_row = self.panels.len().clamp(1, 2);
        let areas = grid.split_evenly((self.rows(), per_row));
        for ((name, chart), area) in self.panels.iter().zip(areas) {
            let (top, plot) = area.split_vertically(26);
            top.draw(&Text::new(name.as_str(), (90, 6), (FAMILY, 16).into_font()))
                .map_err(e)?;
            chart.plot(&plot, root)?;
        }
        if let Some((_, first)) = self.panels.first() {
            first.legend(&legend_area)?;
            let y = 34 + 22 * (first.series.len() as i32 + 1);
            for (k, line) in self.note.split('\n').enumerate() {
                legend_area
                    .draw(&Text::new(
                        line,
                        (8, y + 18 * k as i32),
                        (FAMILY, 12).into_font().color(&RGBColor(90, 90, 90)),
                    ))
                    .map_err(e)?;
            }
        }
        Ok(())
    }
}

impl LineChart {
    /// The plotting area on `area` over the scales `xs` × `ys`, with its mesh drawn: a bold
    /// grid line and a label at every tick, no light lines, and the axis labels. Errors:
    /// plotters' drawing errors, as text.
    fn axes<'b, DB: DrawingBackend>(
        &self,
        area: &'b DrawingArea<DB, Shift>,
        xs: &Scale,
        ys: &Scale,
    ) -> std::result::Result<Plot<'b, DB>, String> {
        let mut chart = ChartBuilder::on(area)
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(xs.clone(), ys.clone())
            .map_err(area_err)?;
        let label_x = |v: &f64| xs.label_at(*v);
        let label_y = |v: &f64| ys.label_at(*v);
        chart
            .configure_mesh()
            .x_labels(xs.ticks.len().max(1))
            .y_labels(ys.ticks.len().max(1))
            .max_light_lines(0)
            .x_label_formatter(&label_x)
            .y_label_formatter(&label_y)
            .x_desc(self.x.label.as_str())
            .y_desc(self.y.label.as_str())
            .label_style((FAMILY, 14))
            .axis_desc_style((FAMILY, 16))
            .draw()
            .map_err(area_err)?;
        Ok(chart)
    }

    /// The legend in `area` (right of the plot, so it never covers a point): per series its
    /// line sample and marker in its colour and shape, then its name; a hollow grey circle
    /// "contended" entry when any point is drawn hollow. Errors: plotters' drawing errors.
    fn legend<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
        let font = (FAMILY, 13).into_font();
        let mut y = 34;
        for (i, s) in self.series.iter().enumerate() {
            let (c, shape) = look(i);
            let line = |style: ShapeStyle, xs: &[(i32, i32)]| {
                area.draw(&PathElement::new(
                    xs.iter().map(|&(a, b)| (a, y + b)).collect::<Vec<_>>(),
                    style,
                ))
            };
            match s.style {
                Style::Guide => {
                    let grey = RGBColor(60, 60, 60).stroke_width(1);
                    line(grey, &[(4, 0), (14, 0)]).map_err(e)?;
                    line(grey, &[(20, 0), (30, 0)]).map_err(e)?;
                }
                Style::Steps => {
                    line(c.stroke_width(2), &[(4, 4), (17, 4), (17, -4), (30, -4)]).map_err(e)?
                }
                Style::LineMarkers => line(c.stroke_width(2), &[(4, 0), (30, 0)]).map_err(e)?,
                Style::Markers => {}
            }
            if matches!(s.style, Style::LineMarkers | Style::Markers) {
                marker(area, (17, y), (c, shape), 5, true)?;
            }
            area.draw(&Text::new(s.name.as_str(), (38, y - 8), font.clone()))
                .map_err(e)?;
            y += 22;
        }
        if self.series.iter().any(|s| s.hollow.contains(&true)) {
            let grey = (RGBColor(90, 90, 90), Shape::Circle);
            marker(area, (17, y + 8), grey, 5, false)?;
            area.draw(&Text::new("hollow: contended", (38, y), font))
                .map_err(e)?;
        }
        Ok(())
    }
}

/// Draws `s` on `chart` in `look`'s colour and shape: its line (solid, stepped or a dashed
/// grey guide), its error bars, then its markers on `root` (the backend's whole area, pixel
/// coordinates), hollow where [`Series::hollow`] says. Points an axis cannot show are left
/// out. Errors: plotters' drawing errors, as text.
fn draw_series<DB: DrawingBackend>(
    chart: &mut Plot<'_, DB>,
    root: &DrawingArea<DB, Shift>,
    s: &Series,
    look: (RGBColor, Shape),
) -> std::result::Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    let (xscale, yscale) = {
        let coord = chart.as_coord_spec();
        (coord.x_spec().clone(), coord.y_spec().clone())
    };
    let pts: Vec<(usize, (f64, f64))> = s
        .points
        .iter()
        .enumerate()
        .filter_map(|(i, &(x, y))| Some((i, (xscale.place(x)?, yscale.place(y)?))))
        .collect();
    let path: Vec<(f64, f64)> = pts.iter().map(|p| p.1).collect();
    let c = look.0;
    match s.style {
        Style::Guide => {
            let grey = RGBColor(60, 60, 60);
            chart
                .draw_series(DashedLineSeries::new(path, 6, 4, grey.stroke_width(1)))
                .map_err(area_err)?;
        }
        Style::Steps => {
            let steps = path.windows(2).flat_map(|w| [w[0], (w[1].0, w[0].1)]);
            let steps: Vec<(f64, f64)> = steps.chain(path.last().copied()).collect();
            chart
                .draw_series(LineSeries::new(steps, c.stroke_width(2)))
                .map_err(area_err)?;
        }
        Style::LineMarkers => {
            chart
                .draw_series(LineSeries::new(path, c.stroke_width(2)))
                .map_err(area_err)?;
        }
        Style::Markers => {}
    }
    if !matches!(s.style, Style::LineMarkers | Style::Markers) {
        return Ok(());
    }
    // Error bars: a vertical stroke lo..hi with 10-pixel caps (plotters' ErrorBar needs a
    // feature this build leaves out); on a log axis a low end ≤ 0 runs to the axis bottom.
    for &(i, (x, _)) in &pts {
        let Some(&(lo, hi)) = s.y_bars.get(i) else {
            continue;
        };
        let Some(hi) = yscale.place(hi) else { continue };
        let lo = match yscale.place(lo) {
            Some(lo) => lo,
            None if lo.is_finite() => yscale.lo,
            None => continue,
        };
        let (a, b) = (chart.backend_coord(&(x, lo)), chart.backend_coord(&(x, hi)));
        let style = c.stroke_width(2);
        for p in [
            vec![a, b],
            vec![(a.0 - 5, a.1), (a.0 + 5, a.1)],
            vec![(b.0 - 5, b.1), (b.0 + 5, b.1)],
        ] {
            root.draw(&PathElement::new(p, style)).map_err(e)?;
        }
    }
    let r = if s.style == Style::Markers { 6 } else { 5 };
    for &(i, p) in &pts {
        let r = s.sizes.get(i).map_or(r, |&v| v.round() as i32);
        marker(root, chart.backend_coord(&p), look, r, !s.is_hollow(i))?;
    }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Both files are produced, non-empty, and the SVG holds one line per series plus its
    /// legend mark, each in its own colour, and the title text.
    #[test]
    fn renders_png_and_svg_with_every_series() {
        let dir = std::env::temp_dir().join(format!("kvbench-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chart = LineChart {
            title: "Max concurrent sequences".into(),
            caption: "llama-3-8b · 80 GiB".into(),
            x: Axis::binary("context (tokens)").log_if(true),
            y: Axis::binary("sequences"),
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

    /// Geometry read back from an SVG that plotters wrote: texts, circles, polylines and
    /// polygons with their attributes, so tests check pixels without the code's own mapping.
    pub(crate) mod svg {
        /// `attr="value"` of an element's opening text.
        fn attr<'a>(el: &'a str, name: &str) -> Option<&'a str> {
            let start = el.find(&format!(" {name}=\""))? + name.len() + 3;
            Some(&el[start..start + el[start..].find('"')?])
        }

        fn num(el: &str, name: &str) -> f64 {
            attr(el, name)
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN)
        }

        /// Every element `<tag …>` as its opening text (to the first `>`).
        fn elements<'a>(svg: &'a str, tag: &str) -> Vec<&'a str> {
            svg.match_indices(&format!("<{tag} "))
                .map(|(i, _)| &svg[i..i + svg[i..].find('>').unwrap()])
                .collect()
        }

        /// Texts as `(x, y, anchor, content)`.
        pub fn texts(svg: &str) -> Vec<(f64, f64, String, String)> {
            elements(svg, "text")
                .into_iter()
                .map(|el| {
                    let i = svg.find(el).unwrap() + el.len() + 1;
                    let body = &svg[i..i + svg[i..].find("</text>").unwrap()];
                    (
                        num(el, "x"),
                        num(el, "y"),
                        attr(el, "text-anchor").unwrap_or("").to_string(),
                        body.trim().to_string(),
                    )
                })
                .collect()
        }

        /// Circles as `(cx, cy, fill, stroke)`.
        pub fn circles(svg: &str) -> Vec<(f64, f64, String, String)> {
            elements(svg, "circle")
                .into_iter()
                .map(|el| {
                    let a = |n| attr(el, n).unwrap_or("").to_string();
                    (num(el, "cx"), num(el, "cy"), a("fill"), a("stroke"))
                })
                .collect()
        }

        /// Polylines (`stroke`) or polygons (`fill`) as `(colour, points)`.
        pub fn shapes(svg: &str, tag: &str) -> Vec<(String, Vec<(f64, f64)>)> {
            let colour = if tag == "polygon" { "fill" } else { "stroke" };
            elements(svg, tag)
                .into_iter()
                .map(|el| {
                    let pts = attr(el, "points")
                        .unwrap_or("")
                        .split_whitespace()
                        .map(|p| {
                            let (x, y) = p.split_once(',').unwrap();
                            (x.parse().unwrap(), y.parse().unwrap())
                        })
                        .collect();
                    (attr(el, colour).unwrap_or("").to_string(), pts)
                })
                .collect()
        }

        /// The x axis line's ends in pixels `(left, right)`: the longest black horizontal
        /// polyline (the plot area's width).
        pub fn x_axis(svg: &str) -> (f64, f64) {
            shapes(svg, "polyline")
                .into_iter()
                .filter(|(c, p)| c == "#000000" && p.len() == 2 && p[0].1 == p[1].1)
                .map(|(_, p)| (p[0].0, p[1].0))
                .max_by(|a, b| (a.1 - a.0).total_cmp(&(b.1 - b.0)))
                .unwrap()
        }

        /// The tick labels under the x axis (centred texts below y = 570 px… of the plot) as
        /// `(pixel x, label)`, left to right.
        pub fn x_ticks(svg: &str) -> Vec<(f64, String)> {
            let axis_y = shapes(svg, "polyline")
                .into_iter()
                .filter(|(c, p)| c == "#000000" && p.len() == 2 && p[0].1 == p[1].1)
                .max_by(|a, b| (a.1[1].0 - a.1[0].0).total_cmp(&(b.1[1].0 - b.1[0].0)))
                .unwrap()
                .1[0]
                .1;
            texts(svg)
                .into_iter()
                .filter(|t| t.2 == "middle" && t.1 > axis_y && t.1 < axis_y + 20.0)
                .map(|t| (t.0, t.3))
                .collect()
        }

        /// The tick labels left of the y axis (right-aligned texts) as `(pixel y, label)`,
        /// bottom to top.
        pub fn y_ticks(svg: &str) -> Vec<(f64, String)> {
            texts(svg)
                .into_iter()
                .filter(|t| t.2 == "end")
                .map(|t| (t.1, t.3))
                .collect()
        }

        /// Pixel of `v` on an axis from two of its labelled ticks `(pixel, value)`
        /// (linear interpolation; pass log₂ values for a log axis).
        pub fn pixel(v: f64, (p0, v0): (f64, f64), (p1, v1): (f64, f64)) -> f64 {
            p0 + (v - v0) / (v1 - v0) * (p1 - p0)
        }
    }

    fn one_series(x: Axis, y: Axis, points: Vec<(f64, f64)>) -> LineChart {
        LineChart {
            title: "t".into(),
            caption: "c".into(),
            x,
            y,
            series: vec![Series::line("a", points)],
        }
    }

    /// The data markers of series 0 (filled circles left of the legend).
    fn filled_markers(svg: &str, fill: &str) -> Vec<(f64, f64)> {
        let (_, right) = svg::x_axis(svg);
        svg::circles(svg)
            .into_iter()
            .filter(|c| c.2 == fill && c.0 <= right + 6.0)
            .map(|c| (c.0, c.1))
            .collect()
    }

    /// Issue #26: with one x value (128 tokens, 4 requests/s, a 32k context on a log axis,
    /// 0) the axis ran 0–2 and the point sat at its right edge. Now the point is in the middle
    /// of the plot area and the axis labels its value.
    #[test]
    fn one_x_value_sits_mid_plot_issue_26() {
        for (x, axis, label) in [
            (128.0, Axis::binary("tokens"), "128"),
            (4.0, Axis::decimal("requests/s"), "4.0"),
            (32768.0, Axis::binary("context").log_if(true), "32k"),
            (0.0, Axis::decimal("x"), "0.0"),
        ] {
            let svg = one_series(axis, Axis::decimal("ms"), vec![(x, 20.0)]).svg();
            let (left, right) = svg::x_axis(&svg);
            let pts = filled_markers(&svg, "#1F77B4");
            assert_eq!(pts.len(), 1, "{x}");
            assert!(
                (pts[0].0 - (left + right) / 2.0).abs() <= 1.0,
                "{x}: point at {} px, plot {left}–{right}",
                pts[0].0
            );
            let ticks = svg::x_ticks(&svg);
            let t = ticks.iter().find(|t| t.1 == label);
            assert!(
                t.is_some_and(|t| (t.0 - pts[0].0).abs() <= 1.0),
                "{x}: {ticks:?}"
            );
        }
    }

    /// Points land where the axis labels say: x data 128…8192 on a log₂ axis is labelled
    /// with every power of two (128, 256, 512, 1k, 2k, 4k, 8k) and the point at 2048 sits on
    /// the 2k label; on a linear decimal axis (0…289, steps of 50) the point at 275 sits at
    /// 275/250 of the way from the "0" label to the "250" one, and y = 7 ms at 3/2 of the way
    /// from "4" to "6".
    #[test]
    fn points_land_on_their_tick_labels() {
        let pts = vec![(128.0, 1.0), (2048.0, 2.0), (8192.0, 3.0)];
        let svg = one_series(
            Axis::binary("tokens").log_if(true),
            Axis::decimal("ms"),
            pts,
        )
        .svg();
        let ticks = svg::x_ticks(&svg);
        let labels: Vec<&str> = ticks.iter().map(|t| t.1.as_str()).collect();
        assert_eq!(labels, ["128", "256", "512", "1k", "2k", "4k", "8k"]);
        let at = |l: &str| ticks.iter().find(|t| t.1 == l).unwrap().0;
        let m = filled_markers(&svg, "#1F77B4");
        assert_eq!(m.len(), 3);
        assert!((m[1].0 - at("2k")).abs() <= 1.0, "{m:?} {ticks:?}");
        assert!((m[0].0 - at("128")).abs() <= 1.0 && (m[2].0 - at("8k")).abs() <= 1.0);

        let pts = vec![(100.0, 5.0), (275.0, 7.0)];
        let svg = one_series(Axis::decimal("x"), Axis::decimal("ms"), pts).svg();
        let ticks = svg::x_ticks(&svg);
        let at = |l: &str| ticks.iter().find(|t| t.1 == l).unwrap().0;
        let m = filled_markers(&svg, "#1F77B4");
        let want = svg::pixel(275.0, (at("0"), 0.0), (at("250"), 250.0));
        assert!((m[1].0 - want).abs() <= 1.0, "{m:?} {ticks:?}");
        let yt = svg::y_ticks(&svg);
        let yat = |l: &str| yt.iter().find(|t| t.1 == l).unwrap().0;
        let want = svg::pixel(7.0, (yat("4"), 4.0), (yat("6"), 6.0));
        assert!((m[1].1 - want).abs() <= 1.0, "{m:?} {yt:?}");
    }

    /// Issue #26: ticks read 4.9k/9.8k/14.6k and 1000/2k/2.9k/3.9k, and a goodput axis read
    /// "0.00" six times. Now: x 0…15 750 ms is labelled in steps of 2000, tokens 0…4200 in
    /// steps of 1024 (`1k`, k = 1024), y 0…0.324 with distinct labels 0.00, 0.05, …
    #[test]
    fn round_distinct_tick_labels_issue_26() {
        let svg = one_series(
            Axis::decimal("ms"),
            Axis::decimal("goodput"),
            vec![(1000.0, 0.3), (15_000.0, 0.0)],
        )
        .svg();
        let x: Vec<String> = svg::x_ticks(&svg).into_iter().map(|t| t.1).collect();
        assert_eq!(x[..4], ["0", "2000", "4000", "6000"]);
        let y: Vec<String> = svg::y_ticks(&svg).into_iter().map(|t| t.1).collect();
        assert_eq!(
            y[..7],
            ["0.00", "0.05", "0.10", "0.15", "0.20", "0.25", "0.30"]
        );
        let svg = one_series(
            Axis::binary("tokens"),
            Axis::decimal("ms"),
            vec![(128.0, 1.0), (4000.0, 2.0)],
        )
        .svg();
        let x: Vec<String> = svg::x_ticks(&svg).into_iter().map(|t| t.1).collect();
        assert_eq!(x, ["0", "1k", "2k", "3k", "4k"]);
    }

    /// A contended point is hollow (white inside, an outline in its colour), the others
    /// filled, and the legend says what hollow means; series differ in marker shape (circle,
    /// triangle, square) as well as colour; the legend lies right of the plot area.
    #[test]
    fn hollow_points_shapes_and_legend_outside() {
        let mk = |n: &str, dy: f64| {
            Series::line(n, vec![(1.0, 1.0 + dy), (2.0, 2.0 + dy), (3.0, 3.0 + dy)])
        };
        let chart = LineChart {
            title: "t".into(),
            caption: "c".into(),
            x: Axis::binary("batch"),
            y: Axis::decimal("ms"),
            series: vec![
                mk("fp16", 0.0).with_hollow(vec![false, true, false]),
                mk("int8", 1.0),
                mk("int4", 2.0),
            ],
        };
        let svg = chart.svg();
        let (_, right) = svg::x_axis(&svg);
        let filled = filled_markers(&svg, "#1F77B4");
        let hollow: Vec<_> = svg::circles(&svg)
            .into_iter()
            .filter(|c| c.2 == "none" && c.3 == "#1F77B4")
            .collect();
        assert_eq!(filled.len(), 2, "{filled:?}");
        assert_eq!(hollow.len(), 1);
        // The hollow one is the middle point: between the two filled ones.
        assert!(filled[0].0 < hollow[0].0 && hollow[0].0 < filled[1].0);
        // Series 1: triangles (3 corners), series 2: squares (4), in their colours, 3 points
        // each plus the legend's.
        let polys = svg::shapes(&svg, "polygon");
        let count = |fill: &str, corners: usize| {
            polys
                .iter()
                .filter(|p| p.0 == fill && p.1.len() == corners)
                .count()
        };
        assert_eq!(count("#FF7F0E", 3), 4);
        assert_eq!(count("#2CA02C", 4), 4);
        // Legend: every name right of the plot area, and the hollow entry.
        for t in svg::texts(&svg) {
            if ["fp16", "int8", "int4", "hollow: contended"].contains(&t.3.as_str()) {
                assert!(t.0 > right, "{t:?} overlaps the plot (right edge {right})");
            }
        }
        assert!(svg.contains("hollow: contended"));
    }

    /// Error bars: a vertical stroke from lo to hi at the point, caps at both ends; a point
    /// without a finite bar gets none.
    #[test]
    fn error_bars_span_their_interval() {
        let chart = LineChart {
            series: vec![Series::line("a", vec![(1.0, 10.0), (2.0, 12.0)])
                .with_bars(vec![(8.0, 12.0), (f64::NAN, f64::NAN)])],
            ..one_series(Axis::binary("batch"), Axis::decimal("ms"), Vec::new())
        };
        let svg = chart.svg();
        let yt = svg::y_ticks(&svg);
        let yat = |l: &str| yt.iter().find(|t| t.1 == l).unwrap().0;
        let (p8, p12) = (yat("8"), yat("12"));
        let m = filled_markers(&svg, "#1F77B4");
        let vertical: Vec<_> = svg::shapes(&svg, "polyline")
            .into_iter()
            .filter(|(c, p)| c == "#1F77B4" && p.len() == 2 && p[0].0 == p[1].0)
            .collect();
        assert_eq!(vertical.len(), 1, "{vertical:?}");
        let p = &vertical[0].1;
        assert!((p[0].0 - m[0].0).abs() <= 1.0);
        assert!(
            (p[0].1 - p8).abs() <= 1.0 && (p[1].1 - p12).abs() <= 1.0,
            "{p:?}"
        );
    }

    /// A step series holds each value until the next x: (0, 1), (1, 3), (2, 2) is drawn
    /// through five corners, each segment horizontal or vertical.
    #[test]
    fn steps_are_drawn_as_steps() {
        let chart = LineChart {
            series: vec![
                Series::line("running", vec![(0.0, 1.0), (1.0, 3.0), (2.0, 2.0)])
                    .with_style(Style::Steps),
            ],
            ..one_series(Axis::decimal("s"), Axis::binary("sequences"), Vec::new())
        };
        let svg = chart.svg();
        let (_, right) = svg::x_axis(&svg);
        let line = svg::shapes(&svg, "polyline")
            .into_iter()
            .find(|(c, p)| c == "#1F77B4" && p.len() > 2 && p[0].0 <= right)
            .unwrap()
            .1;
        assert_eq!(line.len(), 5, "{line:?}");
        for w in line.windows(2) {
            assert!(w[0].0 == w[1].0 || w[0].1 == w[1].1, "{w:?}");
        }
        assert!(
            line[1].1 == line[0].1 && line[1].0 > line[0].0,
            "horizontal first"
        );
        assert!(svg::circles(&svg).is_empty(), "no markers");
    }
}
