//! The report as an SVG picture: throughput and shuffle quality of every loader side by
//! side, readable at a glance (log scales, one bar per loader, values printed).

use std::fmt::Write;

use super::report::Report;

const ROW: f64 = 26.0;
const LABEL: f64 = 300.0;
const PANEL: f64 = 330.0;
const GAP: f64 = 170.0;
const TOP: f64 = 64.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Position of `v` on a log10 axis from `lo` to `hi`, in `0..=PANEL`.
fn log_x(v: f64, lo: f64, hi: f64) -> f64 {
    let (v, lo, hi) = (v.max(lo).log10(), lo.log10(), hi.log10());
    ((v - lo) / (hi - lo).max(1e-9) * PANEL).clamp(0.0, PANEL)
}

fn decade_bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for v in values.filter(|v| *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return (1.0, 10.0);
    }
    (
        10f64.powf(lo.log10().floor()),
        10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
    )
}

fn axis(svg: &mut String, x0: f64, y: f64, lo: f64, hi: f64, title: &str) {
    let _ = write!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" font-weight="bold">{}</text>"#,
        x0,
        TOP - 30.0,
        escape(title)
    );
    let mut tick = lo;
    while tick <= hi * 1.0001 {
        let x = x0 + log_x(tick, lo, hi);
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
            TOP - 8.0
        );
        let _ = write!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
            TOP - 12.0,
            format_tick(tick)
        );
        tick *= 10.0;
    }
}

fn format_tick(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{}M", v / 1e6),
        v if v >= 1e3 => format!("{}k", v / 1e3),
        v if v >= 1.0 => format!("{v}"),
        v => format!("{v:e}"),
    }
}

/// One row's bar in a panel starting at `x0`, `width` long, with its value after it.
fn bar(svg: &mut String, x0: f64, y: f64, width: f64, color: &str, label: &str) {
    let _ = write!(
        svg,
        r#"<rect x="{x0:.1}" y="{:.1}" width="{width:.1}" height="{:.1}" fill="{color}"/>"#,
        y + 4.0,
        ROW - 8.0
    );
    let _ = write!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="11">{label}</text>"#,
        x0 + width + 4.0,
        y + 16.0
    );
}

/// The SVG document.
pub fn svg(report: &Report) -> String {
    let rows = report.loaders.len() as f64;
    let (width, height) = (LABEL + 2.0 * PANEL + GAP + 170.0, TOP + rows * ROW + 60.0);
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>"#
    );
    let (rate_lo, rate_hi) = decade_bounds(report.loaders.iter().map(|l| l.events_per_s));
    let iid = report
        .loaders
        .first()
        .map_or(0.0, |l| l.quality.pair_repeat_iid);
    let (rep_lo, rep_hi) = decade_bounds(
        report
            .loaders
            .iter()
            .map(|l| l.quality.pair_repeat.max(iid / 10.0))
            .chain([iid, 1.0]),
    );
    let (x_rate, x_rep) = (LABEL, LABEL + PANEL + GAP);
    let y_end = TOP + rows * ROW;
    axis(
        &mut svg,
        x_rate,
        y_end,
        rate_lo,
        rate_hi,
        "events/s (log scale; higher is better)",
    );
    axis(
        &mut svg,
        x_rep,
        y_end,
        rep_lo,
        rep_hi,
        "pairs meeting again next epoch (lower is better)",
    );
    let x = x_rep + log_x(iid, rep_lo, rep_hi);
    let _ = write!(
        svg,
        r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{y_end:.1}" stroke="#c00" stroke-dasharray="4 3"/><text x="{x:.1}" y="{:.1}" font-size="10" fill="#c00" text-anchor="middle">i.i.d.</text>"##,
        TOP - 4.0,
        y_end + 12.0
    );
    for (i, l) in report.loaders.iter().enumerate() {
        let y = TOP + i as f64 * ROW;
        let name = match l.window {
            Some(w) => format!("shardify, window {w}"),
            None => l.name.clone(),
        };
        let color = if l.window.is_some() {
            "#2a6fb0"
        } else {
            "#999"
        };
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"#,
            LABEL - 8.0,
            y + 16.0,
            escape(&name)
        );
        let w = log_x(l.events_per_s, rate_lo, rate_hi);
        bar(
            &mut svg,
            x_rate,
            y,
            w,
            color,
            &format!("{:.0}", l.events_per_s),
        );
        let w = log_x(l.quality.pair_repeat, rep_lo, rep_hi);
        let label = format!(
            "{:.4} (mixing {:.2})",
            l.quality.pair_repeat, l.quality.file_mixing
        );
        bar(&mut svg, x_rep, y, w, color, &label);
    }
    let _ = write!(
        svg,
        r#"<text x="10" y="{:.1}" font-size="11">{} events; memcpy {:.2} GB/s; mixing = in-batch source-file entropy / i.i.d. (1 is ideal)</text></svg>"#,
        height - 14.0,
        report.dataset_events,
        report.memcpy_gb_per_s
    );
    svg
}
