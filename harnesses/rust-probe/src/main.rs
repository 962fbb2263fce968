//! rust-probe: a `no_std` Rust harness for Berm (shared/ABI.md, version 0).
//!
//! It exists to put in front of the host what rustc and LLVM emit for real third-party harnesses: formatting
//! through `core::fmt` (function pointers materialised with `auipc`/`addi`), a `match` over many arms (a jump
//! table of `R_RISCV_64` words in `.rodata`), trait objects (vtables, also `R_RISCV_64`), a global allocator over
//! the guest heap, host-call numbers loaded as 64-bit constants, soft floating point and 128-bit integers
//! (compiler-builtins), float parsing and formatting, a B-tree map, sorting, Unicode case mapping and atomics of
//! every width. Every tool's result is fixed by its input,
//! so tests can check the exact text on every engine.

#![no_std]
#![no_main]

extern crate alloc;

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;
use core::hint::black_box;
use core::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use berm::{args, fail, log, ok, Pair};

// ------------------------------------------------------------------------------------------- tools

/// core::fmt with several arguments of different types and format specs.
#[no_mangle]
pub extern "C" fn berm_tool_format() -> Pair {
    let input = args();
    let text = String::from_utf8_lossy(&input);
    let n = black_box(input.len() as u64);
    let mut out = String::new();
    let _ = write!(out, "args={:?} len={} hex={:#x} pad=[{:>6}] neg={} list={:?}",
                   text, n, n * 255 + 4096, "ab", -(n as i64) - 7, [n, n + 1, n * 2]);
    log(&out);
    ok(out)
}

/// One step of a checksum whose arms each do different work, so LLVM emits a jump table (not a lookup table).
#[inline(never)]
fn step(acc: u64, byte: u8) -> u64 {
    match black_box(byte % 12) {
        0 => acc.wrapping_mul(31).wrapping_add(7),
        1 => acc ^ 0x5555,
        2 => acc.rotate_left(5),
        3 => acc.wrapping_sub(byte as u64 * 3),
        4 => acc / 3 + 11,
        5 => acc.wrapping_add(acc >> 7),
        6 => !acc & 0xffff_ffff,
        7 => acc.wrapping_mul(acc | 1) >> 3,
        8 => acc.count_ones() as u64 * 1000 + acc % 1000,
        9 => acc.swap_bytes() >> 32,
        10 => acc.wrapping_shl(byte as u32 % 13) ^ 0x77,
        _ => acc.wrapping_add(0x1234_5678),
    }
}

/// Runs `step` over the argument bytes (or over 0..48 when there are none) and prints the result.
#[no_mangle]
pub extern "C" fn berm_tool_classify() -> Pair {
    let mut input = args();
    if input.is_empty() {
        input = (0u8..48).collect();
    }
    let acc = input.iter().fold(1u64, |acc, &b| step(acc, b));
    ok(format!("classify({} bytes) = {}", input.len(), acc))
}

trait Shape {
    fn area(&self) -> u64;
    fn name(&self) -> &'static str;
}

struct Square(u64);
struct Rect(u64, u64);
struct Triangle(u64, u64);

impl Shape for Square {
    fn area(&self) -> u64 { self.0 * self.0 }
    fn name(&self) -> &'static str { "square" }
}

impl Shape for Rect {
    fn area(&self) -> u64 { self.0 * self.1 }
    fn name(&self) -> &'static str { "rect" }
}

impl Shape for Triangle {
    fn area(&self) -> u64 { self.0 * self.1 / 2 }
    fn name(&self) -> &'static str { "triangle" }
}

#[inline(never)]
fn describe(shapes: &[&dyn Shape]) -> String {
    let mut out = String::new();
    let mut total = 0;
    for shape in shapes {
        let _ = write!(out, "{}:{} ", shape.name(), shape.area());
        total += shape.area();
    }
    let _ = write!(out, "total:{}", total);
    out
}

/// Calls through `&dyn Shape` vtables.
#[no_mangle]
pub extern "C" fn berm_tool_shapes() -> Pair {
    let (sq, re, tr) = (Square(4), Rect(3, 5), Triangle(6, 7));
    let shapes: [&dyn Shape; 3] = black_box([&sq, &re, &tr]);
    ok(describe(&shapes))
}

/// Takes every byte the heap has left, in ever smaller blocks (`try_reserve_exact`, which fails instead of
/// panicking), and returns how many.
fn fill_heap() -> usize {
    let (mut taken, mut block) = (0, 1 << 20);
    while block > 0 {
        let mut v: Vec<u8> = Vec::new();
        if v.try_reserve_exact(block).is_ok() {
            core::mem::forget(v);
            taken += block;
        } else {
            block /= 2;
        }
    }
    taken
}

/// Fails on purpose when given "fail", panics (a trap) when given "panic", and fills the heap and then asks it for
/// 64 more bytes when given "oom" (a panic for the failed allocation): as the JSON string its manifest declares
/// (`"panic"`, quotes included, as `berm call` and agents send it), or as those bare bytes. "panic:TEXT" panics
/// with a message of several pieces, TEXT's Debug form first (the panic handler's cut of a long one).
#[no_mangle]
pub extern "C" fn berm_tool_check() -> Pair {
    let given = args();
    let word = given.strip_prefix(b"\"").and_then(|s| s.strip_suffix(b"\"")).unwrap_or(&given);
    match word {
        b"fail" => fail("check failed, as requested"),
        b"panic" => panic!("asked to panic"),
        w if w.starts_with(b"panic:") => {
            panic!("{:?} and {} more", core::str::from_utf8(&w[6..]).unwrap_or("?"), w.len())
        }
        b"oom" => ok(format!("{} bytes", fill_heap() + black_box(Vec::<u8>::with_capacity(64)).capacity())),
        _ => ok(format!("checked {} bytes", given.len())),
    }
}

/// The square root of `x` by Newton's method in f64 arithmetic: every step a soft-float division and addition.
#[inline(never)]
fn newton_sqrt(x: f64) -> f64 {
    let mut guess = x / 2.0 + 1.0;
    for _ in 0..black_box(12) {
        guess = (guess + x / guess) / 2.0;
    }
    guess
}

/// Floating point without an FPU (RV64IMAC has no F or D: compiler-builtins' `__adddf3`, `__divdf3`, `__muldf3`,
/// conversions), core::fmt's float printing (shortest digits, fixed precision, exponent form), and 128-bit
/// integers (`__multi3`, `__udivti3`, `__umodti3`, signed division). `n` is the argument length plus 3.
#[no_mangle]
pub extern "C" fn berm_tool_numbers() -> Pair {
    let n = black_box(args().len() as u64 + 3);
    let mut harmonic = 0.0f64;
    for k in 1..=n {
        harmonic += 1.0 / k as f64;
    }
    let x = n as f64;
    let big = u64::MAX as u128 * (n as u128 + 7);
    let signed = -(big as i128) / 13;
    let mut out = String::new();
    let _ = write!(out, "harmonic={:.6} sqrt={} seventh={:e} scaled={} big={} q={} r={} signed={} back={}",
                   harmonic, newton_sqrt(x), x / 7.0, x * 1.5e-3, big, big / (n as u128 * 1_000_003), big % 97,
                   signed, (signed as f64 / 3.0) as i64);
    ok(out)
}

/// The argument text's words (split at every char that is not alphanumeric), lower-cased and counted in a
/// BTreeMap, ranked by count then word with `sort_by`, and the first five printed upper-cased: alloc's B-tree,
/// the slice sort's merge code, and char's Unicode tables for the tests and case mappings.
#[no_mangle]
pub extern "C" fn berm_tool_words() -> Pair {
    let Ok(text) = String::from_utf8(args()) else {
        return fail("words: the arguments are not UTF-8");
    };
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    let mut total = 0;
    for word in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        *counts.entry(word.to_lowercase()).or_insert(0) += 1;
        total += 1;
    }
    let mut ranked: Vec<(&String, &u32)> = counts.iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    let mut out = String::new();
    let _ = write!(out, "{} words, {} distinct:", total, counts.len());
    for (word, count) in ranked.iter().take(5) {
        let _ = write!(out, " {}={}", word.to_uppercase(), count);
    }
    ok(out)
}

/// The argument text's whitespace-separated words parsed as f64 (core's dec2flt: the Eisel-Lemire fast path, and
/// big-decimal arithmetic for what it cannot round), summed in order: how many parsed, how many did not, the sum
/// and the largest.
#[no_mangle]
pub extern "C" fn berm_tool_parse() -> Pair {
    let Ok(text) = String::from_utf8(args()) else {
        return fail("parse: the arguments are not UTF-8");
    };
    let (mut parsed, mut refused, mut sum, mut largest) = (0, 0, 0.0f64, f64::NEG_INFINITY);
    for word in text.split_ascii_whitespace() {
        match word.parse::<f64>() {
            Ok(x) => {
                parsed += 1;
                sum += x;
                largest = largest.max(x);
            }
            Err(_) => refused += 1,
        }
    }
    ok(format!("parsed={} refused={} sum={} largest={}", parsed, refused, sum, largest))
}

static BYTE: AtomicU8 = AtomicU8::new(7);
static HALF: AtomicU16 = AtomicU16::new(0);
static WORD: AtomicU32 = AtomicU32::new(1);
static DOUBLE: AtomicU64 = AtomicU64::new(0);

/// Atomics of every width over the argument bytes: LLVM builds the 8- and 16-bit ones from masked `lr.w`/`sc.w`
/// loops, the 32-bit compare-exchange from `lr.w`/`sc.w`, the rest from AMOs. Statics start afresh per invocation.
#[no_mangle]
pub extern "C" fn berm_tool_atomics() -> Pair {
    for &b in args().iter() {
        BYTE.fetch_add(b, Ordering::SeqCst);
        BYTE.fetch_xor(b.rotate_left(3), Ordering::AcqRel);
        HALF.fetch_max(u16::from(b) * 257, Ordering::Relaxed);
        HALF.fetch_sub(u16::from(b), Ordering::Release);
        let mut word = WORD.load(Ordering::Acquire);
        loop {
            let next = word.wrapping_mul(31).wrapping_add(u32::from(b));
            match WORD.compare_exchange_weak(word, next, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => break,
                Err(seen) => word = seen,
            }
        }
        let old = DOUBLE.swap(u64::from(WORD.load(Ordering::SeqCst)) << 7, Ordering::SeqCst);
        DOUBLE.fetch_or(old >> 3, Ordering::SeqCst);
    }
    ok(format!("byte={} half={} word={} double={}", BYTE.load(Ordering::SeqCst), HALF.load(Ordering::SeqCst),
               WORD.load(Ordering::SeqCst), DOUBLE.load(Ordering::SeqCst)))
}

// ------------------------------------------------------------------------------------------- the image

berm::harness! {
    name: "rust-probe",
    manifest: include_bytes!("manifest.json"),
    tools: [berm_tool_format, berm_tool_classify, berm_tool_shapes, berm_tool_check, berm_tool_numbers,
            berm_tool_words, berm_tool_parse, berm_tool_atomics],
}
