//! Small enums that are a name in JSON and a one-byte code in `.snap` files.

/// Implements `name()`, `from_name()` and serde for a fieldless enum:
/// human-readable formats see the first name, binary formats the code, and
/// reading accepts the code or any of the names listed.
macro_rules! impl_coded_enum {
    ($ty:ident { $($variant:ident = $code:literal => $name:literal $(| $alias:literal)*),+ $(,)? }) => {
        impl $ty {
            /// The name PyTorch uses for this value.
            pub fn name(self) -> &'static str {
                match self { $($ty::$variant => $name),+ }
            }

            /// The value PyTorch calls `name`, if any.
            pub fn from_name(name: &str) -> Option<$ty> {
                match name {
                    $($name $(| $alias)* => Some($ty::$variant),)+
                    _ => None,
                }
            }

            /// The value's one-byte code in `.snap` files.
            pub(crate) fn code(self) -> u8 {
                match self { $($ty::$variant => $code),+ }
            }

            pub(crate) fn from_code(code: u64) -> Option<$ty> {
                match code {
                    $($code => Some($ty::$variant),)+
                    _ => None,
                }
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if s.is_human_readable() {
                    s.serialize_str(self.name())
                } else {
                    s.serialize_u8(self.code())
                }
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str(concat!("a ", stringify!($ty), " name or code"))
                    }
                    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<$ty, E> {
                        $ty::from_code(v).ok_or_else(|| {
                            E::custom(format!(concat!("unknown ", stringify!($ty), " code {}"), v))
                        })
                    }
                    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<$ty, E> {
                        self.visit_u64(u64::try_from(v).unwrap_or(u64::MAX))
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$ty, E> {
                        $ty::from_name(v).ok_or_else(|| {
                            E::custom(format!(concat!("unknown ", stringify!($ty), " {}"), crate::visible::quoted(v)))
                        })
                    }
                }
                d.deserialize_any(V)
            }
        }
    };
}

pub(crate) use impl_coded_enum;
