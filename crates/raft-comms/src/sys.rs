//! Raw bindings of the shim's header (`include/raftcomms.h`): constants, the opaque handle, and
//! the table of its functions, looked up by name when the shim is loaded. Written by hand (the
//! header is small) and checked against the header by a test, so neither drifts.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// Result of every fallible shim call (`RAFTCOMMS_STATUS_*`).
pub type raftcomms_status = i32;

pub const RAFTCOMMS_STATUS_OK: raftcomms_status = 0;
pub const RAFTCOMMS_STATUS_OUT_OF_MEMORY: raftcomms_status = 1;
pub const RAFTCOMMS_STATUS_CUDA: raftcomms_status = 2;
pub const RAFTCOMMS_STATUS_LOGIC: raftcomms_status = 3;
pub const RAFTCOMMS_STATUS_GENERIC: raftcomms_status = 4;

pub const RAFTCOMMS_MIN_NCCL_VERSION: i32 = 21800;
pub const RAFTCOMMS_UNIQUE_ID_BYTES: usize = 128;

pub const RAFTCOMMS_DTYPE_U8: i32 = 0;
pub const RAFTCOMMS_DTYPE_I32: i32 = 1;
pub const RAFTCOMMS_DTYPE_I64: i32 = 2;
pub const RAFTCOMMS_DTYPE_F32: i32 = 3;
pub const RAFTCOMMS_DTYPE_F64: i32 = 4;

pub const RAFTCOMMS_OP_SUM: i32 = 0;
pub const RAFTCOMMS_OP_PROD: i32 = 1;
pub const RAFTCOMMS_OP_MIN: i32 = 2;
pub const RAFTCOMMS_OP_MAX: i32 = 3;

pub const RAFTCOMMS_STATE_DONE: i32 = 0;
pub const RAFTCOMMS_STATE_PENDING: i32 = 1;

/// A shim communicator handle (`raftcomms_comm`): opaque.
#[repr(C)]
pub struct raftcomms_comm {
    _opaque: [u8; 0],
    // Not Send, not Sync, not Unpin by itself: the owners say what holds.
    _marker: std::marker::PhantomData<(*mut u8, std::marker::PhantomPinned)>,
}

macro_rules! shim_functions {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)?; )*) => {
        /// The shim's functions, looked up once when it is loaded; the library is kept open
        /// (never unloaded) with them.
        pub struct RaftcommsShim {
            _lib: libloading::Library,
            $( pub $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?, )*
        }

        impl RaftcommsShim {
            /// Looks every function up in `lib`.
            ///
            /// # Safety
            /// `lib` must be a raftcomms shim built from this crate's header: the functions are
            /// taken to have the signatures written here.
            pub unsafe fn from_library(lib: libloading::Library) -> Result<Self, libloading::Error> {
                $(
                    // SAFETY: the caller vouches that the symbol has this signature; the fn
                    // pointer is kept beside the library, which is never unloaded.
                    let $name = unsafe {
                        *lib.get::<unsafe extern "C" fn($($ty),*) $(-> $ret)?>(concat!(stringify!($name), "\0").as_bytes())?
                    };
                )*
                Ok(RaftcommsShim { _lib: lib, $($name,)* })
            }
        }

        /// The signatures bound here, as written (checked against the header by a test): name,
        /// argument types, return type (empty for none).
        #[cfg(test)]
        pub(crate) const SIGNATURES: &[(&str, &[&str], &str)] =
            &[$((stringify!($name), &[$(stringify!($ty)),*], concat!("" $(, stringify!($ret))?))),*];
    };
}

shim_functions! {
    fn raftcomms_last_error() -> *const c_char;
    fn raftcomms_clear_error();
    fn raftcomms_header_hash() -> u64;
    fn raftcomms_header_nccl_version() -> i32;
    fn raftcomms_build_info(raft: *mut i32, rmm: *mut i32, cccl: *mut i32, cudart: *mut i32, librmm_build_id: *mut c_char, size: usize);
    fn raftcomms_nccl_load(path: *const c_char, version: *mut i32) -> raftcomms_status;
    fn raftcomms_nccl_path(buf: *mut c_char, size: usize) -> raftcomms_status;
    fn raftcomms_unique_id(out: *mut u8) -> raftcomms_status;
    fn raftcomms_comm_init(id: *const u8, nranks: i32, rank: i32, device: i32, timeout_s: f64, out: *mut *mut raftcomms_comm) -> raftcomms_status;
    fn raftcomms_comm_init_clique(n: i32, devices: *const i32, timeout_s: f64, out: *mut *mut raftcomms_comm) -> raftcomms_status;
    fn raftcomms_comm_split(comm: *mut raftcomms_comm, color: i32, key: i32, out: *mut *mut raftcomms_comm) -> raftcomms_status;
    fn raftcomms_comm_split_done(child: *mut raftcomms_comm, present: *mut i32) -> raftcomms_status;
    fn raftcomms_comm_wait(comm: *mut raftcomms_comm, timeout_s: f64) -> raftcomms_status;
    fn raftcomms_comm_info(comm: *mut raftcomms_comm, rank: *mut i32, size: *mut i32, device: *mut i32) -> raftcomms_status;
    fn raftcomms_comm_set_timeout(comm: *mut raftcomms_comm, timeout_s: f64) -> raftcomms_status;
    fn raftcomms_comm_query(comm: *mut raftcomms_comm, stream: *mut c_void, state: *mut i32) -> raftcomms_status;
    fn raftcomms_comm_abort(comm: *mut raftcomms_comm, reason: *const c_char) -> raftcomms_status;
    fn raftcomms_comm_finalize(comm: *mut raftcomms_comm) -> raftcomms_status;
    fn raftcomms_comm_destroy(comm: *mut raftcomms_comm) -> raftcomms_status;
    fn raftcomms_comm_free(comm: *mut raftcomms_comm);
    fn raftcomms_set_ends_elsewhere(on: i32) -> raftcomms_status;
    fn raftcomms_ends_in_flight() -> i32;
    fn raftcomms_comm_install(comm: *mut raftcomms_comm, raft_resources: *mut c_void, stream: *mut c_void) -> raftcomms_status;
    fn raftcomms_installed(raft_resources: *mut c_void, present: *mut i32, rank: *mut i32, size: *mut i32) -> raftcomms_status;
    fn raftcomms_raft_allreduce(raft_resources: *mut c_void, send: *const c_void, recv: *mut c_void, count: usize, dtype: i32, op: i32, stream: *mut c_void) -> raftcomms_status;
    fn raftcomms_group_start() -> raftcomms_status;
    fn raftcomms_group_end(n: i32, comms: *const *mut raftcomms_comm, streams: *const *mut c_void) -> raftcomms_status;
    fn raftcomms_allreduce(comm: *mut raftcomms_comm, send: *const c_void, recv: *mut c_void, count: usize, dtype: i32, op: i32, stream: *mut c_void, mark: i32) -> raftcomms_status;
    fn raftcomms_broadcast(comm: *mut raftcomms_comm, send: *const c_void, recv: *mut c_void, count: usize, dtype: i32, root: i32, stream: *mut c_void, mark: i32) -> raftcomms_status;
    fn raftcomms_reduce(comm: *mut raftcomms_comm, send: *const c_void, recv: *mut c_void, count: usize, dtype: i32, op: i32, root: i32, stream: *mut c_void, mark: i32) -> raftcomms_status;
    fn raftcomms_allgather(comm: *mut raftcomms_comm, send: *const c_void, recv: *mut c_void, sendcount: usize, dtype: i32, stream: *mut c_void, mark: i32) -> raftcomms_status;
    fn raftcomms_allgatherv(comm: *mut raftcomms_comm, send: *const c_void, recv: *mut c_void, counts: *const usize, displs: *const usize, dtype: i32, stream: *mut c_void, mark: i32) -> raftcomms_status;
    fn raftcomms_gather(comm: *mut raftcomms_comm, send: *const c_void, recv: *mut c_void, sendcount: usize, dtype: i32, root: i32, stream: *mut c_void, mark: i32) -> raftcomms_status;
    fn raftcomms_reducescatter(comm: *mut raftcomms_comm, send: *const c_void, recv: *mut c_void, recvcount: usize, dtype: i32, op: i32, stream: *mut c_void, mark: i32) -> raftcomms_status;
    fn raftcomms_send(comm: *mut raftcomms_comm, buf: *const c_void, count: usize, dtype: i32, peer: i32, stream: *mut c_void, mark: i32) -> raftcomms_status;
    fn raftcomms_recv(comm: *mut raftcomms_comm, buf: *mut c_void, count: usize, dtype: i32, peer: i32, stream: *mut c_void, mark: i32) -> raftcomms_status;
    fn raftcomms_sendrecv(comm: *mut raftcomms_comm, send: *const c_void, sendcount: usize, dest: i32, recv: *mut c_void, recvcount: usize, source: i32, dtype: i32, stream: *mut c_void, mark: i32) -> raftcomms_status;
    fn raftcomms_barrier(comm: *mut raftcomms_comm, stream: *mut c_void, mark: i32) -> raftcomms_status;
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = include_str!("../include/raftcomms.h");

    /// Every function the header declares: name, argument types and return type, each written
    /// as the Rust type that binds it (`const char*` → `*const c_char`, `raftcomms_comm* const*`
    /// → `*const *mut raftcomms_comm`, `void` → nothing).
    fn declared() -> Vec<(String, Vec<String>, String)> {
        // The header without its comments and preprocessor lines, declarations joined.
        let mut text = String::new();
        let mut in_comment = false;
        for line in HEADER.lines() {
            let mut t = line.trim();
            if in_comment {
                match t.find("*/") {
                    Some(end) => {
                        in_comment = false;
                        t = &t[end + 2..];
                    }
                    None => continue,
                }
            }
            if let Some(start) = t.find("/*") {
                in_comment = !t[start..].contains("*/");
                t = &t[..start];
            }
            if t.starts_with('#') || t.starts_with("//") {
                continue;
            }
            text.push_str(t);
            text.push(' ');
        }
        let mut out = Vec::new();
        for decl in text.split(';') {
            let Some(open) = decl.find('(') else { continue };
            let head = &decl[..open];
            let name = head.split_whitespace().last().unwrap_or("").trim_start_matches('*');
            if !name.starts_with("raftcomms_") || head.contains("typedef") {
                continue;
            }
            let ret = rust_type(head[..head.rfind(name).unwrap()].trim());
            let close = decl.rfind(')').expect("a declaration's closing parenthesis");
            let args: Vec<String> = decl[open + 1..close]
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty() && *a != "void")
                .map(|a| {
                    // The last word is the argument's name (every argument of the header is named).
                    let cut = a.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
                    rust_type(a[..cut].trim())
                })
                .collect();
            out.push((name.to_string(), args, ret));
        }
        out
    }

    /// A C type as the Rust type that binds it: each pointer's mutability is whether what it
    /// points to is `const`.
    fn rust_type(c: &str) -> String {
        let spaced = c.replace('*', " * ");
        let (mut base, mut base_const, mut pointers) = (String::new(), false, Vec::<bool>::new());
        for tok in spaced.split_whitespace() {
            match tok {
                "const" => match pointers.last_mut() {
                    Some(p) => *p = true,
                    None => base_const = true,
                },
                "*" => pointers.push(false),
                t => {
                    base = match t {
                        "int32_t" => "i32",
                        "uint8_t" => "u8",
                        "uint64_t" => "u64",
                        "size_t" => "usize",
                        "double" => "f64",
                        "char" => "c_char",
                        "void" => "c_void",
                        other => other,
                    }
                    .to_string()
                }
            }
        }
        if pointers.is_empty() && base == "c_void" {
            return String::new();
        }
        let (mut ty, mut pointee_const) = (base, base_const);
        for p in pointers {
            ty = format!("*{} {ty}", if pointee_const { "const" } else { "mut" });
            pointee_const = p;
        }
        ty
    }

    /// The ninth audit: the bindings were checked against the header by name only, and the
    /// load-time hash compares the shim with the same header, so a changed argument type in
    /// the header and the C++ but not here passed every check.
    #[test]
    fn bindings_match_every_signature_of_the_header() {
        let mut header = declared();
        let mut bound: Vec<(String, Vec<String>, String)> = SIGNATURES
            .iter()
            .map(|(n, args, ret)| (n.to_string(), args.iter().map(|a| a.to_string()).collect(), ret.to_string()))
            .collect();
        header.sort();
        bound.sort();
        assert_eq!(header.len(), bound.len(), "include/raftcomms.h declares {} functions, src/sys.rs binds {}", header.len(), bound.len());
        for (h, b) in header.iter().zip(&bound) {
            assert_eq!(h, b, "include/raftcomms.h (left) and src/sys.rs (right) disagree");
        }
    }

    #[test]
    fn the_status_type_matches_the_header() {
        let line = HEADER.lines().find(|l| l.starts_with("typedef") && l.contains("raftcomms_status")).expect("the status typedef");
        let c_type = line.split_whitespace().nth(1).unwrap();
        assert_eq!(rust_type(c_type), std::any::type_name::<raftcomms_status>(), "{line}");
    }

    #[test]
    fn constants_match_the_header() {
        let value = |name: &str| -> i64 {
            let line =
                HEADER.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap_or_else(|| panic!("{name} not in header"));
            line.split_whitespace().nth(2).unwrap().parse().unwrap()
        };
        for (name, v) in [
            ("RAFTCOMMS_STATUS_OK", RAFTCOMMS_STATUS_OK as i64),
            ("RAFTCOMMS_STATUS_OUT_OF_MEMORY", RAFTCOMMS_STATUS_OUT_OF_MEMORY as i64),
            ("RAFTCOMMS_STATUS_CUDA", RAFTCOMMS_STATUS_CUDA as i64),
            ("RAFTCOMMS_STATUS_LOGIC", RAFTCOMMS_STATUS_LOGIC as i64),
            ("RAFTCOMMS_STATUS_GENERIC", RAFTCOMMS_STATUS_GENERIC as i64),
            ("RAFTCOMMS_MIN_NCCL_VERSION", RAFTCOMMS_MIN_NCCL_VERSION as i64),
            ("RAFTCOMMS_UNIQUE_ID_BYTES", RAFTCOMMS_UNIQUE_ID_BYTES as i64),
            ("RAFTCOMMS_DTYPE_U8", RAFTCOMMS_DTYPE_U8 as i64),
            ("RAFTCOMMS_DTYPE_I32", RAFTCOMMS_DTYPE_I32 as i64),
            ("RAFTCOMMS_DTYPE_I64", RAFTCOMMS_DTYPE_I64 as i64),
            ("RAFTCOMMS_DTYPE_F32", RAFTCOMMS_DTYPE_F32 as i64),
            ("RAFTCOMMS_DTYPE_F64", RAFTCOMMS_DTYPE_F64 as i64),
            ("RAFTCOMMS_OP_SUM", RAFTCOMMS_OP_SUM as i64),
            ("RAFTCOMMS_OP_PROD", RAFTCOMMS_OP_PROD as i64),
            ("RAFTCOMMS_OP_MIN", RAFTCOMMS_OP_MIN as i64),
            ("RAFTCOMMS_OP_MAX", RAFTCOMMS_OP_MAX as i64),
            ("RAFTCOMMS_STATE_DONE", RAFTCOMMS_STATE_DONE as i64),
            ("RAFTCOMMS_STATE_PENDING", RAFTCOMMS_STATE_PENDING as i64),
        ] {
            assert_eq!(value(name), v, "{name}");
        }
    }
}
