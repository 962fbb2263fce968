//! A tool's JSON arguments as a checked object. Every problem is an `Err` reading "invalid arguments: …", a message
//! a model can act on (the same wording as the C SDK's `berm_args_object`).

use crate::json::{self, Value};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// The arguments' object: its fields by name.
pub struct Args {
    members: Vec<(String, Value)>,
}

fn invalid(problem: String) -> String {
    format!("invalid arguments: {problem}")
}

/// At most `cap` bytes of `text` as a message shows them, as the C SDK does: never a cut character, and each control
/// character (NUL among them) as JSON writes it (`\u0000`). An unknown key was shown whole, raw bytes and all.
fn shown(text: &str, cap: usize) -> String {
    let mut end = text.len().min(cap);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::new();
    for c in text[..end].chars() {
        if c.is_ascii_control() {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses the invocation's arguments as a JSON object whose keys are all in `known` (empty arguments count as
/// `{}`). Arguments the heap cannot hold are an error, as in the C SDK.
pub fn object(known: &[&str]) -> Result<Args, String> {
    let text = crate::tool::read_args().map_err(out_of_memory)?;
    parse_object(&text, known)
}

fn out_of_memory(len: usize) -> String {
    invalid(format!("out of memory reading {len} bytes of arguments"))
}

/// `object` of the given text.
pub fn parse_object(text: &[u8], known: &[&str]) -> Result<Args, String> {
    let value = match text {
        b"" => Value::Object(Vec::new()),
        _ => json::parse_value(text).map_err(|e| match e {
            json::Error::Invalid(message) => invalid(format!("not JSON: {message}")),
            json::Error::OutOfMemory => out_of_memory(text.len()),
        })?,
    };
    let Value::Object(members) = value else {
        return Err(invalid(format!("expected a JSON object, not {}", value.type_name())));
    };
    if let Some((key, _)) = members.iter().find(|(key, _)| !known.contains(&key.as_str())) {
        return Err(invalid(format!("unknown field '{}' (expected: {})", shown(key, 64), known.join(", "))));
    }
    Ok(Args { members })
}

impl Args {
    /// The field, or None when absent (an error when `required`).
    pub fn field(&self, key: &str, required: bool) -> Result<Option<&Value>, String> {
        match self.members.iter().find(|(k, _)| k == key) {
            Some((_, value)) => Ok(Some(value)),
            None if required => Err(invalid(format!("missing required field '{key}'"))),
            None => Ok(None),
        }
    }

    pub fn string(&self, key: &str, required: bool) -> Result<Option<&str>, String> {
        match self.field(key, required)? {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(invalid(format!("'{key}' must be a string, not {}", other.type_name()))),
        }
    }

    /// An optional string field, `default` when absent.
    pub fn string_or<'a>(&'a self, key: &str, default: &'a str) -> Result<&'a str, String> {
        Ok(self.string(key, false)?.unwrap_or(default))
    }

    pub fn boolean(&self, key: &str, required: bool) -> Result<Option<bool>, String> {
        match self.field(key, required)? {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(invalid(format!("'{key}' must be a boolean, not {}", other.type_name()))),
        }
    }

    /// An integer field in `[min, max]`: any whole number, however written (1.0, 1e2 and -2.50e1 too).
    pub fn int(&self, key: &str, required: bool, min: i64, max: i64) -> Result<Option<i64>, String> {
        let value = match self.field(key, required)? {
            None => return Ok(None),
            Some(Value::Number(text)) => whole_number(text).ok_or_else(|| {
                invalid(format!("'{key}' must be an integer between {min} and {max}, not {text:.40}"))
            })?,
            Some(other) => return Err(invalid(format!("'{key}' must be an integer, not {}", other.type_name()))),
        };
        if value < min || value > max {
            return Err(invalid(format!("'{key}' must be between {min} and {max}, not {value}")));
        }
        Ok(Some(value))
    }

    /// An object whose values are all strings (an environment, headers), as pairs in their order; empty when
    /// absent and not required.
    pub fn string_map(&self, key: &str, required: bool) -> Result<Vec<(&str, &str)>, String> {
        let members = match self.field(key, required)? {
            None => return Ok(Vec::new()),
            Some(Value::Object(members)) => members,
            Some(other) => {
                return Err(invalid(format!("'{key}' must be an object of strings, not {}", other.type_name())))
            }
        };
        members
            .iter()
            .map(|(name, value)| match value {
                Value::String(s) => Ok((name.as_str(), s.as_str())),
                other => {
                    Err(invalid(format!("'{key}.{}' must be a string, not {}", shown(name, 64), other.type_name())))
                }
            })
            .collect()
    }

    /// A string that must be one of `choices`.
    pub fn choice(&self, key: &str, required: bool, choices: &[&str]) -> Result<Option<&str>, String> {
        match self.string(key, required)? {
            Some(value) if !choices.contains(&value) => {
                Err(invalid(format!("'{key}' must be one of {}, not '{}'", choices.join(", "), shown(value, 40))))
            }
            found => Ok(found),
        }
    }
}


/// The value of a JSON number's text when it is a whole number that fits an i64, exactly, from its digits: 1.0, 1e2
/// and -2.50e1 too, as JSON Schema's "integer" and the C SDK's `berm_arg_int` take them.
fn whole_number(text: &str) -> Option<i64> {
    let text = text.as_bytes();
    let (negative, text) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let split = text.iter().position(|&b| b == b'e' || b == b'E').unwrap_or(text.len());
    let (mantissa, exponent) = text.split_at(split);
    // value = digits * 10^scale; an exponent past 10^12, more than any text has digits, is as good as infinite
    let mut scale: i64 = 0;
    if let Some((_, exponent)) = exponent.split_first() {
        let (down, digits) = match exponent.split_first() {
            Some((b'-', rest)) => (true, rest),
            Some((b'+', rest)) => (false, rest),
            _ => (false, exponent),
        };
        for &d in digits {
            if scale <= 1_000_000_000_000 {
                scale = scale * 10 + i64::from(d - b'0');
            }
        }
        scale = if down { -scale } else { scale };
    }
    let fraction = mantissa.iter().position(|&b| b == b'.').map_or(0, |dot| mantissa.len() - dot - 1);
    scale -= fraction as i64;
    let digits: Vec<u8> = mantissa.iter().filter(|b| b.is_ascii_digit()).map(|b| b - b'0').collect();
    let Some(first) = digits.iter().position(|&d| d != 0) else { return Some(0) };
    let last = digits.iter().rposition(|&d| d != 0).unwrap_or(first);
    scale += (digits.len() - 1 - last) as i64; // trailing zeros
    let digits = &digits[first..=last];
    if scale < 0 || digits.len() as i64 + scale > 19 {
        return None;
    }
    let mut value: u64 = 0;
    for i in 0..digits.len() + scale as usize {
        value = value.checked_mul(10)?.checked_add(u64::from(digits.get(i).copied().unwrap_or(0)))?;
    }
    match negative {
        true if value <= 1 << 63 => Some(0i64.wrapping_sub(value as i64)),
        false => i64::try_from(value).ok(),
        true => None,
    }
}
