//! Two small chart kinds as plain SVG text, enough for the bench's plots: a line chart on
//! logarithmic axes and a horizontal bar chart with a reference line. No fonts are needed:
//! the viewer lays the text out.

use std::fmt::Write as _;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
/// Room around the plotting area for the titles, the axes' labels and the legend.
const LEFT: f64 = 80.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

pub struct LineChart<'a> {
    pub title: &'a str,
    pub subtitle: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub series: Vec<Series>,
}

pub struct BarChart<'a> {
    pub title: &'a str,
    pub subtitle: &'a str,
    pub unit: &'a str,
    pub bars: Vec<(String, f64)>,
    /// A vertical line across the bars: a limit to compare them with.
    pub reference: Option<(String, f64)>,
}

fn header(out: &mut String, height: f64, title: &str, subtitle: &str) {
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(out, r#"<text x="{LEFT}" y="24" font-size="16" font-weight="bold">{}</text>"#, escape(title));
    let _ = writeln!(out, r##"<text x="{LEFT}" y="42" fill="#555">{}</text>"##, escape(subtitle));
}

/// Powers of ten and their 2× and 5× between `low` and `high`: the ticks of a log axis.
fn log_ticks(low: f64, high: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powf(low.log10().floor());
    while decade <= high {
        for step in [1.0, 2.0, 5.0] {
            let tick = decade * step;
            if tick >= low * 0.999 && tick <= high * 1.001 {
                ticks.push(tick);
            }
        }
        decade *= 10.0;
    }
    ticks
}

/// A range on a log axis that holds every value, widened to whole ticks.
fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (low, high) = values.filter(|v| *v > 0.0).fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(v), h.max(v)));
    if low > high {
        return (1.0, 10.0);
    }
    let widen = |v: f64, down: bool| {
        let decade = 10f64.powf(v.log10().floor());
        let steps = [1.0, 2.0, 5.0, 10.0];
        if down {
            steps.iter().rev().map(|s| s * decade).find(|t| *t <= v).unwrap_or(decade)
        } else {
            steps.iter().map(|s| s * decade).find(|t| *t >= v).unwrap_or(decade * 10.0)
        }
    };
    (widen(low, true), widen(high, false))
}

fn label(value: f64) -> String {
    if value >= 1000.0 { format!("{}k", value / 1000.0) } else { format!("{value}") }
}

pub fn line_chart(chart: &LineChart) -> String {
    let mut out = String::new();
    header(&mut out, HEIGHT, chart.title, chart.subtitle);
    let points = || chart.series.iter().flat_map(|s| s.points.iter());
    let (x_low, x_high) = log_range(points().map(|p| p.0));
    let (y_low, y_high) = log_range(points().map(|p| p.1));
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let x = |v: f64| LEFT + plot_w * (v.log10() - x_low.log10()) / (x_high.log10() - x_low.log10()).max(1e-9);
    let y = |v: f64| TOP + plot_h * (1.0 - (v.log10() - y_low.log10()) / (y_high.log10() - y_low.log10()).max(1e-9));
    let bottom = TOP + plot_h;
    for tick in log_ticks(y_low, y_high) {
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            y(tick),
            y(tick),
            LEFT - 6.0,
            y(tick) + 4.0,
            label(tick)
        );
    }
    let mut x_ticks: Vec<f64> = points().map(|p| p.0).collect();
    x_ticks.sort_by(f64::total_cmp);
    x_ticks.dedup();
    for tick in x_ticks {
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{TOP}" y2="{bottom:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            x(tick),
            x(tick),
            x(tick),
            bottom + 16.0,
            label(tick)
        );
    }
    axes(&mut out, plot_w, plot_h, chart.x_label, chart.y_label);
    for (i, series) in chart.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = series.points.iter().map(|(px, py)| format!("{:.1},{:.1}", x(*px), y(*py))).collect();
        let _ =
            writeln!(out, r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#, path.join(" "));
        for (px, py) in &series.points {
            let _ = writeln!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"/>"#, x(*px), y(*py));
        }
        let legend_y = TOP + 10.0 + 20.0 * i as f64;
        let legend_x = WIDTH - RIGHT + 16.0;
        let _ = writeln!(
            out,
            r#"<line x1="{legend_x}" x2="{:.1}" y1="{legend_y}" y2="{legend_y}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            legend_x + 18.0,
            legend_x + 24.0,
            legend_y + 4.0,
            escape(&series.name)
        );
    }
    out.push_str("</svg>\n");
    out
}

fn axes(out: &mut String, plot_w: f64, plot_h: f64, x_label: &str, y_label: &str) {
    let bottom = TOP + plot_h;
    let _ = writeln!(
        out,
        r#"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}" stroke="black"/><line x1="{LEFT}" x2="{:.1}" y1="{bottom}" y2="{bottom}" stroke="black"/>"#,
        LEFT + plot_w
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        bottom + 40.0,
        escape(x_label)
    );
    let _ = writeln!(
        out,
        r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + plot_h / 2.0,
        escape(y_label)
    );
}

pub fn bar_chart(chart: &BarChart) -> String {
    let mut out = String::new();
    let bar_h = 28.0;
    let bars_bottom = TOP + 10.0 + chart.bars.len() as f64 * (bar_h + 14.0);
    header(&mut out, bars_bottom + 40.0, chart.title, chart.subtitle);
    let left = LEFT + 150.0;
    let plot_w = WIDTH - left - 90.0;
    let largest =
        chart.bars.iter().map(|b| b.1).chain(chart.reference.iter().map(|r| r.1)).fold(0.0f64, f64::max).max(1e-9);
    let scale = |v: f64| plot_w * v / largest;
    for (i, (name, value)) in chart.bars.iter().enumerate() {
        let top = TOP + 10.0 + i as f64 * (bar_h + 14.0);
        let color = COLORS[i % COLORS.len()];
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect x="{left:.1}" y="{top:.1}" width="{:.1}" height="{bar_h}" fill="{color}"/><text x="{:.1}" y="{:.1}">{:.3} {}</text>"#,
            left - 8.0,
            top + bar_h / 2.0 + 4.0,
            escape(name),
            scale(*value),
            left + scale(*value) + 6.0,
            top + bar_h / 2.0 + 4.0,
            value,
            escape(chart.unit)
        );
    }
    let bottom = bars_bottom;
    if let Some((name, value)) = &chart.reference {
        let at = left + scale(*value);
        let _ = writeln!(
            out,
            r#"<line x1="{at:.1}" x2="{at:.1}" y1="{TOP}" y2="{bottom:.1}" stroke="black" stroke-dasharray="5 4"/><text x="{at:.1}" y="{:.1}">{} ({:.3} {})</text>"#,
            bottom + 16.0,
            escape(name),
            value,
            escape(chart.unit)
        );
    }
    let _ = writeln!(out, r#"<line x1="{left:.1}" x2="{left:.1}" y1="{TOP}" y2="{bottom:.1}" stroke="black"/>"#);
    out.push_str("</svg>\n");
    out
}

/// One bar of a timeline: what occupied `row` from `from` to `to`.
pub struct Stay {
    pub label: String,
    /// Picks the bar's colour, so that neighbours differ.
    pub colour: usize,
    pub row: usize,
    pub from: f64,
    pub to: f64,
}

pub struct Timeline<'a> {
    pub title: &'a str,
    pub subtitle: &'a str,
    pub row_name: &'a str,
    pub rows: usize,
    pub x_label: &'a str,
    pub end: f64,
    pub stays: Vec<Stay>,
}

/// Rows of bars along a shared axis: which request held which slot over the decode steps.
pub fn timeline_chart(chart: &Timeline) -> String {
    let mut out = String::new();
    let row_h = (300.0 / chart.rows.max(1) as f64).clamp(6.0, 24.0);
    let plot_h = row_h * chart.rows as f64;
    header(&mut out, TOP + plot_h + BOTTOM, chart.title, chart.subtitle);
    let plot_w = WIDTH - LEFT - 40.0;
    let x = |v: f64| LEFT + plot_w * v / chart.end.max(1.0);
    for stay in &chart.stays {
        let top = TOP + row_h * stay.row as f64;
        // Hues a golden angle apart, so that consecutive requests' colours are far apart.
        let fill = hue_to_hex((stay.colour * 137 % 360) as f64);
        let width = (x(stay.to) - x(stay.from)).max(1.0);
        let _ = writeln!(
            out,
            r#"<rect x="{:.1}" y="{:.1}" width="{width:.1}" height="{:.1}" fill="{fill}" stroke="white" stroke-width="0.5"><title>{}</title></rect>"#,
            x(stay.from),
            top + 1.0,
            row_h - 2.0,
            escape(&stay.label)
        );
        if width > 8.0 * stay.label.len() as f64 && row_h >= 12.0 {
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" font-size="10">{}</text>"#,
                x(stay.from) + 3.0,
                top + row_h / 2.0 + 3.5,
                escape(&stay.label)
            );
        }
    }
    let bottom = TOP + plot_h;
    for row in (0..chart.rows).step_by((chart.rows / 8).max(1)) {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="10">{} {row}</text>"#,
            LEFT - 6.0,
            TOP + row_h * row as f64 + row_h / 2.0 + 3.5,
            escape(chart.row_name)
        );
    }
    for tick in linear_ticks(chart.end) {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{tick}</text>"#,
            x(tick as f64),
            bottom + 16.0
        );
    }
    let _ = writeln!(
        out,
        r#"<line x1="{LEFT}" x2="{:.1}" y1="{bottom:.1}" y2="{bottom:.1}" stroke="black"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w,
        LEFT + plot_w / 2.0,
        bottom + 40.0,
        escape(chart.x_label)
    );
    out.push_str("</svg>\n");
    out
}

/// A mid-light colour of hue `hue` degrees (saturation 65%, lightness 60%) as `#rrggbb`,
/// which every SVG viewer reads.
fn hue_to_hex(hue: f64) -> String {
    let (saturation, lightness) = (0.65, 0.6);
    let chroma = (1.0 - (2.0 * lightness - 1.0f64).abs()) * saturation;
    let h = hue / 60.0;
    let x = chroma * (1.0 - (h % 2.0 - 1.0).abs());
    let (r, g, b) = match h as u32 {
        0 => (chroma, x, 0.0),
        1 => (x, chroma, 0.0),
        2 => (0.0, chroma, x),
        3 => (0.0, x, chroma),
        4 => (x, 0.0, chroma),
        _ => (chroma, 0.0, x),
    };
    let m = lightness - chroma / 2.0;
    let byte = |v: f64| ((v + m) * 255.0).round() as u8;
    format!("#{:02x}{:02x}{:02x}", byte(r), byte(g), byte(b))
}

/// Round ticks from 0 to `end`: steps of 1, 2 or 5 times a power of ten, about 6 of them.
fn linear_ticks(end: f64) -> Vec<u64> {
    let raw = (end / 6.0).max(1.0);
    let decade = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|s| s * decade).find(|s| *s >= raw).unwrap_or(decade * 10.0) as u64;
    (0..=(end as u64 / step)).map(|i| i * step).collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_axes_cover_the_values_with_round_ticks() {
        assert_eq!(log_range([17.9, 4815.0].into_iter()), (10.0, 5000.0));
        assert_eq!(log_ticks(10.0, 5000.0), vec![10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0]);
    }

    #[test]
    fn a_timeline_has_a_bar_per_stay() {
        let stays =
            (0..3).map(|i| Stay { label: format!("{i}"), colour: i, row: i % 2, from: i as f64, to: i as f64 + 4.0 });
        let chart = timeline_chart(&Timeline {
            title: "t",
            subtitle: "s",
            row_name: "slot",
            rows: 2,
            x_label: "step",
            end: 7.0,
            stays: stays.collect(),
        });
        assert_eq!(chart.matches("<rect x=").count(), 3);
        assert!(chart.contains("slot 1") && chart.contains("<title>2</title>"));
        assert_eq!(linear_ticks(7.0), vec![0, 2, 4, 6]);
        assert_eq!(hue_to_hex(0.0), "#db5757");
        assert_eq!(hue_to_hex(120.0), "#57db57");
        assert_eq!(linear_ticks(1300.0), vec![0, 500, 1000]);
    }

    #[test]
    fn charts_are_svg_with_every_series_and_bar() {
        let line = line_chart(&LineChart {
            title: "t",
            subtitle: "s",
            x_label: "x",
            y_label: "y",
            series: vec![Series { name: "a<b".into(), points: vec![(1.0, 10.0), (8.0, 80.0)] }],
        });
        assert!(line.starts_with("<svg") && line.trim_end().ends_with("</svg>"));
        assert!(line.contains("a&lt;b") && line.contains("<polyline"));
        let bars = bar_chart(&BarChart {
            title: "t",
            subtitle: "s",
            unit: "ms",
            bars: vec![("one".into(), 2.0), ("two".into(), 0.8)],
            reference: Some(("floor".into(), 0.58)),
        });
        assert_eq!(bars.matches("<rect x=").count(), 2);
        assert!(bars.contains("floor (0.580 ms)"));
    }
}
