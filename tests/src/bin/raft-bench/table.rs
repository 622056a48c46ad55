//! The rows raft-bench reports (a target met or a ratio only reported) and the Markdown it prints:
//! the row names, columns and JSON keys are what scripts/gpu-session.sh and the docs read.
use crate::measure::{show, Stat};

#[derive(serde::Serialize)]
pub struct Row {
    case: String,
    ours: String,
    ours_stat: Stat,
    baselines: Vec<(String, Stat)>,
    /// ours / the baseline named in `against`.
    ratio: Option<f64>,
    against: String,
    target: String,
    met: Option<bool>,
}

pub struct Table {
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

impl Table {
    /// A row with a target: `ok(ours, against)` says whether it is met.
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &mut self,
        case: &str,
        ours: &str,
        s: Stat,
        baselines: Vec<(&str, Stat)>,
        against: &str,
        target: &str,
        ok: impl Fn(f64, f64) -> bool,
    ) {
        // A row marked reported is never judged met or not (`report`).
        assert!(!target.starts_with("reported"), "{case}: a reported row takes `report`, not a target");
        self.push(case, ours, s, baselines, against, target, Some(&ok));
    }

    /// A row reported without a target (the ratio to `against` is shown, nothing is met).
    pub fn report(&mut self, case: &str, ours: &str, s: Stat, baselines: Vec<(&str, Stat)>, against: &str, target: &str) {
        self.push(case, ours, s, baselines, against, target, None);
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        case: &str,
        ours: &str,
        s: Stat,
        baselines: Vec<(&str, Stat)>,
        against: &str,
        target: &str,
        ok: Option<&dyn Fn(f64, f64) -> bool>,
    ) {
        let base = baselines.iter().find(|(n, _)| *n == against).map(|(_, b)| b.median_ns);
        let ratio = base.map(|b| s.median_ns / b);
        let met = base.and_then(|b| ok.map(|ok| ok(s.median_ns, b)));
        eprintln!("  {case}: {} {}", show(&s), ratio.map(|r| format!("({r:.2}x {against})")).unwrap_or_default());
        self.rows.push(Row {
            case: case.into(),
            ours: ours.into(),
            ours_stat: s,
            baselines: baselines.into_iter().map(|(n, b)| (n.to_string(), b)).collect(),
            ratio,
            against: against.into(),
            target: target.into(),
            met,
        });
    }

    /// The rows, the scale table and the notes, as Markdown on stdout.
    pub fn print(&self, scale: &[serde_json::Value]) {
        println!("| case | this project | median [min, max] per call | baseline(s) | ratio | target | met |");
        println!("| --- | --- | --- | --- | --- | --- | --- |");
        for row in &self.rows {
            let bases: Vec<String> = row.baselines.iter().map(|(n, s)| format!("{n}: {}", show(s))).collect();
            println!(
                "| {} | {} | {} | {} | {} | {} | {} |",
                row.case,
                row.ours,
                show(&row.ours_stat),
                if bases.is_empty() { "—".into() } else { bases.join("; ") },
                row.ratio.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "—".into()),
                row.target,
                match row.met {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "—",
                }
            );
        }
        println!();
        println!("| resources alive | ours: create all | C++: create all | ours: device memory, no handles | ours: with a cuBLAS handle each | C++: with a cuBLAS handle each | process wall (make, exit) |");
        println!("| --- | --- | --- | --- | --- | --- | --- |");
        for s in scale {
            if let Some(needs) = s["skipped_needs_bytes"].as_u64() {
                println!(
                    "| {} | skipped: ours (kept) and C++'s handles need about {} GiB, {} GiB free | | | | | |",
                    s["count"],
                    needs >> 30,
                    s["free_bytes"].as_u64().unwrap_or(0) >> 30
                );
                continue;
            }
            println!(
                "| {} | {:.2} ms | {:.2} ms | {:.1} MiB | {:.1} MiB | {:.1} MiB | {} |",
                s["count"],
                s["ours_create_ms"].as_f64().unwrap(),
                s["cpp_create_ms"].as_f64().unwrap(),
                s["ours_bytes_no_handles"].as_f64().unwrap() / 1048576.0,
                s["ours_bytes_with_cublas"].as_f64().unwrap() / 1048576.0,
                s["cpp_bytes_with_cublas"].as_f64().unwrap() / 1048576.0,
                s["process_with_count_resources_wall_ms"].as_f64().map(|v| format!("{v:.0} ms")).unwrap_or_else(|| "—".into()),
            );
        }
        println!();
        for n in &self.notes {
            println!("- {n}");
        }
    }
}
