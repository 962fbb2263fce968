//! Writes `keywords.rs` into OUT_DIR for the rust-keywords image (src/keywords/main.rs): `fn keyword`, one `match`
//! of KEYWORDS byte-string arms. rustc makes it a single function of more than 16,384 RV64 instructions (a trie of
//! jump tables over the length and each byte), which the translator cuts into chunks (berm_aot/emit/chunks.py).
//! The words come from a fixed 64-bit LCG, so every build writes the same source; tests/test_rust_keywords.py
//! computes them the same way.

use std::collections::HashSet;
use std::fmt::Write;

const KEYWORDS: u64 = 1000;

fn main() {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut seen = HashSet::new();
    let mut arms = String::new();
    let mut index = 0;
    while index < KEYWORDS {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        // 3 to 10 letters: the length from the top three bits, the letters from the base-26 digits
        let mut digits = state;
        let word: String = (0..3 + (state >> 61))
            .map(|_| {
                let letter = (b'a' + (digits % 26) as u8) as char;
                digits /= 26;
                letter
            })
            .collect();
        if seen.insert(word.clone()) {
            index += 1;
            writeln!(arms, "        b\"{word}\" => {},", 1 + index * 2_654_435_761 % 1_000_003).unwrap();
        }
    }
    let source = format!("/// The value of one of {KEYWORDS} words (build.rs), 0 for any other.\n#[inline(never)]\n\
                          fn keyword(word: &[u8]) -> u64 {{\n    match word {{\n{arms}        _ => 0,\n    }}\n}}\n");
    std::fs::write(std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("keywords.rs"), source).unwrap();
    println!("cargo::rerun-if-changed=build.rs");
}
