//! A user's program on raft: the ABI line of the build, the native stack it runs on, and, with
//! a GPU, a small round trip through device memory.
//!
//! Exit status: 0 when the round trip ran; 2 when the native stack cannot be loaded or there is
//! no usable driver or device (the error says which, on stderr); 1 when a step on the GPU failed.
use std::process::ExitCode;

/// Why the program stopped.
enum Stop {
    /// No native stack, no driver or no device: status 2.
    Unusable(String),
    /// A step on the GPU failed: status 1.
    Failed(raft::Error),
}

fn main() -> ExitCode {
    // Build facts: printed even when nothing native can be loaded.
    println!("{}", raft::abi().report_line());
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(Stop::Unusable(why)) => {
            eprintln!("raft-downstream: the native stack is not usable: {why}");
            ExitCode::from(2)
        }
        Err(Stop::Failed(e)) => {
            eprintln!("raft-downstream: FAILED: {e}");
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<(), Stop> {
    // The first native call: loads the shim, which loads RAFT's, RMM's and CUDA's libraries.
    let running = raft::running().map_err(|e| Stop::Unusable(e.to_string()))?;
    println!("CUDA runtime {} loaded, driver {}", running.cuda_runtime, running.driver.as_deref().unwrap_or("none"));
    let devices = match raft::device_count() {
        Ok(0) => return Err(Stop::Unusable("no CUDA device is visible".into())),
        Ok(n) => n,
        Err(e) => return Err(Stop::Unusable(e.to_string())),
    };
    println!("{devices} CUDA device(s)");
    let res = raft::DeviceResources::new().map_err(Stop::Failed)?;
    let host = [1.0f32, 2.0, 3.0, 4.0];
    let on_device = raft::DeviceVec::from_host(&res, &host).map_err(Stop::Failed)?;
    let back = on_device.to_host().map_err(Stop::Failed)?;
    println!("device {}: {host:?} to the GPU and back: {back:?}", res.device());
    if back != host {
        return Err(Stop::Failed(raft::Error::logic("raft-downstream", "the copy came back different")));
    }
    Ok(())
}
