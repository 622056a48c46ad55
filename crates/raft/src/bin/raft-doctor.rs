//! raft-doctor: shows the library doing its job on this machine, or says plainly what is wrong.
//!
//! Prints each device, the driver and runtime, the ABI tag built against and the one running,
//! where the native shim was loaded from and which RMM per-device map is in use, then runs a short real workload through the library (resources per device, a job, an
//! allocation through the default resource, a checked host↔device copy, a cuBLAS GEMM on the
//! resources' handle timed with `sync()`). `--json` prints the same as JSON.
//!
//! Exit status: 0 when everything ran, 2 when the native stack cannot be loaded or there is no
//! usable CUDA driver or device (said in one line), 1 when a step failed.
use raft::{DeviceResources, DeviceVec, Layout};
use serde_json::{json, Value};
use std::io::Write;
use std::time::Instant;

struct Report {
    json: bool,
    doc: serde_json::Map<String, Value>,
}

impl Report {
    fn line(&self, text: impl AsRef<str>) {
        if !self.json {
            println!("{}", text.as_ref());
        }
    }
    fn progress(&self, text: &str) {
        // Long steps show progress on stderr, so --json output stays clean.
        eprint!("{text} ... ");
        let _ = std::io::stderr().flush();
    }
    fn done(&self, text: &str) {
        eprintln!("{text}");
    }
}

fn device_info(r: &DeviceResources) -> raft::Result<Value> {
    let ctx = r.context();
    let d = r.device();
    let (free, total) = ctx.mem_get_info()?;
    let (major, minor) = ctx.compute_capability()?;
    Ok(json!({
        "device": d,
        "name": ctx.name()?,
        "memory_total_bytes": total,
        "memory_free_bytes": free,
        "compute_capability": format!("{major}.{minor}"),
        "memory_pools": raft::memory_pools_supported(d)?,
        "memory_resource": raft::memory::current(d)?.kind().to_string(),
        "pool_installed_by_raft": raft::installed_default(d),
    }))
}

/// The file that holds `address` (`dladdr`), if any loaded object does.
fn holder(address: usize) -> Option<String> {
    // SAFETY: an all-zero Dl_info is valid (pointers, null).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables; the address need not be mapped.
    let found = unsafe { libc::dladdr(address as *const libc::c_void, &mut info) } != 0;
    // SAFETY: on success dli_fname is null or a NUL-terminated path owned by the loader, alive
    // while the object stays loaded (the shim and RMM are never unloaded).
    (found && !info.dli_fname.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned())
}

/// Says in one line why nothing native can run, and exits with 2.
fn unusable(report: &mut Report, why: String) -> ! {
    report.doc.insert("error".into(), json!(why));
    if report.json {
        println!("{}", serde_json::to_string_pretty(&report.doc).unwrap_or_default());
    }
    eprintln!("raft-doctor: {why}");
    std::process::exit(2);
}

fn workload(report: &Report, r: &DeviceResources) -> raft::Result<Value> {
    let d = r.device();
    report.progress(&format!("device {d}: job"));
    let job_device = r.spawn({
        let r = r.clone();
        move || {
            r.sync()?;
            raft::current_device()
        }
    })?;
    let job_ran_on = job_device.join()??;
    report.done("ok");

    report.progress(&format!("device {d}: allocation and copy"));
    let n = 1 << 24;
    let host: Vec<f32> = (0..n).map(|i| (i % 4099) as f32).collect();
    let dev = DeviceVec::from_host(r, &host)?;
    let back = dev.to_host()?;
    let copy_ok = back == host;
    report.done(if copy_ok { "equal" } else { "DIFFERENT" });

    report.progress(&format!("device {d}: cuBLAS GEMM 4096³ fp32"));
    let m = 4096usize;
    let a = DeviceVec::from_host(r, &host[..m * m])?;
    let b = DeviceVec::from_host(r, &host[..m * m])?;
    let mut c = DeviceVec::<f32>::zeros(r, m * m)?;
    let gemm = |c: &mut DeviceVec<f32>| {
        raft::gemm(1.0f32, a.matrix(m, m, Layout::ColMajor)?, b.matrix(m, m, Layout::ColMajor)?, 0.0, c.matrix_mut(m, m, Layout::ColMajor)?)
    };
    let first = Instant::now();
    gemm(&mut c)?; // makes the cuBLAS handle
    r.sync()?;
    let first_ms = first.elapsed().as_secs_f64() * 1e3;
    let reps = 10;
    let t = Instant::now();
    for _ in 0..reps {
        gemm(&mut c)?;
    }
    r.sync()?;
    let secs = t.elapsed().as_secs_f64() / reps as f64;
    let tflops = 2.0 * (m as f64).powi(3) / secs / 1e12;
    // The product itself, not only its speed: a few entries against the host's sum (relative
    // 1e-3: twice the worst TF32 rounding of these non-negative sums, 2.4e-4, and tight enough
    // that a transposed result fails 4 of the 6 entries: the review, helper 94).
    let got = c.to_host()?;
    let at = |v: &[f32], row: usize, col: usize| f64::from(v[row + col * m]);
    let a_host = &host[..m * m];
    let gemm_ok = [(0, 0), (1, 2), (17, 4095), (4095, 0), (2048, 1024), (4095, 4095)].iter().all(|&(i, j)| {
        let want: f64 = (0..m).map(|k| at(a_host, i, k) * at(a_host, k, j)).sum();
        (at(&got, i, j) - want).abs() <= 1e-3 * want.abs().max(1.0)
    });
    report.done(&format!("{tflops:.1} TFLOP/s, product {}", if gemm_ok { "right" } else { "WRONG" }));
    Ok(json!({
        "device": d,
        "job_ran_on_device": job_ran_on,
        "copy_64_MiB_equal": copy_ok,
        "gemm_4096_fp32_right": gemm_ok,
        "gemm_4096_fp32_tflops": tflops,
        "first_gemm_with_handle_ms": first_ms,
        "memory_resource_after": raft::memory::current(d)?.kind().to_string(),
    }))
}

fn main() {
    // `args_os`: `std::env::args` panics on an argument that is not UTF-8 (helper 111).
    let json_out = std::env::args_os().any(|a| a == "--json");
    let mut report = Report { json: json_out, doc: serde_json::Map::new() };
    let built = raft::abi();
    report.doc.insert("abi_built".into(), serde_json::to_value(&built).unwrap_or(Value::Null));
    report.line(format!("raft-rs {}: built against {}", env!("CARGO_PKG_VERSION"), built.report_line()));
    report.line(format!(
        "  cuda runtime headers {}, handle size {} bytes, RMM ABI {}",
        built.cuda_runtime, built.handle_size, built.rmm_abi_namespace
    ));

    let run = match raft::running() {
        Ok(run) => run,
        // The shim or the libraries it needs are missing: the error says which, and what to set.
        Err(e) => unusable(&mut report, format!("the native stack is not usable: {}", e.message())),
    };
    report.doc.insert("running".into(), serde_json::to_value(&run).unwrap_or(Value::Null));
    report.line(format!("  running on CUDA runtime {}, driver {}", run.cuda_runtime, run.driver.as_deref().unwrap_or("none")));
    if run.cuda_runtime != built.cuda_runtime {
        report.line(format!("  MISMATCH cuda-runtime: built for {}, running {}", built.cuda_runtime, run.cuda_runtime));
    }
    if let Some(shim) = raft_sys::loaded_from() {
        report.doc.insert("shim".into(), json!(shim.display().to_string()));
        report.line(format!("  native shim: {}", shim.display()));
    }
    // One RMM per process: RMM's map is a GNU "unique" symbol, so every object loaded with the
    // symbol visible (librmm.so, the shim, cuVS, a Python extension) binds the first definition
    // loaded; the file says which one that was.
    match raft::memory::rmm_map_address() {
        Ok(address) => {
            let file = holder(address);
            report.doc.insert("rmm_map".into(), json!({ "address": format!("{address:#x}"), "file": file }));
            report.line(format!("  RMM per-device map: {address:#x} in {}", file.as_deref().unwrap_or("(no loaded object)")));
        }
        Err(e) => report.line(format!("  RMM per-device map: unknown ({e})")),
    }
    report.line(format!("  exit wait: {}", raft::exit::current_exit_wait().map(|w| format!("{w} s")).unwrap_or_else(|e| e.to_string())));

    let count = match raft::device_count() {
        Ok(n) if n > 0 => n,
        Ok(_) => unusable(&mut report, "no usable GPU: no CUDA device is visible".into()),
        Err(e) => unusable(&mut report, format!("no usable GPU: {}", e.message())),
    };

    let mut devices = Vec::new();
    let mut workloads = Vec::new();
    let mut errors = Vec::new();
    let mut failed = false;
    for d in 0..count {
        let step = DeviceResources::on_device(d).and_then(|r| {
            let info = device_info(&r)?;
            report.line(format!(
                "device {d}: {} ({:.1} GiB, compute {}), memory pools {}, RMM resource {}",
                info["name"].as_str().unwrap_or("?"),
                info["memory_total_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64,
                info["compute_capability"].as_str().unwrap_or("?"),
                if info["memory_pools"].as_bool() == Some(true) { "yes" } else { "no" },
                info["memory_resource"].as_str().unwrap_or("?"),
            ));
            devices.push(info);
            let w = workload(&report, &r)?;
            // Each claim of the line checked: the job's device, the copy, the product.
            let job_ok = w["job_ran_on_device"].as_u64() == Some(d as u64);
            let copy_ok = w["copy_64_MiB_equal"].as_bool() == Some(true);
            let gemm_ok = w["gemm_4096_fp32_right"].as_bool() == Some(true);
            report.line(format!(
                "  workload: job {} (on device {}), 64 MiB copy {}, GEMM 4096³ fp32 {} at {:.1} TFLOP/s (first call with handle {:.1} ms)",
                if job_ok { "ok" } else { "ON ANOTHER DEVICE" },
                w["job_ran_on_device"],
                if copy_ok { "equal" } else { "DIFFERENT" },
                if gemm_ok { "right" } else { "WRONG" },
                w["gemm_4096_fp32_tflops"].as_f64().unwrap_or(0.0),
                w["first_gemm_with_handle_ms"].as_f64().unwrap_or(0.0),
            ));
            if !(job_ok && copy_ok && gemm_ok) {
                failed = true;
            }
            workloads.push(w);
            r.release()
        });
        if let Err(e) = step {
            report.line(format!("device {d}: FAILED: {e}"));
            errors.push(json!({ "device": d, "error": e.to_string() })); // in the JSON too
            failed = true;
        }
    }
    report.doc.insert("devices".into(), Value::Array(devices));
    report.doc.insert("errors".into(), Value::Array(errors));
    report.doc.insert("workloads".into(), Value::Array(workloads));
    report.doc.insert("ok".into(), json!(!failed));
    if json_out {
        println!("{}", serde_json::to_string_pretty(&report.doc).unwrap_or_default());
    } else {
        report.line(if failed { "raft-doctor: FAILED" } else { "raft-doctor: all good" });
    }
    std::process::exit(if failed { 1 } else { 0 });
}
