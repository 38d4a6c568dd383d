//! SVG plot of a run: throughput per second (top) and p50/p99 latency per second (bottom).

use std::path::Path;

use plotters::prelude::*;

use crate::stats::Second;

/// One line of the plot: a label and its per-second samples.
pub struct Run<'a> {
    pub label: String,
    pub series: &'a [Second],
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Writes `path` with one throughput line and p50 (dashed-ish, lighter) and p99 lines per run.
pub fn write_svg(path: &Path, title: &str, runs: &[Run<'_>]) -> anyhow::Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(340);
    let t_max = runs.iter().flat_map(|r| r.series.iter().map(|s| s.t_s)).fold(1.0f64, f64::max);
    let ops_max = runs.iter().flat_map(|r| r.series.iter().map(|s| s.ops_per_s)).fold(1.0f64, f64::max) * 1.1;
    let lat_max = runs.iter().flat_map(|r| r.series.iter().map(|s| s.p99_ms)).fold(0.1f64, f64::max) * 1.1;

    let mut c = ChartBuilder::on(&top)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .caption("throughput (successful ops per second)", ("sans-serif", 16))
        .build_cartesian_2d(0f64..t_max, 0f64..ops_max)
        .map_err(|e| err(&e))?;
    c.configure_mesh().x_desc("seconds").y_desc("ops/s").draw().map_err(|e| err(&e))?;
    for (i, r) in runs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        c.draw_series(LineSeries::new(r.series.iter().map(|s| (s.t_s, s.ops_per_s)), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(r.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| err(&e))?;

    let mut c = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .caption("latency per second: p99 (solid) and p50 (thin)", ("sans-serif", 16))
        .build_cartesian_2d(0f64..t_max, 0f64..lat_max)
        .map_err(|e| err(&e))?;
    c.configure_mesh().x_desc("seconds").y_desc("ms").draw().map_err(|e| err(&e))?;
    for (i, r) in runs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        c.draw_series(LineSeries::new(r.series.iter().map(|s| (s.t_s, s.p99_ms)), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(format!("{} p99", r.label))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        c.draw_series(LineSeries::new(r.series.iter().map(|s| (s.t_s, s.p50_ms)), color.mix(0.6).stroke_width(1)))
            .map_err(|e| err(&e))?;
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Writes `path` with one line per `(label, points)`: a plain x/y chart (e.g. resident memory against
/// the number of twins loaded).
pub fn write_xy_svg(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (1000, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(|e| err(&e))?;
    let points = || lines.iter().flat_map(|(_, p)| p.iter());
    let x_max = points().map(|p| p.0).fold(1.0f64, f64::max);
    let y_max = points().map(|p| p.1).fold(1.0f64, f64::max) * 1.1;
    let mut c = ChartBuilder::on(&root)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|e| err(&e))?;
    c.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(|e| err(&e))?;
    for (i, (label, pts)) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        c.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
