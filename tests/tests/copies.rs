//! Host memory and copies at the speed of the link (issue 16): page-locked host arrays and
//! registered slices, asynchronous copies that own or scope-borrow their ends, device-to-device
//! and peer copies, pageable slices staged through page-locked buffers, and what happens to a
//! copy whose ends are dropped, whose resources are released, or which is in flight at exit.
//!
//! Data is a per-size pattern that differs between the two ends of every copy, so a copy that
//! did not happen, happened twice, or wrote freed memory that was reused shows as wrong data
//! (and as a compute-sanitizer report under memcheck).
use raft::{gemm, DeviceResources, DeviceVec, ErrorKind, HostStores, Layout, PinnedVec, RegisteredSlice, Staging};
use raft_tests::patterns::{pattern_f32, pattern_u32, pattern_u8, same, SIZES};
use raft_tests::require_gpu;
use raft_tests::OutputWithin;
use std::time::{Duration, Instant};

/// Runs `body` with `staging` as the process's setting (`Staging::set_current`), then puts the
/// old one back, also when `body` panics. The setting is the process's: the tests of this
/// binary that change it take turns.
fn with_staging<R>(staging: Staging, body: impl FnOnce() -> R) -> R {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    struct Restore(Staging);
    impl Drop for Restore {
        fn drop(&mut self) {
            Staging::set_current(self.0);
        }
    }
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _restore = Restore(Staging::set_current(staging));
    body()
}

/// Every size class: empty, tiny, odd, one past a page multiple, past 1 Mi, past 64 Mi elements.
#[test]
fn pinned_round_trips_every_size_class_both_ways() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    for n in SIZES {
        let want = pattern_f32(n, n as u32);
        // Owning transfers: host -> device -> host.
        let host = PinnedVec::from_slice(&res, &want).unwrap();
        assert_eq!(host.len(), n);
        same("PinnedVec::from_slice", &host.to_vec(), &want);
        let dev = DeviceVec::from_host(&res, &pattern_f32(n, 7)).unwrap();
        let (host, dev) = res.transfer_to_device(host, dev).unwrap().wait().unwrap();
        same(&format!("{n}: pinned -> device"), &dev.to_host().unwrap(), &want);
        let back = PinnedVec::from_slice(&res, &pattern_f32(n, 9)).unwrap();
        let (dev, back) = res.transfer_to_host(dev, back).unwrap().wait().unwrap();
        same(&format!("{n}: device -> pinned"), &back.to_vec(), &want);
        // The blocking copies take a PinnedVec as they take a slice; the deprecated aliases
        // still work.
        let mut dev2 = DeviceVec::<f32>::zeros(&res, n).unwrap();
        dev2.copy_from_host(&host).unwrap();
        let mut back2 = PinnedVec::<f32>::new(&res, n).unwrap();
        assert!(back2.iter().all(|x| x == 0.0), "{n}: PinnedVec::new is zeroed");
        dev2.copy_to_host(&mut back2).unwrap();
        same(&format!("{n}: blocking copies through a PinnedVec"), &back2.to_vec(), &want);
        same(&format!("{n}: from_host of a PinnedVec"), &DeviceVec::from_host(&res, &host).unwrap().to_host().unwrap(), &want);
        #[allow(deprecated)]
        {
            let mut dev4 = DeviceVec::<f32>::zeros(&res, n).unwrap();
            dev4.copy_from_pinned(&host).unwrap();
            let mut back4 = PinnedVec::<f32>::new(&res, n).unwrap();
            dev4.copy_to_pinned(&mut back4).unwrap();
            same(&format!("{n}: the deprecated copy_from_pinned / copy_to_pinned"), &back4.to_vec(), &want);
        }
        // Scoped copies, both ways in one scope.
        let mut dev3 = DeviceVec::<f32>::zeros(&res, n).unwrap();
        let mut back3 = PinnedVec::<f32>::new(0, n).unwrap();
        res.copy_scope(|s| {
            s.to_device(&host, &mut dev3)?;
            s.to_host(&dev, &mut back3)
        })
        .unwrap();
        same(&format!("{n}: scoped pinned -> device"), &dev3.to_host().unwrap(), &want);
        same(&format!("{n}: scoped device -> pinned"), &back3.to_vec(), &want);
    }
}

#[test]
fn pageable_staged_round_trips_every_size_class_both_ways() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    // Among them more threads (64) than the staging pool has: the copy must not wait for a
    // thread that has not started.
    let stagings = [
        Staging::default(),
        Staging::new(64 << 10, 1).unwrap(),
        Staging::new(1 << 20, 3).unwrap(),
        Staging::new(16 << 20, 8).unwrap(),
        Staging::new(64 << 10, 64).unwrap(),
        Staging::new(1 << 20, 4).unwrap().with_pieces_in_flight(8).unwrap(),
    ];
    for n in SIZES {
        let bytes = pattern_u8(n, 3);
        let words = pattern_u32(n, 5);
        // The defaults.
        let d = DeviceVec::from_host(&res, &bytes).unwrap();
        same(&format!("{n} u8: staged in"), &d.to_host().unwrap(), &bytes);
        // Every size staged, as the threshold says.
        for s in stagings.map(|s| s.with_staged_from(0)) {
            with_staging(s, || {
                let mut d = DeviceVec::from_host(&res, &pattern_u32(n, 11)).unwrap();
                d.copy_from_host(&words).unwrap();
                same(&format!("{n} u32 {s:?}: staged in"), &d.to_host().unwrap(), &words);
                let mut out = pattern_u32(n, 13);
                d.copy_to_host(&mut out).unwrap();
                same(&format!("{n} u32 {s:?}: staged out"), &out, &words);
                same(&format!("{n} u32 {s:?}: to_host"), &d.to_host().unwrap(), &words);
                same(&format!("{n} u32 {s:?}: from_host"), &DeviceVec::from_host(&res, &words).unwrap().to_host().unwrap(), &words);
            });
        }
    }
}

/// `from_host`, `to_host`, `copy_from_host` and `copy_to_host` stage pageable copies from
/// `DeviceVec::STAGED_FROM_BYTES` on and copy page-locked memory directly: both sides of the
/// threshold, odd lengths, and a `PinnedVec`'s slice as the host side.
#[test]
fn the_plain_copies_are_right_on_both_sides_of_the_staging_threshold() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let at = DeviceVec::<u8>::STAGED_FROM_BYTES;
    for n in [at - 1, at, at + 3, (64 << 20) + 5] {
        let want = pattern_u8(n, 17);
        let mut d = DeviceVec::from_host(&res, &want).unwrap();
        same(&format!("{n} u8: from_host, to_host"), &d.to_host().unwrap(), &want);
        let other = pattern_u8(n, 19);
        d.copy_from_host(&other).unwrap();
        let mut out = vec![0u8; n];
        d.copy_to_host(&mut out).unwrap();
        same(&format!("{n} u8: copy_from_host, copy_to_host"), &out, &other);
        // Page-locked host memory goes the direct way, both directions.
        let mut pinned = PinnedVec::<u8>::from_slice(&res, &want).unwrap();
        d.copy_from_host(&pinned).unwrap();
        same(&format!("{n} u8: to_host after a pinned copy in"), &d.to_host().unwrap(), &want);
        d.copy_from_host(&other).unwrap();
        d.copy_to_host(&mut pinned).unwrap();
        same(&format!("{n} u8: a pinned copy out"), &pinned.to_vec(), &other);
    }
    let words = pattern_f32((16 << 20) + 1, 23);
    same("f32 64 MiB + 4 B", &DeviceVec::from_host(&res, &words).unwrap().to_host().unwrap(), &words);
}

/// A `PinnedVec` read and written by value on the host (it gives no safe slice): `get`, `set`,
/// `fill`, `iter`, `to_vec`, `copy_from_slice`, `copy_to_slice`, with `Logic` errors for an
/// index past the end and lengths that differ.
#[test]
fn pinned_vecs_are_read_and_written_by_value() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let mut p = PinnedVec::<u32>::new(&res, 5).unwrap();
    assert_eq!((p.len(), p.get(0), p.get(5)), (5, Some(0), None));
    p.set(4, 9).unwrap();
    let e = p.set(5, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert_eq!(p.to_vec(), [0, 0, 0, 0, 9]);
    p.fill(7);
    assert!(p.iter().all(|x| x == 7));
    p.copy_from_slice(&[1, 2, 3, 4, 5]).unwrap();
    let mut out = [0u32; 5];
    p.copy_to_slice(&mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4, 5]);
    for e in [p.copy_from_slice(&[1, 2]).unwrap_err(), p.copy_to_slice(&mut [0; 6]).unwrap_err()] {
        assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
        assert!(e.to_string().starts_with("PinnedVec::copy_"), "{e}");
    }
    assert_eq!(p.iter().collect::<Vec<_>>(), [1, 2, 3, 4, 5], "a refused copy changed nothing");
}

/// A zero-sized element type (the `DeviceScalar` contract allows one): 0 bytes, so the shim
/// allocates nothing and the buffer's address is null, yet `len` elements are handed out. Their
/// slice starts at a dangling, aligned pointer, never at null (the sixteenth session's audit:
/// null is undefined behaviour even for a slice that spans no byte).
#[test]
fn a_pinned_vec_of_a_zero_sized_type_hands_out_its_elements() {
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    struct Unit;
    // SAFETY: zero-sized: no bytes, so no invalid bit pattern and no padding; owns nothing.
    unsafe impl raft::DeviceScalar for Unit {}
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let mut p = PinnedVec::<Unit>::new(&res, 4).unwrap();
    assert_eq!((p.len(), p.get(3), p.get(4)), (4, Some(Unit), None));
    p.set(2, Unit).unwrap();
    assert_eq!(p.to_vec(), [Unit; 4]);
    assert_eq!(p.iter().count(), 4);
}

/// Staged copies with every kind of host store are exact and write nothing outside their
/// range: lengths around the streaming threshold (4 KiB) and the pieces, host slices at odd
/// addresses (the streaming stores' unaligned head and tail), sizes on both sides of where
/// `Auto` changes kind (32 MiB up, 4 MiB down).
#[test]
fn staged_copies_are_right_with_every_kind_of_host_store() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    for kind in [HostStores::Plain, HostStores::Streaming, HostStores::Auto] {
        for staging in [Staging::default(), Staging::new(1 << 20, 4).unwrap()] {
            // Every size staged (the threshold at 0).
            let s = staging.with_host_stores(kind, kind).with_staged_from(0);
            for n in [1usize, 4095, 4096 + 3, (1 << 20) + 7, (5 << 20) + 5, (33 << 20) + 1] {
                for off in [0usize, 3] {
                    let what = format!("{kind:?}, {} MiB pieces, {n} bytes at offset {off}", s.chunk_bytes() >> 20);
                    let backing = pattern_u8(n + off, 29 + off as u32);
                    let src = &backing[off..];
                    let mut d = DeviceVec::<u8>::zeros(&res, n).unwrap();
                    with_staging(s, || d.copy_from_host(src)).unwrap();
                    // Read back into page-locked memory (a direct copy, no staging), then through
                    // the same staging into a slice with guard bytes on both sides.
                    let mut direct = PinnedVec::<u8>::new(&res, n).unwrap();
                    d.copy_to_host(&mut direct).unwrap();
                    same(&format!("{what}: staged up"), &direct.to_vec(), src);
                    let mut out = vec![0xC3u8; off + n + 64];
                    with_staging(s, || d.copy_to_host(&mut out[off..off + n])).unwrap();
                    same(&format!("{what}: staged down"), &out[off..off + n], src);
                    assert!(out[..off].iter().chain(&out[off + n..]).all(|&b| b == 0xC3), "{what}: a byte outside the range was written");
                }
            }
        }
    }
}

/// A copy with host memory is refused (`Logic`) while a stream it would run on or join is being
/// captured into a CUDA graph (cudarc's `begin_capture` on the array's stream): captured, it
/// would run at each launch of the graph, after the host memory's borrow has ended, and the
/// waits of the copy would wait for nothing. Scoped (the path of owned copies too), blocking and
/// staged copies, both directions; after the capture has ended they all run. (Before the fix the scoped copy was
/// captured, the scope returned `Ok`, and the graph wrote into the `PinnedVec` after it was
/// dropped.)
#[test]
fn staged_copies_are_ordered_after_the_work_queued_on_the_array() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    // A slow GEMM writes C; the staged read queued right after must see its result.
    let n = 2048;
    let a = DeviceVec::from_host(&res, &vec![1.0f32; n * n]).unwrap();
    let b = DeviceVec::from_host(&res, &vec![2.0f32; n * n]).unwrap();
    let mut c = DeviceVec::<f32>::zeros(&res, n * n).unwrap();
    gemm(
        1.0,
        a.matrix(n, n, Layout::RowMajor).unwrap(),
        b.matrix(n, n, Layout::RowMajor).unwrap(),
        0.0,
        c.matrix_mut(n, n, Layout::RowMajor).unwrap(),
    )
    .unwrap();
    let out = with_staging(Staging::new(1 << 20, 4).unwrap(), || c.to_host()).unwrap();
    assert!(out.iter().all(|x| *x == 2.0 * n as f32), "the staged copy ran before the GEMM finished");
}

/// A staged copy started on a thread of someone else's thread pool (a rayon `par_iter`) runs
/// on the staging crew, or (while another copy holds the crew) on plain threads of its own, and
/// finishes, however busy that pool is.
#[test]
fn staged_copies_from_inside_a_thread_pool_finish() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let pool = rayon_core::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let want = pattern_u32((8 << 20) + 7, 29);
    let (tx, rx) = std::sync::mpsc::channel();
    pool.scope(|s| {
        for k in 0..4u32 {
            let (res, want, tx) = (res.clone(), &want, tx.clone());
            s.spawn(move |_| {
                let mut d = DeviceVec::<u32>::zeros(&res, want.len()).unwrap();
                d.copy_from_host(want).unwrap();
                let mut out = vec![k; want.len()];
                d.copy_to_host(&mut out).unwrap();
                tx.send(out == *want).unwrap();
            });
        }
    });
    drop(tx);
    let ok: Vec<bool> = rx.iter().collect();
    assert_eq!(ok, vec![true; 4]);
}

/// Staged copies on several threads at once: one holds the staging crew, the others run on the
/// staging pool meanwhile; every copy is right, also with the crew sleeping between rounds.
#[test]
fn staged_copies_on_several_threads_at_once_are_right() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    // Small pieces, so that each copy has many.
    with_staging(Staging::new(1 << 20, 3).unwrap(), || staged_copies_on_several_threads(&res));
}

fn staged_copies_on_several_threads(res: &DeviceResources) {
    for round in 0..3u32 {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..4u32)
                .map(|k| {
                    let res = res.clone();
                    s.spawn(move || {
                        let want = pattern_u32((6 << 20) + 2 * k as usize + 1, 31 + k + round);
                        let d = DeviceVec::from_host(&res, &want).unwrap();
                        let mut out = vec![0u32; want.len()];
                        d.copy_to_host(&mut out).unwrap();
                        out == want
                    })
                })
                .collect();
            let ok: Vec<bool> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            assert_eq!(ok, vec![true; 4], "round {round}");
        });
        // Longer than the crew's watch: its threads sleep before the next round.
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn registered_slices_round_trip_and_unregister() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    for n in SIZES {
        let want = pattern_u32(n, 17);
        let mut src = want.clone();
        let mut dst = pattern_u32(n, 19);
        let mut dev = DeviceVec::<u32>::zeros(&res, n).unwrap();
        // One registration at a time: two small vectors may share a page, which the driver
        // locks as a whole.
        RegisteredSlice::scope(&res, &mut src, |registered| {
            assert_eq!(registered.len(), n);
            res.copy_scope(|s| s.to_device(&*registered, &mut dev)).unwrap();
        })
        .unwrap();
        RegisteredSlice::scope(0, &mut dst, |out| {
            res.copy_scope(|s| s.to_host(&dev, out)).unwrap();
            same(&format!("{n}: through registered slices"), &out.to_vec(), &want);
        })
        .unwrap();
        same(&format!("{n}: the slice after unregistering"), &dst, &want);
        // Registered again: the earlier registration is gone. The unsafe form, ended in time.
        // SAFETY: unregistered right here, before `dst` is used again.
        unsafe { RegisteredSlice::new(0, &mut dst) }.unwrap().unregister().unwrap();
    }
    // A panicking body still ends its registration: the slice registers again afterwards.
    let mut data = pattern_u32(4096, 23);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        RegisteredSlice::scope(0, &mut data, |_| panic!("a body that panics")).unwrap()
    }));
    assert!(panicked.is_err());
    RegisteredSlice::scope(0, &mut data, |r| assert_eq!(r.len(), 4096)).unwrap();
    // Memory that is already page-locked cannot be registered twice.
    let mut pinned = PinnedVec::<u32>::new(&res, 4096).unwrap();
    // SAFETY: no copy uses `pinned` while the slice lives (registering it is refused before any
    // copy could).
    let e = RegisteredSlice::scope(0, unsafe { pinned.as_mut_slice() }, |_| ()).unwrap_err();
    assert!(e.to_string().starts_with("RegisteredSlice::scope: "), "{e}");
    eprintln!("registering page-locked memory again: {:?} {e}", e.kind());
}

#[test]
fn device_to_device_copies_same_device_all_shapes() {
    require_gpu!();
    let (a, b) = (DeviceResources::new().unwrap(), DeviceResources::new().unwrap());
    for n in SIZES {
        let want = pattern_u32(n, 23);
        let src = DeviceVec::from_host(&a, &want).unwrap();
        // Queued on the destination's stream; the source is on other resources.
        let mut dst = DeviceVec::from_host(&b, &pattern_u32(n, 29)).unwrap();
        dst.copy_from_device(&src).unwrap();
        same(&format!("{n}: copy_from_device"), &dst.to_host().unwrap(), &want);
        // Owning, on a third stream's resources.
        let dst2 = DeviceVec::<u32>::zeros(&b, n).unwrap();
        let (src, dst2) = a.transfer_device_to_device(src, dst2).unwrap().wait().unwrap();
        same(&format!("{n}: transfer_device_to_device"), &dst2.to_host().unwrap(), &want);
        // Scoped.
        let mut dst3 = DeviceVec::<u32>::zeros(&a, n).unwrap();
        b.copy_scope(|s| s.device_to_device(&src, &mut dst3)).unwrap();
        same(&format!("{n}: scoped device_to_device"), &dst3.to_host().unwrap(), &want);
    }
}

/// Arrays from page-locked host and managed memory resources are device arrays too (unified
/// addressing): device-to-device copies between them and plain device memory, every direction.
#[test]
fn device_copies_between_device_pinned_and_managed_arrays() {
    require_gpu!();
    use raft::MemoryResource;
    let r = DeviceResources::new().unwrap();
    let kinds: Vec<(&str, Option<MemoryResource>)> = vec![
        ("device", None),
        ("pinned host", Some(MemoryResource::pinned_host(0).unwrap())),
        ("managed", Some(MemoryResource::managed(0).unwrap())),
    ];
    let make = |mr: &Option<MemoryResource>, n: usize| match mr {
        Some(mr) => DeviceVec::<u32>::new_in(&r, n, mr).unwrap(),
        None => DeviceVec::<u32>::new(&r, n).unwrap(),
    };
    let n = (1 << 20) + 7;
    for (i, (from, src_mr)) in kinds.iter().enumerate() {
        for (j, (to, dst_mr)) in kinds.iter().enumerate() {
            let want = pattern_u32(n, (7 * i + j) as u32);
            let mut src = make(src_mr, n);
            src.copy_from_host(&want).unwrap();
            let mut dst = make(dst_mr, n);
            dst.copy_from_host(&pattern_u32(n, 99)).unwrap();
            dst.copy_from_device(&src).unwrap();
            same(&format!("{from} -> {to}: copy_from_device"), &dst.to_host().unwrap(), &want);
            let (_, dst) = r.transfer_device_to_device(src, dst).unwrap().wait().unwrap();
            same(&format!("{from} -> {to}: transfer_device_to_device"), &dst.to_host().unwrap(), &want);
        }
    }
}
/// The copy's stream waits for the work queued on the arrays' own streams, and the source's
/// stream waits for a queued copy before writing the source again.
#[test]
fn copies_on_another_stream_are_ordered_with_the_arrays_streams() {
    require_gpu!();
    let (compute, copies) = (DeviceResources::new().unwrap(), DeviceResources::new().unwrap());
    let n = 2048;
    let a = DeviceVec::from_host(&compute, &vec![1.0f32; n * n]).unwrap();
    let b = DeviceVec::from_host(&compute, &vec![3.0f32; n * n]).unwrap();
    let mut c = DeviceVec::<f32>::zeros(&compute, n * n).unwrap();
    let gemm_into = |c: &mut DeviceVec<f32>, alpha: f32| {
        gemm(
            alpha,
            a.matrix(n, n, Layout::RowMajor).unwrap(),
            b.matrix(n, n, Layout::RowMajor).unwrap(),
            0.0,
            c.matrix_mut(n, n, Layout::RowMajor).unwrap(),
        )
        .unwrap()
    };
    gemm_into(&mut c, 1.0);
    // Read by a copy on the other resources' stream, queued while the GEMM may still run.
    let dst = DeviceVec::<f32>::zeros(&copies, n * n).unwrap();
    let (mut c, dst) = copies.transfer_device_to_device(c, dst).unwrap().wait().unwrap();
    assert!(dst.to_host().unwrap().iter().all(|x| *x == 3.0 * n as f32), "the copy ran before the GEMM finished");
    // A queued copy_from_device reads c on `copies`' stream; the GEMM queued next on c's own
    // stream must not overwrite c before that read.
    let mut dst2 = DeviceVec::<f32>::zeros(&copies, n * n).unwrap();
    dst2.copy_from_device(&c).unwrap();
    gemm_into(&mut c, 2.0);
    compute.sync().unwrap();
    assert!(dst2.to_host().unwrap().iter().all(|x| *x == 3.0 * n as f32), "the GEMM overwrote the source under the copy");
    assert!(c.to_host().unwrap().iter().all(|x| *x == 6.0 * n as f32));
}

#[test]
fn peer_copies_between_two_gpus() {
    require_gpu!();
    if raft_tests::gpus_or_skip(2).is_none() {
        return;
    }
    let (r0, r1) = (DeviceResources::on_device(0).unwrap(), DeviceResources::on_device(1).unwrap());
    for n in SIZES {
        let want = pattern_u32(n, 31);
        let src = DeviceVec::from_host(&r0, &want).unwrap();
        let mut dst = DeviceVec::<u32>::zeros(&r1, n).unwrap();
        dst.copy_from_device(&src).unwrap();
        same(&format!("{n}: peer copy_from_device"), &dst.to_host().unwrap(), &want);
        let back = DeviceVec::<u32>::zeros(&r0, n).unwrap();
        // On the destination's device, and on the source's.
        let (dst, back) = r0.transfer_device_to_device(dst, back).unwrap().wait().unwrap();
        same(&format!("{n}: peer transfer_device_to_device on the destination's device"), &back.to_host().unwrap(), &want);
        let (back, dst) = r1.transfer_device_to_device(back, dst).unwrap().wait().unwrap();
        same(&format!("{n}: peer transfer_device_to_device on the source's device"), &dst.to_host().unwrap(), &want);
        let mut again = DeviceVec::<u32>::zeros(&r1, n).unwrap();
        r0.copy_scope(|s| s.device_to_device(&back, &mut again)).unwrap();
        same(&format!("{n}: scoped peer copy"), &again.to_host().unwrap(), &want);
    }
    // A host copy must run on the device array's own device.
    let host = PinnedVec::<u32>::new(0, 16).unwrap();
    let dev1 = DeviceVec::<u32>::zeros(&r1, 16).unwrap();
    let e = r0.transfer_to_device(host, dev1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
}

#[test]
fn arguments_are_checked_before_any_cuda_call() {
    // CPU side: sizes no memory holds, bad staging settings.
    let e = PinnedVec::<f64>::new(0, usize::MAX / 4).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}"); // the byte count overflows (issue 33)
    assert!(e.to_string().starts_with("PinnedVec::new: "), "{e}");
    assert_eq!(Staging::new(0, 4).unwrap_err().kind(), ErrorKind::Logic);
    assert_eq!(Staging::new(1 << 20, 0).unwrap_err().kind(), ErrorKind::Logic);
    require_gpu!();
    // GPU side: lengths that differ, named by the API called.
    let res = DeviceResources::new().unwrap();
    let e = res.transfer_to_device(PinnedVec::<f32>::new(&res, 3).unwrap(), DeviceVec::zeros(&res, 4).unwrap()).unwrap_err();
    assert_eq!(
        (e.kind(), e.to_string().as_str()),
        (ErrorKind::Logic, "DeviceResources::transfer_to_device: a copy of 3 elements into 4 elements")
    );
    let e = res.transfer_to_host(DeviceVec::<f32>::zeros(&res, 4).unwrap(), PinnedVec::new(&res, 3).unwrap()).unwrap_err();
    assert_eq!(e.who(), "DeviceResources::transfer_to_host");
    let e = res.transfer_device_to_device(DeviceVec::<f32>::zeros(&res, 4).unwrap(), DeviceVec::zeros(&res, 5).unwrap()).unwrap_err();
    assert_eq!(e.who(), "DeviceResources::transfer_device_to_device");
    let mut d4 = DeviceVec::<f32>::zeros(&res, 4).unwrap();
    let d5 = DeviceVec::<f32>::zeros(&res, 5).unwrap();
    assert_eq!(d4.copy_from_device(&d5).unwrap_err().who(), "DeviceVec::copy_from_device");
    assert_eq!(d4.copy_from_host(&[1.0; 3]).unwrap_err().to_string(), "DeviceVec::copy_from_host: expected 4 elements, given 3");
    assert_eq!(d4.copy_to_host(&mut [0.0; 5]).unwrap_err().who(), "DeviceVec::copy_to_host");
    let p3 = PinnedVec::<f32>::new(&res, 3).unwrap();
    let e = d4.copy_from_host(&p3).unwrap_err();
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "DeviceVec::copy_from_host"));
    let e = res.copy_scope(|s| s.to_device(&p3, &mut d4)).unwrap_err();
    assert_eq!((e.kind(), e.who()), (ErrorKind::Logic, "CopyScope::to_device"));
    // Released resources are refused.
    let gone = DeviceResources::new().unwrap();
    let on_gone = DeviceVec::<f32>::zeros(&gone, 4).unwrap();
    gone.release().unwrap();
    let e = res.transfer_to_device(PinnedVec::<f32>::new(&res, 4).unwrap(), on_gone).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Logic, "{e}");
    assert!(e.to_string().contains("were released"), "{e}");
    let e = gone.transfer_to_device(PinnedVec::<f32>::new(&res, 4).unwrap(), DeviceVec::zeros(&res, 4).unwrap()).unwrap_err();
    assert!(e.to_string().contains("were released"), "{e}");
    assert!(gone.copy_scope(|_| Ok(())).unwrap_err().to_string().contains("were released"));
}

/// Resources released while a copy runs on their stream: the release drains the stream, so the
/// copy finishes and gives its buffers back; copies on released resources are refused.
#[test]
fn releasing_resources_under_a_copy_waits_for_it() {
    require_gpu!();
    let n = 64 << 20;
    let want = pattern_f32(n, 47);
    // The copy's own resources released.
    let copies = DeviceResources::new().unwrap();
    let keep = DeviceResources::new().unwrap();
    let dst = DeviceVec::<f32>::zeros(&keep, n).unwrap();
    let copy = copies.transfer_to_device(PinnedVec::from_slice(&keep, &want).unwrap(), dst).unwrap();
    copies.release().unwrap();
    assert!(copy.is_finished(), "the release drained the stream the copy runs on");
    let (_, dst) = copy.wait().unwrap();
    same("the copy of released resources", &dst.to_host().unwrap(), &want);
    // The destination's resources released while the copy runs on another stream.
    let owner = DeviceResources::new().unwrap();
    let dst = DeviceVec::<f32>::zeros(&owner, n).unwrap();
    let copy = keep.transfer_to_device(PinnedVec::from_slice(&keep, &want).unwrap(), dst).unwrap();
    owner.release().unwrap();
    let (src, dst) = copy.wait().unwrap();
    assert_eq!(dst.to_host().unwrap_err().kind(), ErrorKind::Logic, "the array's resources were released");
    drop((src, dst)); // frees on the stream the array still holds
    keep.sync().unwrap();
}

#[test]
fn a_transfer_waits_as_a_job_and_as_a_future() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let want = pattern_u32(1 << 20, 53);
    let copy = res.transfer_to_device(PinnedVec::from_slice(&res, &want).unwrap(), DeviceVec::zeros(&res, want.len()).unwrap()).unwrap();
    let (host, dev) = copy.into_job().unwrap().join().unwrap().unwrap();
    same("through a job", &dev.to_host().unwrap(), &want);
    let copy = res.transfer_to_host(dev, PinnedVec::new(&res, want.len()).unwrap()).unwrap();
    let (_, back) = pollster::block_on(copy.into_job().unwrap()).unwrap().unwrap();
    same("awaited", &back.to_vec(), &want);
    drop(host);
}

/// Copies on one resources' stream overlap a GEMM on another's, inside a scope that waits.
#[test]
fn scoped_copies_overlap_compute_on_other_resources() {
    require_gpu!();
    let (compute, copies) = (DeviceResources::new().unwrap(), DeviceResources::new().unwrap());
    let n = 2048;
    let a = DeviceVec::from_host(&compute, &vec![1.0f32; n * n]).unwrap();
    let b = DeviceVec::from_host(&compute, &vec![0.5f32; n * n]).unwrap();
    let mut c = DeviceVec::<f32>::zeros(&compute, n * n).unwrap();
    let want = pattern_f32(16 << 20, 59);
    let host = PinnedVec::from_slice(&copies, &want).unwrap();
    let mut dev = DeviceVec::<f32>::zeros(&copies, want.len()).unwrap();
    let mut back = PinnedVec::<f32>::new(&copies, want.len()).unwrap();
    let earlier = DeviceVec::from_host(&copies, &pattern_f32(want.len(), 60)).unwrap();
    let mut other = DeviceVec::<f32>::zeros(&copies, want.len()).unwrap();
    copies
        .copy_scope(|s| -> raft::Result<()> {
            // What a copy writes stays borrowed until the scope has waited: each copy here
            // has ends of its own.
            s.to_device(&host, &mut dev)?;
            gemm(1.0, a.matrix(n, n, Layout::RowMajor)?, b.matrix(n, n, Layout::RowMajor)?, 0.0, c.matrix_mut(n, n, Layout::RowMajor)?)?;
            s.device_to_device(&earlier, &mut other)?;
            s.to_host(&earlier, &mut back)?;
            compute.sync()
        })
        .unwrap();
    same("scoped host -> device beside a GEMM", &dev.to_host().unwrap(), &want);
    same("scoped device -> device beside a GEMM", &other.to_host().unwrap(), &earlier.to_host().unwrap());
    same("scoped device -> host beside a GEMM", &back.to_vec(), &earlier.to_host().unwrap());
    assert!(c.to_host().unwrap().iter().all(|x| *x == 0.5 * n as f32));
}

/// A scope whose body panics still waits for its copies before the panic goes on.
#[test]
fn a_panicking_scope_waits_for_its_copies() {
    require_gpu!();
    let res = DeviceResources::new().unwrap();
    let want = pattern_f32(64 << 20, 61);
    let host = PinnedVec::from_slice(&res, &want).unwrap();
    let mut dev = DeviceVec::<f32>::zeros(&res, want.len()).unwrap();
    let stream = res.stream().unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = res.copy_scope(|s| -> raft::Result<()> {
            s.to_device(&host, &mut dev).unwrap();
            panic!("the body gives up");
        });
    }));
    assert!(caught.is_err());
    // Nothing is left on the stream: the scope waited before unwinding.
    let idle = stream.record_event(None).unwrap();
    assert!(idle.is_complete(), "the scope unwound with its copy still running");
    same("the copy of a panicking scope", &dev.to_host().unwrap(), &want);
}

// ---- at exit -------------------------------------------------------------------------------

/// What the child of [`a_copy_in_flight_at_exit_is_waited_for`] does: it queues copies that run
/// for tens of milliseconds and exits at once, keeping (`keep`), forgetting (`forget`) or
/// dropping (`drop`) the transfers. A teardown step of its own, run after the library's, reports
/// whether the stream had drained by then.
fn exit_child(how: &str) -> ! {
    use std::sync::OnceLock;
    static EVENT: OnceLock<cudarc::driver::CudaEvent> = OnceLock::new();
    fn report() {
        let drained = EVENT.get().map(|e| e.is_complete());
        println!("RESULT drained={drained:?}");
    }
    let res = DeviceResources::new().unwrap();
    raft_exit::on_teardown(report); // after raft-core's own steps, registered by `new`
    let n = 32 << 20; // 8 x 128 MiB: tens of milliseconds of copies, far longer than the exit
    let mut copies = Vec::new();
    for _ in 0..8 {
        let host = PinnedVec::<f32>::new(&res, n).unwrap();
        let dev = DeviceVec::<f32>::new(&res, n).unwrap();
        copies.push(res.transfer_to_device(host, dev).unwrap());
    }
    EVENT.set(res.stream().unwrap().record_event(None).unwrap()).ok();
    println!("RESULT queued=8 finished_before_exit={}", copies.iter().all(|c| c.is_finished()));
    match how {
        "forget" => copies.into_iter().for_each(std::mem::forget),
        "drop" => drop(copies),
        _ => {} // keep: `exit` drops nothing, so the transfers stay alive through the exit
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(0)
}

#[test]
fn a_copy_in_flight_at_exit_is_waited_for() {
    if let Ok(how) = std::env::var("RAFT_COPIES_EXIT_CHILD") {
        exit_child(&how);
    }
    require_gpu!();
    let me = std::env::current_exe().unwrap();
    for how in ["keep", "forget", "drop"] {
        let start = Instant::now();
        let out = std::process::Command::new(&me)
            .args(["a_copy_in_flight_at_exit_is_waited_for", "--exact", "--nocapture", "--test-threads=1"])
            .env("RAFT_COPIES_EXIT_CHILD", how)
            .env("RUST_LOG", "raft=debug")
            .output_within(Duration::from_secs(300));
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{how}: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
        assert!(stdout.contains("RESULT queued=8"), "{how}: {stdout}");
        assert!(stdout.contains("RESULT drained=Some(true)"), "{how}: the teardown did not drain the copies\n{stdout}\n{stderr}");
        assert!(start.elapsed() < Duration::from_secs(60), "{how}: {:?}", start.elapsed());
    }
}

/// What the child of [`the_staging_watch_comes_from_the_environment`] does, under the
/// `RAFT_STAGING_SPIN_US` its parent set: a staged round trip, then the outcome printed.
fn spin_child() -> ! {
    let res = DeviceResources::new().unwrap();
    let want = pattern_u32((5 << 20) + 3, 53);
    let staged = DeviceVec::from_host(&res, &want).and_then(|d| {
        let mut out = vec![0u32; want.len()];
        d.copy_to_host(&mut out).map(|()| out == want)
    });
    match staged {
        Ok(right) => println!("RESULT ok right={right}"),
        Err(e) => println!("RESULT err kind={:?} who={} message={}", e.kind(), e.who(), e.message()),
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(0)
}

/// `RAFT_STAGING_SPIN_US`: 0 (the crew sleeps at once) still copies right; a value that does not
/// parse is the `Logic` error of every staged copy, naming the variable and the value.
#[test]
fn the_staging_watch_comes_from_the_environment() {
    if std::env::var("RAFT_COPIES_SPIN_CHILD").is_ok() {
        spin_child();
    }
    require_gpu!();
    let me = std::env::current_exe().unwrap();
    let run = |value: &str| {
        let out = std::process::Command::new(&me)
            .args(["the_staging_watch_comes_from_the_environment", "--exact", "--nocapture", "--test-threads=1"])
            .env("RAFT_COPIES_SPIN_CHILD", "1")
            .env("RAFT_STAGING_SPIN_US", value)
            .output_within(Duration::from_secs(300));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{value}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        stdout
    };
    let zero = run("0");
    assert!(zero.contains("RESULT ok right=true"), "RAFT_STAGING_SPIN_US=0: {zero}");
    let bad = run("2ms");
    assert!(bad.contains("RESULT err kind=Logic who=DeviceVec::from_host"), "{bad}");
    assert!(bad.contains("RAFT_STAGING_SPIN_US") && bad.contains("\"2ms\""), "the error names the variable and the value: {bad}");
}
