//! Line charts as SVG, via plotters' SVG backend.
//!
//! Text is written as SVG `<text>` elements; label sizes are estimated by
//! plotters without font files, so no fontconfig or freetype is involved.
//! A logarithmic x axis is drawn by plotting `log2(x)` on a linear axis and
//! labelling ticks with `2^v`.

use std::path::Path;

use plotters::prelude::*;

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart of several lines over a shared x axis.
#[derive(Debug, Clone, PartialEq)]
pub struct LinePlot {
    /// File stem: the chart is written to `DIR/{name}.svg`.
    pub name: String,
    /// Caption.
    pub title: String,
    /// X axis description.
    pub x_label: String,
    /// Y axis description.
    pub y_label: String,
    /// Log2 x axis (key sizes from 1 to 512).
    pub log_x: bool,
    /// The lines.
    pub series: Vec<Series>,
}

impl LinePlot {
    /// An empty chart.
    pub fn new(
        name: impl Into<String>,
        title: impl Into<String>,
        x_label: &str,
        y_label: &str,
    ) -> Self {
        LinePlot {
            name: name.into(),
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            log_x: false,
            series: Vec::new(),
        }
    }

    /// Adds a line if it has points.
    pub fn add(&mut self, name: impl Into<String>, mut points: Vec<(f64, f64)>) {
        if points.is_empty() {
            return;
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        self.series.push(Series {
            name: name.into(),
            points,
        });
    }

    /// Whether there is anything to draw.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

type PlotResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Writes `plot` as an SVG file.
pub fn render_svg(plot: &LinePlot, path: &Path) -> PlotResult<()> {
    let tx = |x: f64| if plot.log_x { x.max(1e-9).log2() } else { x };
    let all = || plot.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1) = all().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(tx(p.0)), hi.max(tx(p.0)))
    });
    let y1 = all().fold(0f64, |hi, p| hi.max(p.1));
    if x0 > x1 {
        (x0, x1) = (0.0, 1.0);
    }
    if x0 == x1 {
        (x0, x1) = (x0 - 1.0, x1 + 1.0);
    }
    let pad = (x1 - x0) * 0.02;
    let y1 = if y1 > 0.0 { y1 * 1.08 } else { 1.0 };

    let root = SVGBackend::new(path, (960, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&plot.title, ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(52)
        .y_label_area_size(80)
        .build_cartesian_2d((x0 - pad)..(x1 + pad), 0f64..y1)?;

    let x_fmt = |v: &f64| {
        if plot.log_x {
            format!("{}", 2f64.powf(*v).round())
        } else {
            trim_float(*v)
        }
    };
    let y_fmt = |v: &f64| trim_float(*v);
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(plot.x_label.as_str())
        .y_desc(plot.y_label.as_str())
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(WHITE.mix(0.0));
    if plot.log_x {
        // One label per power of two, or every other one past a dozen.
        mesh.x_labels(((x1 - x0).ceil() as usize + 1).clamp(2, 12));
    }
    mesh.draw()?;

    for (i, s) in plot.series.iter().enumerate() {
        // Dark, distinct colours (plotters' palette draws the third line yellow).
        const DARK: [(u8, u8, u8); 8] = [
            (31, 119, 180),
            (214, 39, 40),
            (44, 160, 44),
            (148, 103, 189),
            (140, 86, 75),
            (227, 119, 194),
            (23, 190, 207),
            (90, 90, 90),
        ];
        let (r, g, b) = DARK[i % DARK.len()];
        let color = RGBColor(r, g, b).to_rgba();
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (tx(x), y)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(s.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()?;
    Ok(())
}

/// `12`, `1.5`, `0.25`: a tick label without trailing zeros.
fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_text() {
        let dir = std::env::temp_dir().join(format!("bpfmaps-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut p = LinePlot::new("t", "ns per hash", "key size (bytes)", "ns");
        p.log_x = true;
        p.add("jhash", vec![(1.0, 2.0), (64.0, 20.0), (512.0, 150.0)]);
        p.add("xxh3", vec![(1.0, 1.5), (64.0, 5.0), (512.0, 30.0)]);
        let path = dir.join("t.svg");
        render_svg(&p, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("ns per hash") && svg.contains("xxh3"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(trim_float(12.0), "12");
        assert_eq!(trim_float(1.5), "1.5");
        assert_eq!(trim_float(0.125), "0.125");
    }
}
