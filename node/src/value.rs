//! The value a holder attaches to its lock, as the JSON answers carry it: `value` when it
//! is UTF-8 text, `value_base64` (standard alphabet, padded) when it is not; never both.

use base64::Engine as _;

/// The JSON fields for `bytes`: (text, base64).
pub fn to_fields(bytes: &[u8]) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (Some(text.to_owned()), None),
        Err(_) => (None, Some(base64::engine::general_purpose::STANDARD.encode(bytes))),
    }
}

/// The bytes of the JSON fields (text, base64): `Ok(None)` with neither, an error with
/// both or with bad base64.
pub fn from_fields(text: Option<&str>, base64: Option<&str>) -> Result<Option<Vec<u8>>, String> {
    match (text, base64) {
        (None, None) => Ok(None),
        (Some(t), None) => Ok(Some(t.as_bytes().to_vec())),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map(Some)
            .map_err(|e| format!("value_base64 is not standard base64: {e}")),
        (Some(_), Some(_)) => Err("give value or value_base64, not both".to_owned()),
    }
}

/// A value for a line of text: quoted, control characters escaped, at most 200
/// characters shown.
pub fn quoted(text: &str) -> String {
    const SHOWN: usize = 200;
    let mut out: String = text.chars().take(SHOWN).collect::<String>().escape_debug().collect();
    if text.chars().count() > SHOWN {
        out.push('…');
    }
    format!("\"{out}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_goes_as_text_and_bytes_as_base64() {
        assert_eq!(to_fields(b"leader at 10.0.0.7"), (Some("leader at 10.0.0.7".to_owned()), None));
        let (t, b) = to_fields(&[0xff, 0x00, 0x41]);
        assert_eq!((t, b.as_deref()), (None, Some("/wBB")));
        assert_eq!(from_fields(None, Some("/wBB")), Ok(Some(vec![0xff, 0x00, 0x41])));
        assert_eq!(from_fields(Some("x"), None), Ok(Some(b"x".to_vec())));
        assert_eq!(from_fields(None, None), Ok(None));
        assert!(from_fields(Some("x"), Some("eA==")).is_err());
        assert!(from_fields(None, Some("not base64!")).is_err());
    }

    #[test]
    fn a_quoted_value_stays_on_one_line() {
        assert_eq!(quoted("a\nb\"c"), "\"a\\nb\\\"c\"");
        assert_eq!(quoted(&"x".repeat(300)).chars().count(), 200 + 3);
    }
}
