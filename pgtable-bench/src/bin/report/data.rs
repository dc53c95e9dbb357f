//! The figures of one `cargo xtask bench` run, read from what its steps
//! left behind: criterion's `target/criterion`, the sweep's CSV, Linux's
//! `mremap` medians and the x86 kernel's console (see [`read`]).

use std::path::{Path, PathBuf};

/// One criterion benchmark: its group, function and median per element.
#[derive(Clone, Debug)]
pub struct Est {
    /// The group (`x86-map-4K`).
    pub group: String,
    /// The function (`pgtable`).
    pub function: String,
    /// Median ns per element (page, block, move).
    pub ns: f64,
}

/// One point of the size sweep.
#[derive(Clone, Debug)]
pub struct SweepPoint {
    /// `map-4K`, `move`, ...
    pub op: String,
    /// Bytes per call.
    pub bytes: u64,
    /// Median ns per unit.
    pub ns: f64,
    /// `page` or `GiB`.
    pub unit: String,
}

/// Table memory of one subject in one state, bytes per GiB.
#[derive(Clone, Debug)]
pub struct Memory {
    /// `x86` or `arm64`.
    pub arch: String,
    /// The subject.
    pub subject: String,
    /// `mapped-4K`, `unmapped-4K`, `mapped-2M`, `unmapped-2M`.
    pub state: String,
    /// Bytes of table frames per GiB.
    pub bytes: u64,
}

/// One row of the kernel's linear-map table.
#[derive(Clone, Debug)]
pub struct LinearRow {
    /// `1 GiB, 4 KiB pages` or `pool, 2 MiB blocks`.
    pub mapping: String,
    /// `x86, per entry`, ... `with barriers, per table`.
    pub variant: String,
    /// Entries written.
    pub entries: u64,
    /// Tables allocated.
    pub tables: u64,
    /// Walker barriers issued.
    pub barriers: u64,
}

/// The x86 kernel's figures.
#[derive(Clone, Debug, Default)]
pub struct Kernel {
    /// The accelerator QEMU used (`kvm`, `kvm-pvm`, `tcg`).
    pub accel: String,
    /// Whether the kernel called its timings emulated.
    pub emulated: bool,
    /// Median ns of a 1 GiB move on the PUD, PMD and PTE paths.
    pub moves: [u64; 3],
    /// Entries written by each move benchmark (map, fill and unmap
    /// included).
    pub entries_written: [u64; 3],
    /// mprotect of 2 MiB blocks: MiB, generic ms, transaction ms.
    pub mprotect: Vec<(u64, f64, f64)>,
    /// The linear-map rows.
    pub linear: Vec<LinearRow>,
}

/// Everything the report shows.
#[derive(Debug)]
pub struct Data {
    /// `--quick`.
    pub quick: bool,
    /// The criterion medians.
    pub criterion: Vec<Est>,
    /// The size sweep.
    pub sweep: Vec<SweepPoint>,
    /// The table memory census.
    pub memory: Vec<Memory>,
    /// Linux mremap medians (ns): PUD-aligned, PMD-aligned, misaligned.
    pub linux: Result<[u128; 3], String>,
    /// The x86 kernel's figures.
    pub kernel: Result<Kernel, String>,
    /// The host's CPU model.
    pub cpu: String,
}

/// The report's inputs in `dir` (what `cargo xtask bench` writes there)
/// and criterion's output directory `criterion`:
///
/// - `sweep.csv`: the sweep binary's output (missing: the sweep failed);
/// - `linux-mremap.txt`: `ok PUD PMD PTE` (medians in ns) or `error MSG`;
/// - `kernel.txt`: `accel NAME`, then the x86 kernel's console lines, or
///   `error MSG`.
pub fn read(dir: &Path, criterion: &Path, quick: bool) -> Data {
    let text = |name: &str| std::fs::read_to_string(dir.join(name));
    let (sweep, memory) = text("sweep.csv")
        .map(|csv| parse_sweep(&csv))
        .unwrap_or_default();
    let linux = text("linux-mremap.txt")
        .map_err(|e| format!("linux-mremap.txt: {e}"))
        .and_then(|t| parse_linux(&t));
    let kernel = text("kernel.txt")
        .map_err(|e| format!("kernel.txt: {e}"))
        .and_then(|t| match t.strip_prefix("error ") {
            Some(e) => Err(e.trim_end().to_string()),
            None => {
                let mut lines = t.lines();
                let accel = lines
                    .next()
                    .and_then(|l| l.strip_prefix("accel "))
                    .unwrap_or("unknown")
                    .to_string();
                let rest: Vec<String> = lines.map(String::from).collect();
                Ok(parse_kernel(&rest, &accel))
            }
        });
    Data {
        quick,
        criterion: read_criterion(criterion),
        sweep,
        memory,
        linux,
        kernel,
        cpu: cpu_model(),
    }
}

/// `ok PUD PMD PTE` or `error MSG` (`linux-mremap.txt`).
pub fn parse_linux(text: &str) -> Result<[u128; 3], String> {
    if let Some(e) = text.strip_prefix("error ") {
        return Err(e.trim_end().to_string());
    }
    let v: Vec<u128> = text
        .strip_prefix("ok ")
        .ok_or_else(|| format!("linux-mremap.txt: unreadable {text:?}"))?
        .split_whitespace()
        .map(|n| n.parse().map_err(|e| format!("linux-mremap.txt: {e}")))
        .collect::<Result<_, _>>()?;
    v.try_into()
        .map_err(|v| format!("linux-mremap.txt: {v:?} is not three medians"))
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The string value of `"key":"..."` in `json`.
fn json_str(json: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let i = json.find(&pat)? + pat.len();
    let end = json[i..].find('"')?;
    Some(json[i..i + end].to_string())
}

/// The number after the first `"key":` at or after `from` in `json`.
fn json_num(json: &str, from: usize, key: &str) -> Option<f64> {
    let pat = format!("\"{key}\":");
    let i = json[from..].find(&pat)? + from + pat.len();
    let end = json[i..]
        .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
        .unwrap_or(json.len() - i);
    json[i..i + end].parse().ok()
}

/// Every `<group>/<function>/new/` of criterion's output directory: the
/// median of `estimates.json` divided by the elements of
/// `benchmark.json`'s throughput.
pub fn read_criterion(dir: &Path) -> Vec<Est> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if !p.is_dir() {
                continue;
            }
            if p.file_name().is_some_and(|n| n == "new") {
                if let Some(est) = read_one(&p) {
                    out.push(est);
                }
            } else if p.file_name().is_some_and(|n| n != "report") {
                stack.push(p);
            }
        }
    }
    out.sort_by(|a, b| (&a.group, &a.function).cmp(&(&b.group, &b.function)));
    out
}

fn read_one(new: &Path) -> Option<Est> {
    let bench = std::fs::read_to_string(new.join("benchmark.json")).ok()?;
    let est = std::fs::read_to_string(new.join("estimates.json")).ok()?;
    let group = json_str(&bench, "group_id")?;
    let function = json_str(&bench, "function_id")?;
    let elements = json_num(&bench, 0, "Elements").unwrap_or(1.0).max(1.0);
    let median = json_num(&est, est.find("\"median\"")?, "point_estimate")?;
    Some(Est {
        group,
        function,
        ns: median / elements,
    })
}

/// The `sweep,...` and `memory,...` lines of the sweep binary.
pub fn parse_sweep(csv: &str) -> (Vec<SweepPoint>, Vec<Memory>) {
    let (mut sweep, mut memory) = (Vec::new(), Vec::new());
    for l in csv.lines() {
        let f: Vec<&str> = l.trim().split(',').collect();
        match f.as_slice() {
            ["sweep", op, bytes, ns, unit] => {
                if let (Ok(bytes), Ok(ns)) = (bytes.parse(), ns.parse()) {
                    sweep.push(SweepPoint {
                        op: op.to_string(),
                        bytes,
                        ns,
                        unit: unit.to_string(),
                    });
                }
            }
            ["memory", arch, subject, state, bytes] => {
                if let Ok(bytes) = bytes.parse() {
                    memory.push(Memory {
                        arch: arch.to_string(),
                        subject: subject.to_string(),
                        state: state.to_string(),
                        bytes,
                    });
                }
            }
            _ => {}
        }
    }
    (sweep, memory)
}

/// The figures of the x86 kernel's benchmark tables (see
/// `examples/x86-kernel/src/bench.rs`).
pub fn parse_kernel(lines: &[String], accel: &str) -> Kernel {
    let mut k = Kernel {
        accel: accel.to_string(),
        ..Kernel::default()
    };
    let nums = |s: &str| -> Vec<f64> {
        s.split([' ', '/', 'x'])
            .filter_map(|t| t.trim().parse::<f64>().ok())
            .collect()
    };
    let mut sizes: Vec<u64> = Vec::new();
    let mut generic: Vec<f64> = Vec::new();
    for l in lines {
        let t = l.trim();
        if t.contains("== benchmarks (") {
            k.emulated = t.contains("EMULATED");
        } else if let Some(r) = t.strip_prefix("median ") {
            let v = nums(r);
            if v.len() == 3 {
                k.moves = [v[0] as u64, v[1] as u64, v[2] as u64];
            }
        } else if let Some(r) = t.split("entries written").nth(1) {
            let v = nums(r.rsplit(':').next().unwrap_or(""));
            if v.len() == 3 {
                k.entries_written = [v[0] as u64, v[1] as u64, v[2] as u64];
            }
        } else if let Some(r) = t.strip_prefix("memory size (MiB)") {
            sizes = nums(r).into_iter().map(|v| v as u64).collect();
        } else if let Some(r) = t.strip_prefix("invalidate-each (generic)") {
            generic = nums(r);
        } else if let Some(r) = t.strip_prefix("transaction (one deferred flush)") {
            let tx = nums(r);
            for ((mb, g), x) in sizes.iter().zip(&generic).zip(&tx) {
                k.mprotect.push((*mb, *g, *x));
            }
        } else {
            for mapping in ["1 GiB, 4 KiB pages", "pool, 2 MiB blocks"] {
                let Some(i) = t.find(mapping) else {
                    continue;
                };
                let row = &t[i..];
                let tokens: Vec<&str> = row.split_whitespace().collect();
                if tokens.len() < 5 {
                    continue;
                }
                let n = tokens.len();
                let last: Vec<u64> = tokens[n - 3..]
                    .iter()
                    .filter_map(|t| t.parse().ok())
                    .collect();
                if last.len() != 3 {
                    continue;
                }
                let variant = row[mapping.len()..]
                    .trim_start()
                    .split("  ")
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string();
                k.linear.push(LinearRow {
                    mapping: mapping.to_string(),
                    variant,
                    entries: last[0],
                    tables: last[1],
                    barriers: last[2],
                });
            }
        }
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criterion_median_per_element() {
        let dir = std::env::temp_dir().join(format!("xtask-crit-{}", std::process::id()));
        let new = dir.join("x86-map-4K/pgtable/new");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(
            new.join("benchmark.json"),
            r#"{"group_id":"x86-map-4K","function_id":"pgtable","value_str":null,"throughput":{"Elements":262144},"full_id":"x86-map-4K/pgtable"}"#,
        )
        .unwrap();
        std::fs::write(
            new.join("estimates.json"),
            r#"{"mean":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":2.0},"point_estimate":999.0,"standard_error":1.0},"median":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":2.0},"point_estimate":524288.0,"standard_error":1.0}}"#,
        )
        .unwrap();
        let v = read_criterion(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(
            (v[0].group.as_str(), v[0].function.as_str()),
            ("x86-map-4K", "pgtable")
        );
        assert_eq!(v[0].ns, 2.0);
    }

    #[test]
    fn kernel_tables_are_read() {
        let out = "\
== benchmarks (KVM, native TSC; TSC 2000000 kHz) ==
  median        1200        9000     1100000
entries written (whole benchmark incl. map/fill/unmap): 10 / 20 / 30
memory size (MiB)                         64       128       256       512
invalidate-each (generic)             1.0000    2.0000    4.0000    8.0000
transaction (one deferred flush)      0.1000    0.2000    0.4000    0.8000
1 GiB, 4 KiB pages   with barriers, per table          12.5      0.05    262657     514       514
";
        let lines: Vec<String> = out.lines().map(String::from).collect();
        let k = parse_kernel(&lines, "kvm");
        assert!(!k.emulated);
        assert_eq!(k.moves, [1200, 9000, 1_100_000]);
        assert_eq!(k.entries_written, [10, 20, 30]);
        assert_eq!(k.mprotect.len(), 4);
        assert_eq!(k.mprotect[3], (512, 8.0, 0.8));
        assert_eq!(k.linear.len(), 1);
        assert_eq!(k.linear[0].variant, "with barriers, per table");
        assert_eq!(
            (
                k.linear[0].entries,
                k.linear[0].tables,
                k.linear[0].barriers
            ),
            (262657, 514, 514)
        );
    }

    #[test]
    fn linux_medians_and_errors_are_read() {
        assert_eq!(
            parse_linux("ok 1000 2000 300000\n"),
            Ok([1000, 2000, 300000])
        );
        assert_eq!(parse_linux("error no mremap\n"), Err("no mremap".into()));
        assert!(parse_linux("ok 1 2\n").is_err());
    }

    #[test]
    fn a_run_directory_is_read_with_what_is_missing() {
        let dir = std::env::temp_dir().join(format!("report-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("linux-mremap.txt"), "ok 1 2 3\n").unwrap();
        std::fs::write(
            dir.join("kernel.txt"),
            "accel tcg\nentries written (whole benchmark incl. map/fill/unmap): 10 / 20 / 30\n",
        )
        .unwrap();
        let d = read(&dir, &dir.join("criterion"), true);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(d.quick && d.criterion.is_empty() && d.sweep.is_empty());
        assert_eq!(d.linux, Ok([1, 2, 3]));
        let k = d.kernel.unwrap();
        assert_eq!((k.accel.as_str(), k.entries_written), ("tcg", [10, 20, 30]));
    }

    #[test]
    fn sweep_lines_are_read() {
        let (s, m) = parse_sweep(
            "sweep,map-4K,2097152,1.5000,page\nmemory,x86,pgtable,mapped-4K,2105344\nnoise\n",
        );
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].bytes, s[0].ns), (2097152, 1.5));
        assert_eq!(m[0].bytes, 2105344);
    }
}
