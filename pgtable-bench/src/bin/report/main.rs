//! `report DIR CRITERION [--quick]`: draws the report of a `cargo xtask
//! bench` run into `DIR/index.html` (SVG charts) and `DIR/summary.md`, from
//! the figures the run's steps left in `DIR` and criterion's output
//! directory `CRITERION` (see [`data::read`]), and prints the summary.
//! `--quick`: the run was `cargo xtask bench --quick` (the report says
//! so).

mod data;
mod draw;

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let paths: Vec<&String> = args.iter().filter(|a| *a != "--quick").collect();
    let [dir, criterion] = paths.as_slice() else {
        eprintln!("usage: report DIR CRITERION [--quick]");
        return ExitCode::from(2);
    };
    let (dir, criterion) = (PathBuf::from(dir), PathBuf::from(criterion));
    let data = data::read(&dir, &criterion, quick);
    match draw::write(&dir, &data) {
        Ok(charts) => {
            println!();
            println!("{}", draw::summary_markdown(&data));
            println!(
                "report: {} ({charts} charts; summary in {})",
                dir.join("index.html").display(),
                dir.join("summary.md").display(),
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("report: error: {e}");
            ExitCode::FAILURE
        }
    }
}
