//! The report's PNG plots, drawn with plotters (text in DejaVu Sans, embedded: no system font
//! or external tool is needed).

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::report::{Results, Run};

const SIZE: (u32, u32) = (1100, 600);

fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Only fails on bytes that are not a font; these are DejaVu Sans.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// A series: its label, colour and points.
type Series = (String, RGBColor, Vec<(f64, f64)>);

fn ttft_points(run: &Run) -> Vec<(f64, f64)> {
    run.turns
        .iter()
        .map(|t| ((t.step + 1) as f64, t.ttft_s.max(1e-3)))
        .collect()
}

/// TTFT per turn: mtplx (its points coloured by restore mode), re-prefill, llama.cpp.
pub fn ttft(r: &Results, path: &Path) -> Result<()> {
    let Some(run) = r.replay.first() else {
        return Ok(());
    };
    let mut series: Vec<Series> = vec![("mtplx".into(), BLUE, ttft_points(run))];
    if let Some(c) = &r.reprefill {
        series.push(("mtplx, re-prefill (cache off)".into(), RED, ttft_points(c)));
    }
    if let Some(p) = &r.peer {
        series.push((
            "llama.cpp server (prompt cache on)".into(),
            RGBColor(0, 150, 60),
            ttft_points(p),
        ));
    }
    let marks: Vec<Series> = [
        ("restored from RAM", RGBColor(0, 160, 230), false),
        ("restored from the SSD tier", RGBColor(150, 60, 200), true),
    ]
    .into_iter()
    .map(|(label, colour, ssd)| {
        let pts = run
            .turns
            .iter()
            .filter(|t| {
                t.turn > 0 && t.restored_from_ssd() == ssd && t.cached_tokens.unwrap_or(0) > 0
            })
            .map(|t| ((t.step + 1) as f64, t.ttft_s.max(1e-3)))
            .collect();
        (label.to_string(), colour, pts)
    })
    .collect();
    lines(
        path,
        "Time to first token per turn",
        "step of the replay",
        "TTFT (s, log scale)",
        &series,
        &marks,
        true,
    )
}

/// Decode tok/s per measured turn, one line per decoding configuration.
pub fn decode(r: &Results, path: &Path) -> Result<()> {
    let palette = [
        BLUE,
        RED,
        RGBColor(0, 150, 60),
        RGBColor(150, 60, 200),
        BLACK,
    ];
    let series: Vec<Series> = r
        .decoding
        .iter()
        .zip(palette.iter().cycle())
        .map(|((name, turns), &c)| {
            let pts = turns
                .iter()
                .enumerate()
                .filter_map(|(i, t)| Some(((i + 1) as f64, t.decode_tok_s?)))
                .collect();
            (name.clone(), c, pts)
        })
        .collect();
    lines(
        path,
        "Decode rate by proposer (chat turns first, then code edits)",
        "measured turn",
        "decode tok/s",
        &series,
        &[],
        false,
    )
}

/// Resident memory of each server over its run.
pub fn rss(r: &Results, path: &Path) -> Result<()> {
    let mb = |run: &Run| -> Vec<(f64, f64)> {
        run.rss.iter().map(|&(t, b)| (t, b as f64 / 1e6)).collect()
    };
    let mut series: Vec<Series> = Vec::new();
    if let Some(run) = r.replay.first() {
        series.push(("mtplx (restart mid-way)".into(), BLUE, mb(run)));
    }
    if let Some(c) = &r.reprefill {
        series.push(("mtplx, cache off".into(), RED, mb(c)));
    }
    if let Some(p) = &r.peer {
        series.push(("llama.cpp server".into(), RGBColor(0, 150, 60), mb(p)));
    }
    lines(
        path,
        "Server RSS over its run",
        "seconds since the server started",
        "RSS (MB)",
        &series,
        &[],
        false,
    )
}

fn lines(
    path: &Path,
    caption: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    marks: &[Series],
    log_y: bool,
) -> Result<()> {
    fonts();
    let all = || series.iter().chain(marks).flat_map(|(_, _, p)| p.iter());
    let x_max = all().map(|p| p.0).fold(1.0, f64::max);
    let x_min = all().map(|p| p.0).fold(x_max, f64::min).clamp(0.0, 1.0);
    let y_max = all().map(|p| p.1).fold(1e-3, f64::max) * 1.15;
    let y_min = all().map(|p| p.1).fold(y_max, f64::min);
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(caption, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72);
    if log_y {
        let y = ((y_min * 0.8).max(1e-3)..y_max).log_scale();
        let mut chart = builder.build_cartesian_2d(x_min..x_max, y).map_err(err)?;
        fill(
            &mut chart,
            (x_desc, y_desc),
            series,
            marks,
            SeriesLabelPosition::UpperLeft,
        )?;
    } else {
        let mut chart = builder
            .build_cartesian_2d(x_min..x_max, 0.0..y_max)
            .map_err(err)?;
        fill(
            &mut chart,
            (x_desc, y_desc),
            series,
            marks,
            SeriesLabelPosition::LowerRight,
        )?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// The mesh with its axis names, the series and marks, and the legend at `legend`: the same
/// on a linear and a logarithmic y axis.
fn fill<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    (x_desc, y_desc): (&str, &str),
    series: &[Series],
    marks: &[Series],
    legend: SeriesLabelPosition,
) -> Result<()>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    draw(chart, series, marks)?;
    chart
        .configure_series_labels()
        .position(legend)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

fn draw<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    series: &[Series],
    marks: &[Series],
) -> Result<()>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate<From = (f64, f64)>,
{
    for (label, colour, pts) in series {
        let c = *colour;
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(2)));
        // Dots where each point is a turn; a sampled curve is drawn as a line alone.
        if pts.len() <= 100 {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
                .map_err(err)?;
        }
    }
    for (label, colour, pts) in marks {
        let c = *colour;
        chart
            .draw_series(pts.iter().map(|&p| TriangleMarker::new(p, 7, c.filled())))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| TriangleMarker::new((x + 12, y), 7, c.filled()));
    }
    Ok(())
}
