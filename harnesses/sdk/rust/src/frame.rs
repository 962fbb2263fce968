//! The wire format of capability requests and replies (ABI.md §2): a flat sequence of fields, each a u32
//! little-endian length and that many bytes. Integers travel as decimal ASCII text.

use alloc::vec::Vec;

/// The frame of `fields`. Panics on a field of 4 GiB or more, which the wire format cannot carry.
pub fn encode(fields: &[&[u8]]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(encoded_len(fields));
    encode_into(&mut frame, fields);
    frame
}

/// How many bytes the frame of `fields` takes.
pub fn encoded_len(fields: &[&[u8]]) -> usize {
    fields.iter().map(|f| 4 + f.len()).sum()
}

/// Appends the frame of `fields` to `frame` (`encode` without the allocation, for a caller that reserved it).
pub fn encode_into(frame: &mut Vec<u8>, fields: &[&[u8]]) {
    for field in fields {
        let len = u32::try_from(field.len()).expect("a frame field of 4 GiB or more");
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(field);
    }
}

/// The fields of a frame, or None when a length runs past its end.
pub fn decode(mut frame: &[u8]) -> Option<Vec<&[u8]>> {
    let mut fields = Vec::new();
    while !frame.is_empty() {
        let (len, rest) = frame.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        if len > rest.len() {
            return None;
        }
        let (field, rest) = rest.split_at(len);
        fields.push(field);
        frame = rest;
    }
    Some(fields)
}

/// A decimal integer field (an optional '-' and digits), as the host writes them.
pub fn integer(field: &[u8]) -> Option<i64> {
    core::str::from_utf8(field).ok()?.parse().ok()
}
