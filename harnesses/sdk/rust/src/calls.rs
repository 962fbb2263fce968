//! Host-call numbers and the `ecall` (ABI.md §1). Numbers are derived from names, never typed by hand; the names
//! are berm_abi/names.py's (tests/test_rust_sdk.py checks that both list the same ones).

/// FNV-1a 64 over the name's UTF-8 bytes. `fnv1a64("foobar") == 0x85944171f73967e8`.
pub const fn fnv1a64(name: &str) -> u64 {
    let bytes = name.as_bytes();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// Bit 63 of a capability's return value: the staged bytes are an error message, not a reply.
pub const ERROR: u64 = 1 << 63;

/// Each host call's number, derived from its name, and `NAMES`, every name (to name a number in a message).
macro_rules! host_calls {
    ($($number:ident = $name:literal;)*) => {
        $(pub const $number: u64 = fnv1a64($name);)*
        /// Every host call's name.
        pub const NAMES: &[&str] = &[$($name),*];
    };
}

host_calls! {
    // Always present (never granted).
    LOG = "berm.log";
    ARGS_LEN = "berm.args.len";
    ARGS_READ = "berm.args.read";
    FAIL = "berm.fail";
    RESULT_READ = "berm.result.read";
    HEAP_START = "berm.heap.start";
    HEAP_SIZE = "berm.heap.size";

    // Capabilities: present only when the declaration grants them (crate::caps wraps each).
    FS_READ = "berm.fs.read";
    FS_WRITE = "berm.fs.write";
    FS_GLOB = "berm.fs.glob";
    FS_GREP = "berm.fs.grep";
    EXEC_RUN = "berm.exec.run";
    HTTP_FETCH = "berm.http.fetch";
    CLOCK_NOW = "berm.clock.now";
    KV_GET = "berm.kv.get";
    KV_SET = "berm.kv.set";
    KV_DELETE = "berm.kv.delete";
    KV_LIST = "berm.kv.list";
    SCHEDULE_AT = "berm.schedule.at";
    SCHEDULE_CANCEL = "berm.schedule.cancel";
    CALL = "berm.call";
}

/// One host call: the number in a7, two arguments in a0/a1, the result from a0. Built for the host, the call goes to
/// `testing::Host` instead.
///
/// # Safety
/// The host reads or writes guest memory as the call's contract says (`berm.args.read` writes `arg1` bytes at
/// `arg0`, for one): the caller must pass pointers and lengths that are valid for that.
#[cfg(target_os = "none")]
pub unsafe fn host_call(number: u64, arg0: u64, arg1: u64) -> u64 {
    let result: u64;
    core::arch::asm!("ecall", inlateout("a0") arg0 => result, in("a1") arg1, in("a7") number, options(nostack));
    result
}

/// `host_call` on the host: `testing::Host` serves it.
///
/// # Safety
/// As for the guest's: pointers and lengths valid for what the call reads or writes.
#[cfg(not(target_os = "none"))]
pub unsafe fn host_call(number: u64, arg0: u64, arg1: u64) -> u64 {
    crate::testing::serve(number, arg0, arg1)
}
