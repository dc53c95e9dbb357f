//! The report itself: `index.html` with SVG charts drawn by `plotters`,
//! and the summary table as markdown in `summary.md`.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::data::{Data, Est, LinearRow};

/// A chart: file name, title, SVG text, caption.
struct Chart {
    file: String,
    title: String,
    svg: String,
    caption: String,
}

fn pe<E: std::fmt::Debug>(e: E) -> String {
    format!("plotters: {e:?}")
}

/// The colour of series `i`.
fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    C[i % C.len()]
}

/// What each subject is, for legends and column heads.
pub fn subject_label(s: &str) -> String {
    match s {
        "pgtable" => "pgtable".into(),
        "pgtable-user" => "pgtable, user pages (atomic)".into(),
        "pgtable-noreport" => "pgtable, no report".into(),
        "x86_64" => "x86_64 (keeps empty tables)".into(),
        "x86_64+clean_up" => "x86_64 + clean_up (frees tables)".into(),
        "page_table_multiarch" => "page_table_multiarch (keeps empty tables)".into(),
        "aarch64-paging" => "aarch64-paging (frees tables)".into(),
        other => other.into(),
    }
}

/// Grouped bars: one group per category, one bar per series; `None`
/// values are left out. `log`: logarithmic value axis.
fn grouped_bars(
    title: &str,
    y_desc: &str,
    categories: &[String],
    series: &[(String, Vec<Option<f64>>)],
    log: bool,
) -> Result<String, String> {
    let k = series.len().max(1) as i32;
    let slots = categories.len() as i32 * (k + 1);
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .fold(0.0f64, |a, &b| a.max(b))
        .max(1e-9);
    let mut svg = String::new();
    {
        let width = (140 * categories.len() as u32 * (k as u32 + 1) / 4).clamp(760, 1200);
        let root = SVGBackend::with_string(&mut svg, (width, 460)).into_drawing_area();
        root.fill(&WHITE).map_err(pe)?;
        let cats = categories.to_vec();
        let fmt = move |x: &i32| {
            let i = x / (k + 1);
            if x % (k + 1) == (k - 1) / 2 && (i as usize) < cats.len() {
                cats[i as usize].clone()
            } else {
                String::new()
            }
        };
        macro_rules! draw {
            ($chart:expr, $floor:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .disable_x_mesh()
                    .x_labels(slots as usize + 1)
                    .x_label_formatter(&fmt)
                    .y_label_formatter(&|v: &f64| short(*v))
                    .y_desc(y_desc)
                    .draw()
                    .map_err(pe)?;
                for (j, (name, vals)) in series.iter().enumerate() {
                    let c = color(j);
                    let bars: Vec<(i32, f64)> = vals
                        .iter()
                        .enumerate()
                        .filter_map(|(i, v)| v.map(|v| (i as i32 * (k + 1) + j as i32, v)))
                        .collect();
                    chart
                        .draw_series(bars.iter().map(|&(x, v)| {
                            Rectangle::new([(x, $floor), (x + 1, v.max($floor))], c.filled())
                        }))
                        .map_err(pe)?
                        .label(name.as_str())
                        .legend(move |(x, y)| {
                            Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled())
                        });
                    chart
                        .draw_series(bars.iter().map(|&(x, v)| {
                            Text::new(short(v), (x, v.max($floor)), ("sans-serif", 10).into_font())
                        }))
                        .map_err(pe)?;
                }
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperRight)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(pe)?;
            }};
        }
        let mut b = ChartBuilder::on(&root);
        b.caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        if log {
            let floor = series
                .iter()
                .flat_map(|(_, v)| v.iter().flatten())
                .filter(|v| **v > 0.0)
                .fold(max, |a, &b| a.min(b))
                / 3.0;
            let c = b
                .build_cartesian_2d(0i32..slots, (floor..max * 8.0).log_scale())
                .map_err(pe)?;
            draw!(c, floor);
        } else {
            let c = b
                .build_cartesian_2d(0i32..slots, 0f64..max * 1.35)
                .map_err(pe)?;
            draw!(c, 0.0);
        }
        root.present().map_err(pe)?;
    }
    Ok(svg)
}

/// A value in three significant digits.
fn short(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 100.0 || (v.fract() == 0.0 && v >= 1.0) {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Lines against size (log MiB axis).
fn size_lines(
    title: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_y: bool,
) -> Result<String, String> {
    let xs = series.iter().flat_map(|(_, p)| p.iter().map(|p| p.0));
    let (lo, hi) = xs.fold((f64::MAX, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    let (lo, hi) = if lo > hi { (1.0, 2.0) } else { (lo, hi) };
    let max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (820, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(pe)?;
        let mut b = ChartBuilder::on(&root);
        b.caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        macro_rules! draw {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc("bytes per call")
                    .y_desc(y_desc)
                    .y_label_formatter(&|v: &f64| short(*v))
                    .x_label_formatter(&|v| {
                        if *v >= 1024.0 {
                            format!("{:.0} GiB", v / 1024.0)
                        } else {
                            format!("{v:.0} MiB")
                        }
                    })
                    .draw()
                    .map_err(pe)?;
                for (j, (name, pts)) in series.iter().enumerate() {
                    let c = color(j);
                    chart
                        .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                        .map_err(pe)?
                        .label(name.as_str())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
                        });
                    chart
                        .draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
                        .map_err(pe)?;
                }
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperRight)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(pe)?;
            }};
        }
        let x = (lo / 1.3..hi * 1.3).log_scale();
        if log_y {
            let min = series
                .iter()
                .flat_map(|(_, p)| p.iter().map(|p| p.1))
                .filter(|v| *v > 0.0)
                .fold(max, f64::min);
            draw!(b
                .build_cartesian_2d(x, (min / 2.0..max * 4.0).log_scale())
                .map_err(pe)?);
        } else {
            draw!(b.build_cartesian_2d(x, 0f64..max * 1.3).map_err(pe)?);
        }
        root.present().map_err(pe)?;
    }
    Ok(svg)
}

/// The operations of the peer comparison: criterion group suffix, label,
/// unit.
const OPS: [(&str, &str); 6] = [
    ("map-4K", "map 4 KiB pages"),
    ("protect-4K", "protect 4 KiB pages"),
    ("unmap-4K", "unmap 4 KiB pages"),
    ("map-2M", "map 2 MiB blocks"),
    ("unmap-report-4K", "unmap, report each page"),
    ("fault-4K", "install one page (fault)"),
];

/// The subjects of `arch`'s peer groups, in column order.
fn subjects(arch: &str) -> &'static [&'static str] {
    if arch == "x86" {
        &[
            "pgtable",
            "pgtable-user",
            "x86_64",
            "x86_64+clean_up",
            "page_table_multiarch",
        ]
    } else if arch.starts_with("riscv") {
        &["pgtable", "pgtable-user", "page_table_multiarch"]
    } else {
        &[
            "pgtable",
            "pgtable-user",
            "aarch64-paging",
            "page_table_multiarch",
        ]
    }
}

fn find(c: &[Est], group: &str, function: &str) -> Option<f64> {
    c.iter()
        .find(|e| e.group == group && e.function == function)
        .map(|e| e.ns)
}

/// The pgtable figure a peer is compared with in `group`: `pgtable`, or
/// in the fork group `pgtable-map` (the peers cannot fork).
fn pgtable_ref(c: &[Est], arch: &str, op: &str) -> Option<f64> {
    let g = format!("{arch}-{op}");
    find(c, &g, "pgtable").or_else(|| find(c, &g, "pgtable-map"))
}

fn peer_chart(data: &Data, arch: &str, title: &str) -> Result<Option<Chart>, String> {
    let ops: Vec<&(&str, &str)> = OPS
        .iter()
        .filter(|(op, _)| {
            subjects(arch)
                .iter()
                .any(|s| find(&data.criterion, &format!("{arch}-{op}"), s).is_some())
        })
        .collect();
    if ops.is_empty() {
        return Ok(None);
    }
    let series: Vec<(String, Vec<Option<f64>>)> = subjects(arch)
        .iter()
        .map(|s| {
            let v = ops
                .iter()
                .map(|(op, _)| {
                    let g = format!("{arch}-{op}");
                    find(&data.criterion, &g, s).or_else(|| {
                        // The fork group names pgtable's map `pgtable-map`.
                        (*s == "pgtable").then(|| find(&data.criterion, &g, "pgtable-map"))?
                    })
                })
                .collect();
            (subject_label(s), v)
        })
        .filter(|(_, v): &(String, Vec<Option<f64>>)| v.iter().any(Option::is_some))
        .collect();
    let cats: Vec<String> = ops.iter().map(|(_, l)| l.to_string()).collect();
    let svg = grouped_bars(title, "ns per entry (median)", &cats, &series, false)?;
    Ok(Some(Chart {
        file: format!("peers-{arch}.svg"),
        title: title.into(),
        svg,
        caption: format!(
            "Median ns per entry (page, block or installed page) of each criterion group {arch}-*, lower is better. \
             Every subject zeroes its new tables inside the timed map; \"keeps empty tables\": the unmap leaves the emptied \
             tables in place (no freeing cost); pgtable frees them."
        ),
    }))
}

/// Writes `index.html`, the SVG files and `summary.md` into `dir`;
/// returns the number of charts.
pub fn write(dir: &Path, data: &Data) -> Result<usize, String> {
    let mut charts = Vec::new();
    if let Some(c) = peer_chart(data, "x86", "pgtable vs peers, x86_64 page tables (host)")? {
        charts.push(c);
    }
    if let Some(c) = peer_chart(data, "arm64", "pgtable vs peers, arm64 page tables (host)")? {
        charts.push(c);
    }
    for (arch, title) in [
        (
            "riscv-sv39",
            "pgtable vs peers, RISC-V Sv39 page tables (host)",
        ),
        (
            "riscv-sv48",
            "pgtable vs peers, RISC-V Sv48 page tables (host)",
        ),
    ] {
        if let Some(c) = peer_chart(data, arch, title)? {
            charts.push(c);
        }
    }
    // The size sweep.
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let per_page: Vec<(String, Vec<(f64, f64)>)> = [
        ("map-4K", "map"),
        ("unmap-4K", "unmap (frees tables)"),
        ("protect-4K", "protect (RW -> RO)"),
        ("move-pte", "move, PTE by PTE"),
        ("floor", "host floor: one 8-byte store per page"),
    ]
    .iter()
    .map(|(op, l)| {
        let pts = data
            .sweep
            .iter()
            .filter(|p| p.op == *op)
            .map(|p| (mib(p.bytes), p.ns))
            .collect();
        (l.to_string(), pts)
    })
    .filter(|(_, p): &(String, Vec<(f64, f64)>)| !p.is_empty())
    .collect();
    if !per_page.is_empty() {
        charts.push(Chart {
            file: "sweep-per-page.svg".into(),
            title: "Cost per 4 KiB page against size (pgtable, x86_64 format)".into(),
            svg: size_lines(
                "pgtable: ns per page against the size of one call",
                "ns per page (median)",
                &per_page,
                false,
            )?,
            caption: "One ranged call of each size; each timed sample is a batch of calls covering at least 1 GiB \
                      between one pair of clock reads. The algorithms do the same work per page at every size; where \
                      the tables outgrow the host's caches (1 GiB of 4 KiB pages needs 2 MiB of tables, 64 GiB needs \
                      128 MiB), every line rises with the host floor: one 8-byte store per page into a buffer as large \
                      as the tables (no page-table code)."
                .into(),
        });
    }
    let per_gib: Vec<(String, Vec<(f64, f64)>)> = [
        ("move", "move (PUD entries from 1 GiB, PMD below)"),
        ("move-pmd", "move, PMD entries only"),
    ]
    .iter()
    .map(|(op, l)| {
        let pts = data
            .sweep
            .iter()
            .filter(|p| p.op == *op)
            .map(|p| (mib(p.bytes), p.ns / 1000.0))
            .collect();
        (l.to_string(), pts)
    })
    .filter(|(_, p): &(String, Vec<(f64, f64)>)| !p.is_empty())
    .collect();
    if !per_gib.is_empty() {
        charts.push(Chart {
            file: "sweep-move.svg".into(),
            title: "Moving page tables: cost per GiB against size".into(),
            svg: size_lines(
                "pgtable move_page_tables: µs per GiB moved",
                "µs per GiB (median, log scale)",
                &per_gib,
                true,
            )?,
            caption: "Whole PMD or PUD entries move (Linux HAVE_MOVE_PMD / HAVE_MOVE_PUD): the cost per GiB stays flat \
                      from 1 GiB up, and is far below moving each PTE."
                .into(),
        });
    }
    // Table memory.
    if !data.memory.is_empty() {
        let mut subjects: Vec<(String, String)> = Vec::new();
        for m in &data.memory {
            let k = (m.arch.clone(), m.subject.clone());
            if !subjects.contains(&k) {
                subjects.push(k);
            }
        }
        let states = [
            ("mapped-4K", "1 GiB of 4 KiB pages mapped"),
            ("unmapped-4K", "after unmapping it"),
            ("mapped-2M", "1 GiB of 2 MiB blocks mapped"),
            ("unmapped-2M", "after unmapping it (blocks)"),
        ];
        let series: Vec<(String, Vec<Option<f64>>)> = states
            .iter()
            .map(|(st, l)| {
                let v = subjects
                    .iter()
                    .map(|(a, s)| {
                        data.memory
                            .iter()
                            .find(|m| &m.arch == a && &m.subject == s && m.state == *st)
                            .map(|m| m.bytes as f64 / 1024.0)
                    })
                    .collect();
                (l.to_string(), v)
            })
            .collect();
        let cats: Vec<String> = subjects.iter().map(|(a, s)| format!("{a}: {s}")).collect();
        charts.push(Chart {
            file: "memory.svg".into(),
            title: "Table memory held per GiB mapped, and after unmap".into(),
            svg: grouped_bars(
                "Table memory below the root, KiB per GiB",
                "KiB of tables",
                &cats,
                &series,
                false,
            )?,
            caption: "Counted by each subject's frame allocator. pgtable and aarch64-paging free the tables an unmap \
                      empties; the x86_64 crate (without clean_up) and page_table_multiarch keep them until cleaned \
                      up or the whole table is dropped."
                .into(),
        });
    }
    // The kernel against Linux.
    if let (Ok(k), Ok(l)) = (&data.kernel, &data.linux) {
        let cats: Vec<String> = ["PUD-aligned", "PMD-aligned", "PTE by PTE"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let series = vec![
            (
                format!("pgtable in the x86 kernel ({})", k.accel),
                k.moves.iter().map(|&v| Some(v as f64 / 1000.0)).collect(),
            ),
            (
                "Linux mremap on this host".to_string(),
                l.iter().map(|&v| Some(v as f64 / 1000.0)).collect(),
            ),
        ];
        charts.push(Chart {
            file: "kernel-vs-linux-move.svg".into(),
            title: "Moving 1 GiB of page tables: the x86 kernel against Linux".into(),
            svg: grouped_bars(
                "Move 1 GiB of 4 KiB pages, µs (median, log scale)",
                "µs",
                &cats,
                &series,
                true,
            )?,
            caption: format!(
                "The kernel's move_page_tables (TLB flush included) booted in QEMU ({}{}) next to Linux's own mremap of \
                 1 GiB measured in the same run on this host. Ratios matter more than absolute figures{}.",
                k.accel,
                if k.emulated { ", emulated timings" } else { "" },
                if k.emulated { " under emulation" } else { "" }
            ),
        });
    }
    if let Ok(k) = &data.kernel {
        let rows: Vec<&LinearRow> = k.linear.iter().collect();
        if !rows.is_empty() {
            let mut cats = Vec::new();
            for r in &rows {
                let m = if r.mapping.starts_with("1 GiB") {
                    "4K"
                } else {
                    "2M"
                };
                let c = format!("{m}: {}", r.variant);
                if !cats.contains(&c) {
                    cats.push(c);
                }
            }
            let val = |f: &dyn Fn(&LinearRow) -> u64| -> Vec<Option<f64>> {
                cats.iter()
                    .map(|c| {
                        rows.iter()
                            .find(|r| {
                                let m = if r.mapping.starts_with("1 GiB") {
                                    "4K"
                                } else {
                                    "2M"
                                };
                                format!("{m}: {}", r.variant) == *c
                            })
                            .map(|r| f(r) as f64)
                    })
                    .collect()
            };
            let series = vec![
                ("entries written".to_string(), val(&|r| r.entries)),
                ("tables allocated".to_string(), val(&|r| r.tables)),
                ("walker barriers".to_string(), val(&|r| r.barriers)),
            ];
            charts.push(Chart {
                file: "kernel-barriers.svg".into(),
                title: "Linear map creation in the x86 kernel: entries, tables, barriers".into(),
                svg: grouped_bars(
                    "Linear map: counts per variant (log scale)",
                    "count",
                    &cats,
                    &series,
                    true,
                )?,
                caption: "Counted by pgtable's stats in the kernel. A barrier per table instead of per entry (Linux \
                          \"arm64: mm: Batch dsb and isb when populating pgtables\"); x86 needs none, the \"with \
                          barriers\" rows count what an arm64-style format issues. A 0 is drawn at the floor."
                    .into(),
            });
        }
        if !k.mprotect.is_empty() {
            let cats: Vec<String> = k.mprotect.iter().map(|m| format!("{} MiB", m.0)).collect();
            let series = vec![
                (
                    "invalidate each block (generic)".to_string(),
                    k.mprotect.iter().map(|m| Some(m.1)).collect(),
                ),
                (
                    "one deferred flush".to_string(),
                    k.mprotect.iter().map(|m| Some(m.2)).collect(),
                ),
            ];
            charts.push(Chart {
                file: "kernel-mprotect.svg".into(),
                title: "Protection change of 2 MiB blocks in the x86 kernel".into(),
                svg: grouped_bars(
                    "mprotect of 2 MiB blocks, ms (mean, log scale)",
                    "ms",
                    &cats,
                    &series,
                    true,
                )?,
                caption: "Linux \"arm64: mm: rework the pmd protect changing flow\": one flush per change instead \
                          of a flush per block."
                    .into(),
            });
        }
    }
    for c in &charts {
        std::fs::write(dir.join(&c.file), &c.svg).map_err(|e| format!("{}: {e}", c.file))?;
    }
    let summary = summary_markdown(data);
    std::fs::write(dir.join("summary.md"), &summary).map_err(|e| format!("summary.md: {e}"))?;
    let html = html(data, &charts);
    std::fs::write(dir.join("index.html"), html).map_err(|e| format!("index.html: {e}"))?;
    Ok(charts.len())
}

/// One summary table per architecture: rows of (op, cells); a cell is a
/// figure and its ratio to pgtable.
fn summary_rows(data: &Data, arch: &str) -> (Vec<String>, Vec<(String, Vec<String>)>) {
    let subs: Vec<&str> = subjects(arch)
        .iter()
        .copied()
        .filter(|s| *s != "pgtable-user")
        .collect();
    let mut rows = Vec::new();
    for (op, label) in OPS {
        let g = format!("{arch}-{op}");
        let Some(base) = pgtable_ref(&data.criterion, arch, op) else {
            continue;
        };
        let mut cells = vec![short(base)];
        for s in &subs[1..] {
            cells.push(match find(&data.criterion, &g, s) {
                Some(v) => format!("{} ({:.1}×)", short(v), v / base),
                None => "–".into(),
            });
        }
        rows.push((label.to_string(), cells));
        if let Some(u) = find(&data.criterion, &g, "pgtable-user") {
            let mut cells = vec![short(u)];
            cells.extend(subs[1..].iter().map(|_| String::new()));
            rows.push((format!("{label}, user pages (atomic)"), cells));
        }
    }
    let heads = subs.iter().map(|s| subject_label(s)).collect();
    (heads, rows)
}

/// The rows of the granule table (`benches/granules.rs`): criterion group
/// suffix and label.
const GRANULE_OPS: [(&str, &str); 4] = [
    ("map", "map"),
    ("unmap", "unmap"),
    ("protect", "protect (RW ↔ RO)"),
    ("move", "move, PTE by PTE"),
];

/// The columns of the granule table: criterion function and heading.
const GRANULES: [(&str, &str); 3] = [
    ("4K", "4 KiB pages"),
    ("16K", "16 KiB pages (ratio to 4 KiB)"),
    ("64K", "64 KiB pages (ratio to 4 KiB)"),
];

/// The title of the granule table.
const GRANULE_TITLE: &str = "arm64 granules: ns per page";

/// What the granule table's rows measure.
const GRANULE_CAPTION: &str = "Median ns per page of the criterion groups arm64-granules-map, -unmap, -protect and \
     -move (functions 4K, 16K, 64K), lower is better; the ratio is to the 4 KiB figure. Host time: the arm64 formats' \
     tables in host memory, written and walked by the host CPU, no TLB maintenance. Each granule does the same number \
     of pages per call, mapped as pages without the contiguous hint, with one more page mapped after the range \
     throughout so the tables above the range's PTE tables never become empty. map: map the range (allocating its PTE \
     tables); unmap: unmap the mapped range (freeing and zeroing its PTE tables); protect: change every \
     page of the range from read-write to read-only or back; move: move_page_tables of the range to an address one \
     page past a multiple of the PMD size, so no PMD entry moves whole and every PTE is moved (Linux move_ptes).";

/// The granule table: one row per operation that has a figure, cells in
/// [`GRANULES`] order (the 4 KiB figure, then each other granule's figure
/// with its ratio to 4 KiB; `–` where a figure is missing).
fn granule_rows(data: &Data) -> Vec<(String, Vec<String>)> {
    let mut rows = Vec::new();
    for (op, label) in GRANULE_OPS {
        let g = format!("arm64-granules-{op}");
        let vals: Vec<Option<f64>> = GRANULES
            .iter()
            .map(|(f, _)| find(&data.criterion, &g, f))
            .collect();
        if vals.iter().all(Option::is_none) {
            continue;
        }
        let base = vals[0];
        let cells = vals
            .iter()
            .enumerate()
            .map(|(i, v)| match (*v, base) {
                (None, _) => "–".to_string(),
                (Some(v), Some(b)) if i > 0 && b > 0.0 => {
                    format!("{} ({:.2}×)", short(v), v / b)
                }
                (Some(v), _) => short(v),
            })
            .collect();
        rows.push((label.to_string(), cells));
    }
    rows
}

/// The summary tables as markdown.
pub fn summary_markdown(data: &Data) -> String {
    let mut md = String::new();
    for (arch, name) in [
        ("x86", "x86_64 page tables"),
        ("arm64", "arm64 page tables"),
        ("riscv-sv39", "RISC-V Sv39 page tables"),
        ("riscv-sv48", "RISC-V Sv48 page tables"),
    ] {
        let (heads, rows) = summary_rows(data, arch);
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            md,
            "**{name}** — ns per entry, median (ratio to pgtable; lower is better)\n"
        );
        let _ = writeln!(md, "| operation | {} |", heads.join(" | "));
        let _ = writeln!(md, "|---|{}", "---:|".repeat(heads.len()));
        for (op, cells) in rows {
            let _ = writeln!(md, "| {op} | {} |", cells.join(" | "));
        }
        md.push('\n');
    }
    let rows = granule_rows(data);
    if !rows.is_empty() {
        let _ = writeln!(md, "**{GRANULE_TITLE}**\n");
        let heads: Vec<&str> = GRANULES.iter().map(|(_, h)| *h).collect();
        let _ = writeln!(md, "| operation | {} |", heads.join(" | "));
        let _ = writeln!(md, "|---|{}", "---:|".repeat(heads.len()));
        for (op, cells) in rows {
            let _ = writeln!(md, "| {op} | {} |", cells.join(" | "));
        }
        let _ = writeln!(md, "\n{GRANULE_CAPTION}\n");
    }
    let _ = writeln!(
        md,
        "Host: {}; criterion medians of the thread's CPU time, `cargo xtask bench{}`. Same build for all (fat LTO, one codegen unit); every subject \
         zeroes new tables inside map; \"keeps empty tables\" pays nothing for freeing in unmap; pgtable's protect \
         uses plain stores on settled kernel entries (user pages: atomic).",
        data.cpu,
        if data.quick { " --quick" } else { "" }
    );
    md
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn html(data: &Data, charts: &[Chart]) -> String {
    let mut h = String::new();
    h.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>pgtable benchmark report</title>\n\
         <style>body{font-family:sans-serif;max-width:1250px;margin:2em auto;padding:0 1em;color:#222}\
         table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:.3em .6em}\
         td{text-align:right}td:first-child{text-align:left}figure{margin:2em 0}figcaption{color:#444;max-width:60em}\
         caption{caption-side:bottom;text-align:left;color:#444;padding-top:.4em}\
         .note{color:#555}</style></head><body>\n<h1>pgtable benchmark report</h1>\n",
    );
    let _ = writeln!(
        h,
        "<p class=\"note\">Host: {}. Made by <code>cargo xtask bench{}</code>{}.</p>",
        esc(&data.cpu),
        if data.quick { " --quick" } else { "" },
        if data.quick {
            " (short measurements and fewer sizes: indicative figures)"
        } else {
            ""
        }
    );
    h.push_str("<h2>Summary: pgtable against its peers</h2>\n");
    for (arch, name) in [
        ("x86", "x86_64 page tables"),
        ("arm64", "arm64 page tables"),
        ("riscv-sv39", "RISC-V Sv39 page tables"),
        ("riscv-sv48", "RISC-V Sv48 page tables"),
    ] {
        let (heads, rows) = summary_rows(data, arch);
        if rows.is_empty() {
            let _ = writeln!(h, "<p>{name}: no criterion results found.</p>");
            continue;
        }
        let _ = writeln!(
            h,
            "<h3>{name}</h3><table><tr><th>ns per entry, median (ratio to pgtable)</th>"
        );
        for hd in &heads {
            let _ = write!(h, "<th>{}</th>", esc(hd));
        }
        h.push_str("</tr>\n");
        for (op, cells) in rows {
            let _ = write!(h, "<tr><td>{}</td>", esc(&op));
            for c in cells {
                let _ = write!(h, "<td>{}</td>", esc(&c));
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n");
    }
    h.push_str(
        "<h3>How it is fair</h3><ul>\
         <li>Every subject is built alike: the workspace's bench profile (fat LTO, one codegen unit).</li>\
         <li>Zeroing new tables is inside the timed map for everyone: the x86_64 crate and page_table_multiarch zero a \
         table when they create it, so pgtable and aarch64-paging take frames from pools that zero on allocation. \
         Nobody zeroes on free.</li>\
         <li>Table freeing is labelled: pgtable, aarch64-paging and <i>x86_64 + clean_up</i> free the tables an unmap \
         empties; <i>x86_64</i> and page_table_multiarch keep them (no freeing cost). pgtable has no mode that keeps \
         them.</li>\
         <li>Atomic vs plain stores: pgtable's protect of kernel pages (accessed and dirty: the hardware never writes \
         them) uses plain stores; <i>user pages (atomic)</i> pays an atomic get-and-clear per entry, as an A/D-tracking \
         OS does. aarch64-paging swaps atomically (not A/D-safe); the x86_64 crate and page_table_multiarch use plain \
         read-modify-writes (not A/D-safe).</li>\
         <li>Reporting removed pages: pgtable's unmap does not visit entries of tables it frees whole; the \
         <i>unmap, report each page</i> row hands every page to the caller (the x86_64 crate returns each frame by \
         design).</li>\
         <li>The clock is amortised: every timed sample covers at least 16,000 entries (one 1 GiB call or a batch of \
         calls between one pair of clock reads). Host times are the benchmark thread's CPU time \
         (CLOCK_THREAD_CPUTIME_ID), so time spent waiting for a CPU on a shared machine is left out; caches are still \
         shared.</li>\
         <li>Each peer runs in its fastest documented usage (ranged calls where it has them); no TLB work on the \
         host.</li></ul>\n",
    );
    let rows = granule_rows(data);
    if !rows.is_empty() {
        let _ = write!(
            h,
            "<h2>{}</h2><table><caption>{}</caption><tr><th>operation</th>",
            esc(GRANULE_TITLE),
            esc(GRANULE_CAPTION)
        );
        for (_, hd) in GRANULES {
            let _ = write!(h, "<th>{}</th>", esc(hd));
        }
        h.push_str("</tr>\n");
        for (op, cells) in rows {
            let _ = write!(h, "<tr><td>{}</td>", esc(&op));
            for c in cells {
                let _ = write!(h, "<td>{}</td>", esc(&c));
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n");
    }
    h.push_str("<h2>Charts</h2>\n");
    for c in charts {
        let _ = writeln!(
            h,
            "<figure id=\"{}\"><h3>{}</h3>{}<figcaption>{} (<a href=\"{}\">SVG</a>)</figcaption></figure>",
            c.file.trim_end_matches(".svg"),
            esc(&c.title),
            c.svg,
            esc(&c.caption),
            c.file
        );
    }
    h.push_str("<h2>The x86 kernel and Linux, same run</h2>\n");
    match (&data.kernel, &data.linux) {
        (Ok(k), linux) => {
            let _ = writeln!(
                h,
                "<table><tr><th>1 GiB move, median</th><th>PUD path</th><th>PMD path</th><th>PTE path</th>\
                 <th>PMD / PUD</th><th>PTE / PUD</th></tr>"
            );
            let row = |name: &str, v: [f64; 3]| {
                format!(
                    "<tr><td>{}</td><td>{:.1} µs</td><td>{:.1} µs</td><td>{:.1} µs</td><td>{:.0}×</td><td>{:.0}×</td></tr>\n",
                    esc(name),
                    v[0] / 1e3,
                    v[1] / 1e3,
                    v[2] / 1e3,
                    v[1] / v[0].max(1.0),
                    v[2] / v[0].max(1.0)
                )
            };
            h.push_str(&row(
                &format!(
                    "pgtable, x86 kernel in QEMU ({}{})",
                    k.accel,
                    if k.emulated { ", emulated timings" } else { "" }
                ),
                k.moves.map(|v| v as f64),
            ));
            match linux {
                Ok(l) => h.push_str(&row("Linux mremap, this host", l.map(|v| v as f64))),
                Err(e) => {
                    let _ = writeln!(
                        h,
                        "<tr><td colspan=\"6\">Linux mremap: {}</td></tr>",
                        esc(e)
                    );
                }
            }
            h.push_str("</table>\n");
            let _ = writeln!(
                h,
                "<p>Entries written by the kernel's move benchmarks (map, fill and unmap included): PUD {} / PMD {} / PTE {}.</p>",
                k.entries_written[0], k.entries_written[1], k.entries_written[2]
            );
        }
        (Err(e), _) => {
            let _ = writeln!(
                h,
                "<p>The x86 kernel's benchmarks did not run: {}</p>",
                esc(e)
            );
        }
    }
    if !data.sweep.is_empty() {
        h.push_str("<h2>Size sweep (raw)</h2><table><tr><th>operation</th><th>bytes per call</th><th>ns</th><th>per</th></tr>\n");
        for p in &data.sweep {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{:.3}</td><td>{}</td></tr>",
                esc(&p.op),
                p.bytes,
                p.ns,
                esc(&p.unit)
            );
        }
        h.push_str("</table>\n");
    }
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(criterion: Vec<Est>) -> Data {
        Data {
            quick: false,
            criterion,
            sweep: Vec::new(),
            memory: Vec::new(),
            linux: Err("not run".into()),
            kernel: Err("not run".into()),
            cpu: "test CPU".into(),
        }
    }

    fn est(group: &str, function: &str, ns: f64) -> Est {
        Est {
            group: group.into(),
            function: function.into(),
            ns,
        }
    }

    /// Writes criterion's two files for `group/function` under `dir`: a
    /// whole-call median of `median` ns over `pages` elements.
    fn criterion_fixture(dir: &Path, group: &str, function: &str, pages: u64, median: f64) {
        let new = dir.join(group).join(function).join("new");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(
            new.join("benchmark.json"),
            format!(
                r#"{{"group_id":"{group}","function_id":"{function}","value_str":null,"throughput":{{"Elements":{pages}}},"full_id":"{group}/{function}"}}"#
            ),
        )
        .unwrap();
        std::fs::write(
            new.join("estimates.json"),
            format!(
                r#"{{"mean":{{"point_estimate":1.0,"standard_error":1.0}},"median":{{"confidence_interval":{{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":2.0}},"point_estimate":{median},"standard_error":1.0}}}}"#
            ),
        )
        .unwrap();
    }

    #[test]
    fn granule_table_is_per_page_with_ratios_to_4k() {
        // Medians of whole calls over 65,536 pages: 4K 209,715.2 ns (3.2
        // ns per page), 16K 157,286.4 ns (2.4), 64K 314,572.8 ns (4.8).
        let dir = std::env::temp_dir().join(format!("report-granules-{}", std::process::id()));
        let pages = 65_536;
        criterion_fixture(&dir, "arm64-granules-map", "4K", pages, 209_715.2);
        criterion_fixture(&dir, "arm64-granules-map", "16K", pages, 157_286.4);
        criterion_fixture(&dir, "arm64-granules-map", "64K", pages, 314_572.8);
        // A peer group's function of the same name is not a granule.
        criterion_fixture(&dir, "arm64-map-4K", "4K", pages, 1.0);
        let c = crate::data::read_criterion(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        let rows = granule_rows(&data(c));
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].0, "map");
        assert_eq!(rows[0].1, ["3.20", "2.40 (0.75×)", "4.80 (1.50×)"]);
    }

    #[test]
    fn granule_table_rows_follow_the_figures_there_are() {
        let d = data(vec![
            est("arm64-granules-move", "4K", 20.0),
            est("arm64-granules-move", "64K", 5.0),
            est("arm64-granules-unmap", "16K", 0.5),
            est("arm64-granules-map", "4K", 3.0),
            est("arm64-granules-map", "16K", 3.0),
            est("arm64-granules-map", "64K", 1.5),
        ]);
        let rows = granule_rows(&d);
        let ops: Vec<&str> = rows.iter().map(|(op, _)| op.as_str()).collect();
        // Table order, whatever the order of the figures; no protect row.
        assert_eq!(ops, ["map", "unmap", "move, PTE by PTE"]);
        assert_eq!(rows[0].1, ["3", "3 (1.00×)", "1.50 (0.50×)"]);
        // No 4 KiB figure: no ratio.
        assert_eq!(rows[1].1, ["–", "0.50", "–"]);
        assert_eq!(rows[2].1, ["20", "–", "5 (0.25×)"]);

        let md = summary_markdown(&d);
        assert!(md.contains(&format!("**{GRANULE_TITLE}**")), "{md}");
        assert!(
            md.contains("| map | 3 | 3 (1.00×) | 1.50 (0.50×) |"),
            "{md}"
        );
        assert!(md.contains(GRANULE_CAPTION), "{md}");
        let page = html(&d, &[]);
        assert!(
            page.contains("<h2>arm64 granules: ns per page</h2>"),
            "{page}"
        );
        assert!(
            page.contains("<td>move, PTE by PTE</td><td>20</td><td>–</td><td>5 (0.25×)</td>"),
            "{page}"
        );
    }

    #[test]
    fn no_granule_figures_no_granule_table() {
        let d = data(vec![est("arm64-map-4K", "pgtable", 2.0)]);
        assert!(granule_rows(&d).is_empty());
        assert!(!summary_markdown(&d).contains(GRANULE_TITLE));
        assert!(!html(&d, &[]).contains(GRANULE_TITLE));
    }
}
