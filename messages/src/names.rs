//! File names are bytes: anything but `/` and NUL, as on Linux. The
//! namespace, the wire and the client library hold them as Rust strings,
//! so that valid UTF-8 (nearly every name) is kept as it is and every
//! `&str` API, S3 key and log line stays text.
//!
//! A byte that is not part of valid UTF-8 is held as one private-use
//! character, U+10FF00 plus the byte (only bytes 0x80 to 0xFF can be
//! invalid, so U+10FF80 to U+10FFFF). A name that truly holds one of these
//! 128 characters holds each of the character's four bytes the same way.
//! So every byte string has exactly one string form ([`from_bytes`]) and
//! back ([`to_bytes`]); [`check`] refuses a string that is not a form of
//! this kind, so two different strings never name the same bytes.
//!
//! Shown to people, an escaped byte is `\xNN` ([`shown`]); in JSON it is
//! `\udcNN` ([`json_text`]), which Python decodes to the lone surrogate its
//! `surrogateescape` handler uses, so `os.fsencode(name)` gives the bytes.

use std::borrow::Cow;

use crate::error::FsError;

/// The first of the characters that hold a byte (U+10FF80 for 0x80).
const BASE: u32 = 0x10FF00;
const FIRST: u32 = BASE + 0x80;

/// Whether `c` holds a byte that is not UTF-8 of its own.
pub fn is_escape(c: char) -> bool {
    c as u32 >= FIRST
}

fn escape(b: u8) -> char {
    debug_assert!(b >= 0x80, "ASCII is always valid UTF-8");
    char::from_u32(BASE + b as u32).expect("U+10FF80..=U+10FFFF are characters")
}

/// Whether `s` holds bytes that are not UTF-8 (or one of the escape characters).
pub fn has_escapes(s: &str) -> bool {
    // Every escape character's UTF-8 begins with 0xF4 (as do U+100000 and up).
    s.as_bytes().contains(&0xF4) && s.chars().any(is_escape)
}

/// The string form of a name (or path, or symlink target) given as bytes.
pub fn from_bytes(b: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(b) {
        if !has_escapes(s) {
            return Cow::Borrowed(s);
        }
    }
    let mut out = String::with_capacity(b.len() + 16);
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            if is_escape(c) {
                let mut buf = [0u8; 4];
                for &x in c.encode_utf8(&mut buf).as_bytes() {
                    out.push(escape(x));
                }
            } else {
                out.push(c);
            }
        }
        for &x in chunk.invalid() {
            out.push(escape(x));
        }
    }
    Cow::Owned(out)
}

/// The bytes a string form stands for.
pub fn to_bytes(s: &str) -> Cow<'_, [u8]> {
    if !has_escapes(s) {
        return Cow::Borrowed(s.as_bytes());
    }
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        if is_escape(c) {
            out.push((c as u32 - BASE) as u8);
        } else {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
    }
    Cow::Owned(out)
}

/// The length in bytes of what `s` stands for (each escape character is
/// one byte, four in `s`).
pub fn byte_len(s: &str) -> usize {
    if !has_escapes(s) {
        return s.len();
    }
    s.len() - 3 * s.chars().filter(|&c| is_escape(c)).count()
}

/// Refuses a string that is not the form [`from_bytes`] gives for its
/// bytes: escape characters standing for bytes that are valid UTF-8.
pub fn check(s: &str) -> Result<(), FsError> {
    if !has_escapes(s) || from_bytes(&to_bytes(s)) == s {
        return Ok(());
    }
    Err(FsError::InvalidArgument(format!(
        "{}: escaped bytes that form UTF-8 (write the characters themselves)",
        shown(s)
    )))
}

/// `s` for people: each byte that is not UTF-8 as `\xNN`.
pub fn shown(s: &str) -> Cow<'_, str> {
    with_bytes_as(s, "\\x")
}

/// JSON text (as serde_json writes it, non-ASCII characters as they are)
/// with each escaped byte as `\udcNN`, the lone surrogate Python's
/// `surrogateescape` gives the byte.
pub fn json_text(json: &str) -> Cow<'_, str> {
    with_bytes_as(json, "\\udc")
}

/// `s` with each escape character as `prefix` and its byte in hex.
fn with_bytes_as<'a>(s: &'a str, prefix: &str) -> Cow<'a, str> {
    if !has_escapes(s) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if is_escape(c) {
            out.push_str(&format!("{prefix}{:02x}", c as u32 - BASE));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// An error for a name with bytes that are not UTF-8 where only UTF-8 can
/// go (an object key in a UFS), or `Ok`.
pub fn utf8_only(path: &str, where_: &str) -> Result<(), FsError> {
    if has_escapes(path) {
        return Err(FsError::IllegalName(format!(
            "{}: {where_} holds only UTF-8 names",
            shown(path)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(b: &[u8]) {
        let s = from_bytes(b);
        assert_eq!(&*to_bytes(&s), b, "{b:?} -> {s:?}");
        assert_eq!(byte_len(&s), b.len());
        assert!(check(&s).is_ok(), "{s:?}");
    }

    #[test]
    fn every_byte_string_has_one_form_and_back() {
        round(b"plain.txt");
        round("caf\u{e9} \u{1F600}".as_bytes());
        round(b"caf\xe9.txt");
        round(b"\xff\xfe\x80");
        round(b"half \xe2\x82 of a euro, then \xe2\x82\xac");
        // A name holding one of the escape characters itself.
        round("odd \u{10FFE9}".as_bytes());
        round(&[0xF4, 0x8F, 0xBF, 0xBF, 0xF4, 0x90]);
        // Every two-byte string: none collide.
        let mut seen = std::collections::HashSet::new();
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                let v = [a, b];
                round(&v);
                assert!(seen.insert(from_bytes(&v).into_owned()));
            }
        }
        // Bytes that are valid UTF-8 keep their form: no escapes.
        assert_eq!(from_bytes("é".as_bytes()), "é");
        assert!(matches!(from_bytes(b"abc"), Cow::Borrowed(_)));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_round_trip(
            b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)
        ) {
            round(&b);
        }
    }

    #[test]
    fn forms_that_stand_for_utf8_are_refused() {
        // "é" is C3 A9: the escaped form of those bytes is not canonical.
        let odd: String = [escape(0xC3), escape(0xA9)].iter().collect();
        assert!(check(&odd).is_err());
        assert!(check(&from_bytes(b"\xc3")).is_ok());
    }

    #[test]
    fn shown_as_text_and_as_json() {
        let s = from_bytes(b"caf\xe9\\x");
        assert_eq!(shown(&s), "caf\\xe9\\x");
        let json = format!("{{\"name\": \"{}\"}}", from_bytes(b"caf\xe9"));
        assert_eq!(json_text(&json), "{\"name\": \"caf\\udce9\"}");
        assert!(utf8_only(&s, "S3").is_err());
        assert!(utf8_only("caf\u{e9}", "S3").is_ok());
    }
}
