//! The `contract_enum!` macro: a fieldless enum whose integer values are part
//! of a wire contract, with checked conversion from `i32`, stable names and a
//! serde form that writes the name and rejects unknown names.

macro_rules! contract_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal => $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(i32)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant = $value ),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[ $( $name::$variant ),+ ];

            /// The contract integer value.
            pub const fn value(self) -> i32 {
                self as i32
            }

            /// The contract name (upper snake case, as in the Python reference).
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $text ),+
                }
            }

            /// Converts a contract integer, rejecting values that name no variant.
            pub fn from_value(value: i32) -> $crate::Result<Self> {
                match value {
                    $( $value => Ok($name::$variant), )+
                    _ => Err($crate::Error::InvalidEnumValue {
                        enum_name: stringify!($name),
                        value: i64::from(value),
                    }),
                }
            }

            /// Looks a variant up by its contract name.
            pub fn from_name(text: &str) -> $crate::Result<Self> {
                match text {
                    $( $text => Ok($name::$variant), )+
                    _ => Err($crate::Error::InvalidEnumName {
                        enum_name: stringify!($name),
                        name: text.to_owned(),
                    }),
                }
            }
        }

        impl TryFrom<i32> for $name {
            type Error = $crate::Error;
            fn try_from(value: i32) -> $crate::Result<Self> {
                Self::from_value(value)
            }
        }

        impl From<$name> for i32 {
            fn from(value: $name) -> i32 {
                value.value()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
                serializer.serialize_str(self.name())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(deserializer)?;
                $name::from_name(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}
