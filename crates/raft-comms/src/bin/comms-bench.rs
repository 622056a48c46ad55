//! `comms-bench`: NCCL allreduce bus bandwidth of raft-comms, f32, from 8 B to 1 GiB, one JSON
//! line per size (rank 0 prints). Run under a launcher, one process per GPU:
//!
//! ```text
//! raft-run -n 2 comms-bench [--min-bytes 8] [--max-bytes 1073741824] [--iters N] [--warmup W]
//! ```
//!
//! Method (the same as `bench/torch_allreduce.py`, and as nccl-tests): in-place allreduce (sum)
//! of a zeroed buffer; `W` warm-up calls, a barrier, then `N` calls back to back and one wait;
//! time per call = the slowest rank's elapsed / N. `algbw` = bytes / time, `busbw` = algbw ×
//! 2(n−1)/n (the bytes each link carries in a ring allreduce). `N` defaults to 1000 calls for
//! small sizes down to 20 at 1 GiB.
use raft_comms::{Communicator, Launch, ReduceOp};
use raft_core::{DeviceResources, DeviceVec};
use std::process::ExitCode;
use std::time::Instant;

struct Options {
    min_bytes: usize,
    max_bytes: usize,
    iters: Option<usize>,
    warmup: usize,
}

fn parse() -> Result<Options, String> {
    let mut o = Options { min_bytes: 8, max_bytes: 1 << 30, iters: None, warmup: 5 };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |flag: &str| -> Result<usize, String> {
            let v = args.next().ok_or(format!("{flag} needs a value"))?;
            v.parse().map_err(|_| format!("{flag} {v}: expected a number"))
        };
        match a.as_str() {
            "--min-bytes" => o.min_bytes = num("--min-bytes")?.max(4),
            "--max-bytes" => o.max_bytes = num("--max-bytes")?,
            "--iters" => o.iters = Some(num("--iters")?.max(1)),
            "--warmup" => o.warmup = num("--warmup")?,
            _ => return Err(format!("unknown argument {a}\nusage: comms-bench [--min-bytes B] [--max-bytes B] [--iters N] [--warmup W]")),
        }
    }
    Ok(o)
}

/// Calls per size: about 256 MiB moved per size, between 20 and 1000 calls.
fn iterations(bytes: usize) -> usize {
    ((256usize << 20) / bytes).clamp(20, 1000)
}

fn run(o: Options) -> raft_error::Result<()> {
    let launch = Launch::from_env()?;
    let res = DeviceResources::on_device(launch.device()?)?;
    let comm = Communicator::from_env(&res)?;
    let (rank, world) = (comm.rank(), comm.size());
    let nccl = raft_comms::nccl_info()?;
    let nccl_version = format!("{}.{}.{}", nccl.version.0, nccl.version.1, nccl.version.2);
    if rank == 0 {
        eprintln!("comms-bench: {world} ranks, NCCL {nccl_version} from {}", nccl.library.display());
    }

    // Correctness first: ones summed over the ranks.
    let mut check = DeviceVec::from_host(&res, &vec![1.0f32; 1 << 16])?;
    comm.allreduce_in_place(&mut check, ReduceOp::Sum)?;
    comm.sync()?;
    if check.to_host()?.iter().any(|&x| x != world as f32) {
        return Err(raft_error::Error::new(raft_error::ErrorKind::Generic, "comms-bench", "the allreduce check failed"));
    }

    let mut slowest = DeviceVec::<f64>::zeros(&res, 1)?;
    let mut bytes = o.min_bytes.next_power_of_two();
    while bytes <= o.max_bytes {
        let count = bytes / std::mem::size_of::<f32>();
        let iters = o.iters.unwrap_or_else(|| iterations(bytes));
        let mut buf = DeviceVec::<f32>::zeros(&res, count)?;
        for _ in 0..o.warmup {
            comm.allreduce_in_place(&mut buf, ReduceOp::Sum)?;
        }
        comm.sync()?;
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..iters {
            comm.allreduce_in_place(&mut buf, ReduceOp::Sum)?;
        }
        comm.sync()?;
        let mine = start.elapsed().as_secs_f64() / iters as f64;
        slowest.copy_from_host(&[mine])?;
        comm.allreduce_in_place(&mut slowest, ReduceOp::Max)?;
        comm.sync()?;
        let time = slowest.to_host()?[0];
        let algbw = bytes as f64 / time / 1e9;
        let busbw = algbw * 2.0 * (world as f64 - 1.0) / world as f64;
        if rank == 0 {
            println!(
                "{{\"bench\":\"allreduce\",\"impl\":\"raft-comms\",\"dtype\":\"f32\",\"ranks\":{world},\"bytes\":{bytes},\
                 \"count\":{count},\"iters\":{iters},\"time_us\":{:.3},\"algbw_GBps\":{algbw:.3},\"busbw_GBps\":{busbw:.3},\
                 \"nccl\":\"{nccl_version}\"}}",
                time * 1e6
            );
        }
        bytes *= 2;
    }
    comm.release()
}

fn main() -> ExitCode {
    match parse() {
        Err(e) => {
            eprintln!("comms-bench: {e}");
            ExitCode::from(2)
        }
        Ok(o) => match run(o) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("comms-bench: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
