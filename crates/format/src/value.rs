//! A generic value, for the parts of a snapshot that have no fixed schema.
//!
//! PyTorch adds keys to its snapshot dict from release to release
//! (`allocator_settings`, `host_segments`, FX fields on frames, ...). The
//! model gives every known key a typed field; whatever else a file holds is
//! kept as a [`Value`] under the `extra` fields, so that import loses nothing.

use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Keys and values a record holds beyond its typed fields, in file order.
pub type Extra = Vec<(String, Value)>;

/// A dynamically typed value: what a pickle or JSON document can hold.
///
/// Tuples and sets read from a pickle become lists; dict keys that are not
/// strings are written as their decimal or text form.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Value {
    /// Python `None`, JSON `null`.
    #[default]
    None,
    /// A boolean.
    Bool(bool),
    /// An integer. Pickles can hold integers wider than 64 bits
    /// (`max_split_size` was once written as 2^64-1).
    Int(i128),
    /// A floating-point number.
    Float(f64),
    /// A text string.
    Str(String),
    /// A byte string.
    Bytes(Vec<u8>),
    /// A list, tuple or set.
    List(Vec<Value>),
    /// A dict, keys in file order.
    Map(Vec<(String, Value)>),
}

impl Value {
    /// About how many bytes of memory the value takes, its own size included.
    pub fn approx_size(&self) -> usize {
        std::mem::size_of::<Value>()
            + match self {
                Value::Str(s) => s.len(),
                Value::Bytes(b) => b.len(),
                Value::List(items) => items.iter().map(Value::approx_size).sum(),
                Value::Map(entries) => entries
                    .iter()
                    .map(|(k, v)| std::mem::size_of::<String>() + k.len() + v.approx_size())
                    .sum(),
                _ => 0,
            }
    }

    /// The value as an integer, if it is one.
    pub fn as_int(&self) -> Option<i128> {
        match *self {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(b as i128),
            _ => None,
        }
    }

    /// The value as a string slice, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Looks up `key` in a map value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Marker keys that carry the two kinds of value JSON and MessagePack cannot
/// hold natively. A map with exactly one of these keys is read back as that kind.
const BIG_INT_KEY: &str = "$int";
const BYTES_KEY: &str = "$bytes";

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::None => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => {
                if let Ok(v) = i64::try_from(*i) {
                    s.serialize_i64(v)
                } else if let Ok(v) = u64::try_from(*i) {
                    s.serialize_u64(v)
                } else {
                    let mut m = s.serialize_map(Some(1))?;
                    m.serialize_entry(BIG_INT_KEY, &i.to_string())?;
                    m.end()
                }
            }
            Value::Float(f) => s.serialize_f64(*f),
            Value::Str(t) => s.serialize_str(t),
            Value::Bytes(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry(BYTES_KEY, &hex)?;
                m.end()
            }
            Value::List(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                let mut m = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::None)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::Bytes(v.to_vec()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::List(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries: Vec<(String, Value)> =
            Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            entries.push((k, v));
        }
        if let [(k, Value::Str(text))] = entries.as_slice() {
            if k == BIG_INT_KEY {
                return text.parse::<i128>().map(Value::Int).map_err(|_| {
                    de::Error::custom(format!(
                        "invalid {BIG_INT_KEY} value {}",
                        crate::visible::quoted(text)
                    ))
                });
            }
            if k == BYTES_KEY {
                return decode_hex(text)
                    .map(Value::Bytes)
                    .ok_or_else(|| de::Error::custom(format!("invalid {BYTES_KEY} value")));
            }
        }
        Ok(Value::Map(entries))
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(v: &Value) {
        let json = serde_json::to_string(v).unwrap();
        assert_eq!(
            &serde_json::from_str::<Value>(&json).unwrap(),
            v,
            "json {json}"
        );
        let mp = rmp_serde::to_vec(v).unwrap();
        assert_eq!(&rmp_serde::from_slice::<Value>(&mp).unwrap(), v);
    }

    #[test]
    fn every_kind_round_trips_through_json_and_msgpack() {
        round_trip(&Value::Map(vec![
            ("none".into(), Value::None),
            ("t".into(), Value::Bool(true)),
            ("neg".into(), Value::Int(-1)),
            ("u64max".into(), Value::Int(u64::MAX as i128)),
            ("huge".into(), Value::Int(1i128 << 100)),
            ("f".into(), Value::Float(0.5)),
            ("s".into(), Value::Str("x".into())),
            ("b".into(), Value::Bytes(vec![0, 255, 16])),
            (
                "l".into(),
                Value::List(vec![Value::Int(1), Value::Str("a".into())]),
            ),
        ]));
    }
}
