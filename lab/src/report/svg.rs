//! Line charts as inline SVG: no script, no network, the same bytes for the same data.

use std::fmt::Write as _;

/// Chart size.
const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 240.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 48.0;

/// One line.
pub struct Line<'a> {
    /// Legend.
    pub name: &'a str,
    /// Stroke colour.
    pub color: &'a str,
    /// One value per interval.
    pub values: Vec<f64>,
}

/// A shaded span of intervals (a fault in force), `[from, to)` in interval indexes.
pub struct Band<'a> {
    /// First interval.
    pub from: usize,
    /// One past the last.
    pub to: usize,
    /// Its label.
    pub label: &'a str,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A round number at or above `max` for the y axis.
fn nice(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(max.log10().floor());
    for step in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if step * magnitude >= max {
            return step * magnitude;
        }
    }
    10.0 * magnitude
}

fn number(v: f64) -> String {
    if v >= 1000.0 || v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.1}") }
}

/// A chart of `lines` over `ends` (interval ends, seconds), with `bands` shaded.
pub fn chart(title: &str, unit: &str, ends: &[f64], lines: &[Line<'_>], bands: &[Band<'_>]) -> String {
    let mut out = String::new();
    let n = ends.len().max(1);
    let max = nice(lines.iter().flat_map(|l| l.values.iter().copied()).fold(0.0, f64::max));
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |i: usize| LEFT + plot_w * (i as f64 + 0.5) / n as f64;
    let y = |v: f64| TOP + plot_h * (1.0 - v / max);
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{}">"#,
        escape(title)
    );
    out.push_str(r##"<rect width="100%" height="100%" fill="#fff"/>"##);
    for band in bands {
        let x0 = LEFT + plot_w * band.from as f64 / n as f64;
        let x1 = LEFT + plot_w * band.to.min(n) as f64 / n as f64;
        let _ = write!(
            out,
            r##"<rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{plot_h}" fill="#f4d35e" opacity="0.25"><title>{}</title></rect>"##,
            (x1 - x0).max(1.0),
            escape(band.label)
        );
    }
    for k in 0..=4 {
        let v = max * f64::from(k) / 4.0;
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"##,
            WIDTH - RIGHT,
            y(v),
            y(v),
            LEFT - 4.0,
            y(v) + 3.0,
            number(v)
        );
    }
    let ticks = 6.min(n);
    for k in 0..ticks {
        let i = (n - 1) * k / (ticks - 1).max(1);
        let label = ends.get(i).copied().unwrap_or(0.0);
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}s</text>"#,
            x(i),
            TOP + plot_h + 14.0,
            number(label)
        );
    }
    let _ = write!(
        out,
        r#"<text x="12" y="{:.1}" font-size="10" transform="rotate(-90 12 {:.1})" text-anchor="middle">{}</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        escape(unit)
    );
    for line in lines {
        let points: Vec<String> =
            line.values.iter().enumerate().map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v))).collect();
        let _ = write!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.6" points="{}"><title>{}</title></polyline>"#,
            line.color,
            points.join(" "),
            escape(line.name)
        );
    }
    let mut legend_x = LEFT;
    for line in lines {
        let _ = write!(
            out,
            r#"<rect x="{legend_x:.1}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            HEIGHT - 16.0,
            line.color,
            legend_x + 14.0,
            HEIGHT - 7.0,
            escape(line.name)
        );
        legend_x += 24.0 + 7.0 * line.name.len() as f64;
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_y_axis_tops_at_a_round_number_above_the_largest_value() {
        assert_eq!(nice(0.0), 1.0);
        assert_eq!(nice(7.0), 10.0);
        assert_eq!(nice(130.0), 200.0);
        assert_eq!(nice(2400.0), 2500.0);
    }

    #[test]
    fn a_chart_escapes_names_and_draws_one_polyline_per_line() {
        let svg = chart(
            "a <b>",
            "requests",
            &[1.0, 2.0],
            &[Line { name: "x&y", color: "#000", values: vec![1.0, 2.0] }],
            &[Band { from: 0, to: 1, label: "down" }],
        );
        assert!(svg.contains("a &lt;b&gt;") && svg.contains("x&amp;y"));
        assert_eq!(svg.matches("<polyline").count(), 1);
    }
}
