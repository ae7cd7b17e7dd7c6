//! The columns a user's serde type reads: traced from its `Deserialize`
//! implementation, so a typed input needs no schema written beside it.
//!
//! The trace hands each field a value of the kind it asks for (a string
//! field gets an RFC 3339 time, so `chrono::DateTime` fields parse) and
//! records that kind: `string`, `long`, `double` or `boolean`, the
//! pipeline file's column types. `Option<_>` fields are the column of
//! their inner type, an enum of unit variants a string. Nested structs,
//! lists, maps, enums with data, fields with `#[serde(alias)]` names and
//! `#[serde(flatten)]` are not columns and are refused, naming the field.
//! An enum is traced by its first variant only: one mixing unit variants
//! with variants holding data is a string column, and a record of a data
//! variant is then not read. A type that checks the text or number it is
//! handed (`NaiveDate`, `Uuid`, `NonZeroU32`) may refuse the trace's
//! sample: its error is returned, and such an input names its columns with
//! a schema instead.
//!
//! ```
//! #[derive(serde::Deserialize)]
//! struct Tx { card: String, amount: f64, declines: Option<i64>, approved: bool }
//! let columns = tidemark_types::typed_columns::columns_of::<Tx>().unwrap();
//! assert_eq!(columns, [("card".to_string(), "string"), ("amount".into(), "double"),
//!                      ("declines".into(), "long"), ("approved".into(), "boolean")]);
//! ```

use serde::de::value::Error as TraceError;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::forward_to_deserialize_any;

/// What a traced string field is handed: a time, so that time types read.
const STRING_SAMPLE: &str = "1970-01-01T00:00:00Z";

/// `T`'s columns and their types, in its fields' order (see the module).
pub fn columns_of<T: DeserializeOwned>() -> Result<Vec<(String, &'static str)>, String> {
    let mut columns = Vec::new();
    let last_key = std::cell::Cell::new(None);
    let traced = T::deserialize(StructTracer {
        columns: &mut columns,
        last_key: &last_key,
    });
    match traced {
        Ok(_) => Ok(columns),
        // serde lists a field's aliases among its names, and the second
        // name of one field is a duplicate: which is the field's own name
        // cannot be told, so neither is guessed.
        Err(e) if e.to_string().starts_with("duplicate field") => Err(format!(
            "{e}: `{}` is another name of it (`#[serde(alias)]`), and a field \
             of several names is not one column",
            last_key.get().unwrap_or_default()
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// Asks the type for its struct, and walks its fields.
struct StructTracer<'a> {
    columns: &'a mut Vec<(String, &'static str)>,
    /// The name last handed as a key (named when it is a duplicate).
    last_key: &'a std::cell::Cell<Option<&'static str>>,
}

impl<'de> de::Deserializer<'de> for StructTracer<'_> {
    type Error = TraceError;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, TraceError> {
        Err(de::Error::custom(
            "the type is not a struct of named fields (a map, a tuple or \
             `#[serde(flatten)]` cannot be traced into columns)",
        ))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        visitor.visit_map(Fields {
            names: fields,
            next: 0,
            columns: self.columns,
            last_key: self.last_key,
        })
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        visitor.visit_newtype_struct(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

/// Hands the struct each of its fields once, recording the kind each asks
/// for.
struct Fields<'a> {
    names: &'static [&'static str],
    next: usize,
    columns: &'a mut Vec<(String, &'static str)>,
    last_key: &'a std::cell::Cell<Option<&'static str>>,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = TraceError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, TraceError> {
        let Some(name) = self.names.get(self.next) else {
            return Ok(None);
        };
        self.last_key.set(Some(name));
        seed.deserialize((*name).into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, TraceError> {
        let name = self.names.get(self.next).copied().unwrap_or_default();
        self.next += 1;
        let mut kind = None;
        let value = seed
            .deserialize(FieldTracer { kind: &mut kind })
            .map_err(|e| de::Error::custom(format!("field `{name}`: {e}")))?;
        match kind {
            Some(kind) => self.columns.push((name.to_string(), kind)),
            None => {
                return Err(de::Error::custom(format!(
                    "field `{name}`: its type reads no column value"
                )))
            }
        }
        Ok(value)
    }
}

/// `Deserializer` methods that record a column kind and hand the visitor a
/// value of it.
macro_rules! traced {
    ($($method:ident => $visit:ident($sample:expr) as $kind:literal),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
                *self.kind = Some($kind);
                visitor.$visit($sample)
            }
        )*
    };
}

/// One field: records the kind its type asks for and hands it a value of
/// that kind.
struct FieldTracer<'a> {
    kind: &'a mut Option<&'static str>,
}

impl FieldTracer<'_> {
    fn not_a_column<T>(what: &str) -> Result<T, TraceError> {
        Err(de::Error::custom(format!(
            "{what} is not a column (columns are strings, numbers, booleans and times)"
        )))
    }
}

impl<'de> de::Deserializer<'de> for FieldTracer<'_> {
    type Error = TraceError;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, TraceError> {
        Self::not_a_column("a self-describing value (`serde_json::Value`, an untagged enum)")
    }
    traced! {
        deserialize_bool => visit_bool(false) as "boolean",
        deserialize_i8 => visit_i8(0) as "long",
        deserialize_i16 => visit_i16(0) as "long",
        deserialize_i32 => visit_i32(0) as "long",
        deserialize_i64 => visit_i64(0) as "long",
        deserialize_u8 => visit_u8(0) as "long",
        deserialize_u16 => visit_u16(0) as "long",
        deserialize_u32 => visit_u32(0) as "long",
        deserialize_u64 => visit_u64(0) as "long",
        deserialize_f32 => visit_f32(0.0) as "double",
        deserialize_f64 => visit_f64(0.0) as "double",
        deserialize_char => visit_char('a') as "string",
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        *self.kind = Some("string");
        visitor.visit_str(STRING_SAMPLE)
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        self.deserialize_str(visitor)
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        visitor.visit_some(self)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        visitor.visit_newtype_struct(self)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, TraceError> {
        Self::not_a_column(&format!("a nested struct (`{name}`)"))
    }
    fn deserialize_seq<V: Visitor<'de>>(self, _: V) -> Result<V::Value, TraceError> {
        Self::not_a_column("a list")
    }
    fn deserialize_map<V: Visitor<'de>>(self, _: V) -> Result<V::Value, TraceError> {
        Self::not_a_column("a map")
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        // An enum of unit variants reads a string; one with data is no
        // column.
        let Some(first) = variants.first() else {
            return Self::not_a_column(&format!("an enum without variants (`{name}`)"));
        };
        *self.kind = Some("string");
        visitor
            .visit_enum((*first).into_deserializer())
            .map_err(|_: TraceError| {
                de::Error::custom(format!(
                    "an enum with data (`{name}`) is not a column (columns are strings, \
                     numbers, booleans and times)"
                ))
            })
    }

    forward_to_deserialize_any! {
        i128 u128 bytes byte_buf unit unit_struct tuple tuple_struct identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::columns_of;
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Renamed {
        #[serde(rename = "cardId")]
        card: String,
        #[serde(default)]
        count: u32,
        at: std::time::SystemTime,
    }

    #[test]
    fn renamed_and_defaulted_fields_are_columns_and_nested_ones_are_refused() {
        // SystemTime deserializes as a struct of its own: refused by name.
        let e = columns_of::<Renamed>().expect_err("a nested struct");
        assert!(e.contains("field `at`"), "{e}");
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Flat {
            #[serde(rename = "cardId")]
            card: String,
            #[serde(default)]
            count: u32,
        }
        assert_eq!(
            columns_of::<Flat>().unwrap(),
            [("cardId".to_string(), "string"), ("count".into(), "long")]
        );
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Listy {
            tags: Vec<String>,
        }
        let e = columns_of::<Listy>().expect_err("a list");
        assert!(e.contains("field `tags`") && e.contains("a list"), "{e}");
        #[derive(Deserialize)]
        #[allow(dead_code)]
        enum Status {
            Approved,
            Declined,
        }
        #[derive(Deserialize)]
        #[allow(dead_code)]
        enum Shape {
            Circle(f64),
        }
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Enums {
            status: Status,
            shape: Option<Shape>,
        }
        let e = columns_of::<Enums>().expect_err("an enum with data");
        assert!(e.contains("field `shape`") && e.contains("Shape"), "{e}");
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Unit {
            status: Status,
        }
        assert_eq!(
            columns_of::<Unit>().unwrap(),
            [("status".to_string(), "string")]
        );
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Aliased {
            #[serde(alias = "cardId")]
            card: String,
        }
        let e = columns_of::<Aliased>().expect_err("two names, one field");
        assert!(e.contains("cardId") && e.contains("alias"), "{e}");
        let e = columns_of::<serde_json::Value>().expect_err("no struct");
        assert!(e.contains("not a struct"), "{e}");
    }
}
