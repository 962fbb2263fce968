//! The Rust guest SDK for Berm harnesses (shared/ABI.md, version 0): a `no_std` crate for images built for
//! `riscv64imac-unknown-none-elf` (harnesses/rust-probe/build.sh shows how).
//!
//! - `harness!` makes a crate an image: the manifest in `.berm.abi`, the `_start` that keeps every tool through
//!   `--gc-sections`, the heap allocator and a panic handler that reports the panic's message;
//! - `args`, `ok`, `fail`, `outcome`, `log` and `Pair`: the tool boundary;
//! - `args::object`: the arguments as a checked JSON object; `json`: a parser and a writer;
//! - `caps`: one function per capability, errors as values;
//! - `calls` and `frame`: the host-call numbers and the wire format underneath.
//!
//! A tool is `#[no_mangle] pub extern "C" fn berm_tool_NAME() -> berm::Pair`, listed in the manifest and in
//! `harness!`.
//!
//! Built for the host instead (any target but `*-none-*`), the crate uses `std` and serves the host calls itself:
//! `testing::Host` calls a tool as the host does, with stand-in capabilities, so `cargo test` checks a harness's
//! tools natively. A harness crate that wants that says `#![cfg_attr(target_os = "none", no_std, no_main)]`.

#![cfg_attr(target_os = "none", no_std)]

extern crate alloc;

pub mod args;
pub mod calls;
pub mod caps;
pub mod frame;
mod heap;
pub mod json;
#[cfg(target_os = "none")]
#[doc(hidden)]
pub mod panic;
#[cfg(not(target_os = "none"))]
pub mod testing;
mod tool;

pub use heap::Heap;
pub use tool::{args, fail, log, ok, outcome, Pair};

/// Makes the crate a Berm image:
///
/// ```ignore
/// berm::harness! {
///     name: "greeter",                               // how panic messages name the harness
///     manifest: include_bytes!("manifest.json"),     // ABI.md §4, placed in .berm.abi
///     tools: [berm_tool_greet, berm_tool_wave],      // every tool the manifest lists
/// }
/// ```
///
/// It defines the image's `#[global_allocator]` (`berm::Heap`) and `#[panic_handler]`, so the crate defines
/// neither. The host never runs `_start` (ABI.md §3): it only takes the manifest's and every tool's address. Built
/// for the host (native tests), it defines nothing: `std` has its own allocator and panics.
#[macro_export]
macro_rules! harness {
    (name: $name:expr, manifest: $manifest:expr, tools: [$($tool:ident),+ $(,)?] $(,)?) => {
        #[cfg(target_os = "none")]
        #[used]
        #[link_section = ".berm.abi"]
        static BERM_MANIFEST: [u8; $manifest.len()] = *$manifest;

        #[cfg(target_os = "none")]
        #[global_allocator]
        static BERM_HEAP: $crate::Heap = $crate::Heap::new();

        #[cfg(target_os = "none")]
        #[panic_handler]
        fn berm_panic(info: &core::panic::PanicInfo) -> ! {
            $crate::panic::report($name, info)
        }

        #[cfg(target_os = "none")]
        #[no_mangle]
        pub extern "C" fn _start() -> ! {
            core::hint::black_box(&BERM_MANIFEST);
            core::hint::black_box([$($tool as extern "C" fn() -> $crate::Pair),+]);
            loop {}
        }
    };
}
