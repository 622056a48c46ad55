//! A user's integration test: it runs where the native stack was at build time, with no
//! LD_LIBRARY_PATH and no build script.

#[test]
fn the_stack_loads_and_a_copy_round_trips_where_there_is_a_gpu() {
    let abi = raft::abi();
    println!("{}", abi.report_line());
    let running = raft::running().expect("the native shim loads without LD_LIBRARY_PATH");
    assert_eq!(running.cuda_runtime, abi.cuda_runtime, "the CUDA runtime built against is the one loaded");
    match raft::device_count() {
        Ok(n) if n > 0 => {
            let res = raft::DeviceResources::new().unwrap();
            let v = raft::DeviceVec::from_host(&res, &[7u32, 8, 9]).unwrap();
            assert_eq!(v.to_host().unwrap(), [7, 8, 9]);
        }
        Ok(_) => println!("SKIP the copy: no CUDA device"),
        Err(e) => {
            assert_eq!(e.kind(), raft::ErrorKind::Cuda, "{e}");
            println!("SKIP the copy: {e}");
        }
    }
}
