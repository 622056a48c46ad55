//! Seed 2.2.2 on a machine of several GPUs: each resources object is really on its device (its
//! stream, handles, memory, defaults, jobs), the memory-resource rule applies per device, and the
//! exit waits for jobs on every device. With one GPU these print a SKIP line.
use raft::{current_device_resources, DeviceResources, DeviceVec};
use raft_tests::{require_gpu, run_scenario};
use std::time::Duration;

fn devices_or_skip() -> Option<usize> {
    let n = raft::device_count().ok()?;
    if n < 2 {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("SKIP {}: needs 2 or more GPUs, found {n}\n", std::thread::current().name().unwrap_or("?")).as_bytes(),
        );
        return None;
    }
    Some(n)
}

/// The device a device pointer lives on (cuPointerGetAttribute DEVICE_ORDINAL).
fn ordinal_of(ptr: u64) -> i32 {
    use cudarc::driver::sys::{cuPointerGetAttribute, CUpointer_attribute, CUresult};
    let mut ordinal: i32 = -1;
    // SAFETY: writes one int for a pointer the driver knows (a live allocation of the test).
    let rc =
        unsafe { cuPointerGetAttribute(&mut ordinal as *mut i32 as *mut _, CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) };
    assert_eq!(rc, CUresult::CUDA_SUCCESS);
    ordinal
}

#[test]
fn everything_of_a_resources_object_is_on_its_device() {
    require_gpu!();
    let Some(n) = devices_or_skip() else { return };
    for d in 0..n {
        let r = DeviceResources::on_device(d).unwrap();
        assert_eq!(r.stream().unwrap().context().ordinal(), d);
        let host: Vec<f32> = (0..4096).map(|i| i as f32).collect();
        let v = DeviceVec::from_host(&r, &host).unwrap();
        assert_eq!(ordinal_of(v.device_ptr()), d as i32, "array of device {d}");
        assert_eq!(v.to_host().unwrap(), host);
        assert!(!r.cublas_handle().unwrap().is_null());
        let job_device = r.spawn(raft::current_device).unwrap().join().unwrap().unwrap();
        assert_eq!(job_device, d, "the worker runs on the resources' device");
        r.release().unwrap();
    }
}

#[test]
fn round_robin_workers_each_get_defaults_on_their_device() {
    require_gpu!();
    let Some(n) = devices_or_skip() else { return };
    let threads: Vec<_> = (0..2 * n)
        .map(|i| {
            std::thread::spawn(move || {
                let d = i % n;
                let r = current_device_resources(d).unwrap();
                let v = DeviceVec::<u8>::zeros(&r, 1 << 16).unwrap();
                (d, r.device(), ordinal_of(v.device_ptr()), r.id())
            })
        })
        .collect();
    let mut ids = Vec::new();
    for t in threads {
        let (d, device, ordinal, id) = t.join().unwrap();
        assert_eq!((device, ordinal), (d, d as i32));
        ids.push(id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 2 * n, "each thread its own default");
}

#[test]
fn the_default_resource_rule_applies_per_device() {
    require_gpu!();
    let Some(_) = devices_or_skip() else { return };
    let c = run_scenario!("mr-two-devices", &[], Duration::from_secs(60));
    c.assert_code(0);
    assert_eq!(c.result("d0").as_deref(), Some("CudaAsync"));
    assert_eq!(c.result("dlast").as_deref(), Some("Managed"), "the user's resource on the last device is left alone");
}

#[test]
fn the_exit_waits_for_jobs_on_every_device() {
    require_gpu!();
    let Some(n) = devices_or_skip() else { return };
    let c = run_scenario!("jobs-every-device", &[("SCENARIO_WAIT", "10"), ("SCENARIO_JOB_SECS", "0.5")], Duration::from_secs(60));
    c.assert_code(0);
    for d in 0..n {
        assert_eq!(c.result(&format!("job_on_{d}")).as_deref(), Some("finished"));
    }
    assert!(c.stderr.contains("tearing down"), "{}", c.stderr);
}
