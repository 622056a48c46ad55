//! A user's example: the ABI line, the CUDA runtime loaded, and a small copy where there is a GPU.
fn main() -> raft::Result<()> {
    println!("{}", raft::abi().report_line());
    println!("CUDA runtime {}", raft::running()?.cuda_runtime);
    match raft::device_count() {
        Ok(n) if n > 0 => {
            let res = raft::DeviceResources::new()?;
            println!("copied back: {:?}", raft::DeviceVec::from_host(&res, &[1.5f64, 2.5])?.to_host()?);
        }
        Ok(_) => println!("no CUDA device: no copy"),
        Err(e) => println!("no copy: {e}"),
    }
    Ok(())
}
