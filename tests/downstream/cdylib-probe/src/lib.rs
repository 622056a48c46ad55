//! A cdylib that uses raft, loaded by ../rmm_map_check.cpp beside librmm.so: both must see one
//! RMM per-device map (the pool one side installs is the resource the other side gets).

/// The address of RMM's per-device resource map (`rmm::mr::detail::get_ref_map()`) as raft's
/// shim binds it; 0 when the shim cannot be loaded (the reason goes to stderr).
#[no_mangle]
pub extern "C" fn probe_rmm_map_address() -> usize {
    match raft::memory::rmm_map_address() {
        Ok(address) => address,
        Err(e) => {
            eprintln!("probe_rmm_map_address: {e}");
            0
        }
    }
}
