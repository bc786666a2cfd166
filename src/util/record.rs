//! One source of truth for the columns of a CSV row type: `csv_record!` declares the struct,
//! and from its fields — nothing else — derives the column list ([`Record::COLUMNS`], the
//! header), `Serialize` (one flat record, values in column order) and `Deserialize` (cells
//! matched to fields by header name).
//!
//! **A new column is one field.** A plain field `pub name: T,` is the column `name`; a group
//! field `pub ttft: Latency { ttft_ms_mean: mean, … },` is one column per listed sub-field, in
//! that order, named as written. Both the header and every record come from that one list, so a
//! column cannot be in one and not the other, nor in a different place; the header is checked
//! for duplicates at compile time. (The README documents each column; a test per row type keeps
//! its table in step with [`Record::COLUMNS`].)
//!
//! Why not serde's derive: the `csv` crate writes only flat structs, so neither a nested
//! summary nor `#[serde(flatten)]` (which serializes through a map) can be written, and a
//! flattened struct is read through serde's buffered values, where an empty cell is no longer
//! `None` (nor `1` a string). The macro flattens at compile time instead, with
//! `'static` column names, so `COLUMNS` is a constant (it is recorded in `meta.json`).
//!
//! Reading follows serde's rules for a missing field, so files written before a column existed
//! still read: a column absent from the header reads as `None` when its type is an `Option`,
//! and is an error naming it otherwise; unknown columns are skipped. A value no column holds
//! (a group type's sub-field not listed for this use) is not written and reads back as its
//! default; [`Record::into_columns`] clears such values, so a row equals its CSV round trip.

use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeStruct;
use serde::{Deserializer, Serializer};

/// A row type whose fields are its CSV columns, implemented by `csv_record!`.
pub trait Record: Default + Sized {
    /// Column names in order: the CSV header, one entry per plain field and per listed
    /// sub-field of a group field.
    const COLUMNS: &'static [&'static str];

    /// Writes every column's value, in [`Record::COLUMNS`] order, as a field of `s` named by
    /// its column. Errors: those of the serializer (e.g. `csv` refusing a nested value).
    fn serialize_columns<S: SerializeStruct>(&self, s: &mut S) -> Result<(), S::Error>;

    /// Reads the value of column `name` from `value` into its field. Errors: the
    /// deserializer's, and `unknown field` when `name` is not in [`Record::COLUMNS`].
    fn set_column<'de, D: Deserializer<'de>>(
        &mut self,
        name: &str,
        value: D,
    ) -> Result<(), D::Error>;

    /// This row with every value that no column holds reset to its default (e.g. the
    /// statistics a group type computes but this row does not list): what reading its CSV
    /// back gives.
    fn into_columns(self) -> Self;
}

/// Serializes `row` as one flat struct named `name`: each column a field, in order (the
/// `Serialize` of a `csv_record!` type). Errors: the serializer's.
pub fn serialize<R: Record, S: Serializer>(
    row: &R,
    s: S,
    name: &'static str,
) -> Result<S::Ok, S::Error> {
    let mut st = s.serialize_struct(name, R::COLUMNS.len())?;
    row.serialize_columns(&mut st)?;
    st.end()
}

/// Deserializes a row from a map of column name → value (a CSV record read with its header;
/// the `Deserialize` of a `csv_record!` type). Errors: a column given twice (`duplicate
/// field`), a missing column whose type is not an `Option` (`missing field`), and the value
/// errors of the deserializer (which name the record and field).
pub fn deserialize<'de, R: Record, D: Deserializer<'de>>(
    d: D,
    name: &'static str,
) -> Result<R, D::Error> {
    d.deserialize_struct(name, R::COLUMNS, RowVisitor::<R>(PhantomData))
}

struct RowVisitor<R>(PhantomData<R>);

impl<'de, R: Record> Visitor<'de> for RowVisitor<R> {
    type Value = R;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "a row with the columns {}", R::COLUMNS.join(","))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<R, A::Error> {
        let mut row = R::default();
        let mut seen = vec![false; R::COLUMNS.len()];
        while let Some(key) = map.next_key::<String>()? {
            let Some(i) = R::COLUMNS.iter().position(|c| *c == key) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            if std::mem::replace(&mut seen[i], true) {
                return Err(de::Error::duplicate_field(R::COLUMNS[i]));
            }
            map.next_value_seed(ColumnSeed {
                row: &mut row,
                name: R::COLUMNS[i],
            })?;
        }
        for (&name, _) in R::COLUMNS.iter().zip(seen).filter(|(_, seen)| !seen) {
            row.set_column(name, MissingColumn::<A::Error>(name, PhantomData))?;
        }
        Ok(row)
    }
}

/// Reads one column's value into a row.
struct ColumnSeed<'a, R> {
    row: &'a mut R,
    name: &'static str,
}

impl<'de, R: Record> DeserializeSeed<'de> for ColumnSeed<'_, R> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.row.set_column(self.name, d)
    }
}

/// The value of a column absent from the file: `None` for an `Option`, otherwise the error
/// `missing field` naming the column (serde's own rule for a missing struct field).
struct MissingColumn<E>(&'static str, PhantomData<E>);

impl<'de, E: de::Error> Deserializer<'de> for MissingColumn<E> {
    type Error = E;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, E> {
        Err(E::missing_field(self.0))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        visitor.visit_none()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

/// Whether `columns` holds no name twice; `const`, so `csv_record!` refuses a duplicate
/// column at compile time.
pub const fn distinct(columns: &[&str]) -> bool {
    let mut i = 0;
    while i < columns.len() {
        let mut j = i + 1;
        while j < columns.len() {
            if same(columns[i].as_bytes(), columns[j].as_bytes()) {
                return false;
            }
            j += 1;
        }
        i += 1;
    }
    true
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut k = 0;
    while k < a.len() {
        if a[k] != b[k] {
            return false;
        }
        k += 1;
    }
    true
}

/// The number of names in `parts`, for [`concat`].
pub const fn total(parts: &[&[&'static str]]) -> usize {
    let (mut n, mut i) = (0, 0);
    while i < parts.len() {
        n += parts[i].len();
        i += 1;
    }
    n
}

/// `parts` joined into one array of `N` names (`N` = [`total`]`(parts)`): the column list of a
/// row whose fields are columns, groups of columns and whole records.
pub const fn concat<const N: usize>(parts: &[&[&'static str]]) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut k, mut i) = (0, 0);
    while i < parts.len() {
        let mut j = 0;
        while j < parts[i].len() {
            out[k] = parts[i][j];
            k += 1;
            j += 1;
        }
        i += 1;
    }
    out
}

/// Declares a CSV row struct whose fields are its columns and implements [`Record`],
/// `serde::Serialize` and `serde::Deserialize` for it (see the module documentation: a new
/// column is one field).
///
/// ```ignore
/// csv_record! {
///     /// One row.
///     #[derive(Debug, Clone, Default, PartialEq)]
///     pub struct Row {
///         /// A plain field: the column `scheme`.
///         pub scheme: String,
///         /// A group field: the columns `ttft_ms_mean`, `ttft_ms_p99` (from `Latency`'s
///         /// `mean` and `p99`; a path such as `a.b` reaches into a nested value), in order.
///         pub ttft: Latency { ttft_ms_mean: mean, ttft_ms_p99: p99 },
///         /// A record field: every column of another `csv_record!` type, in its order.
///         pub stats: Stats { .. },
///     }
/// }
/// ```
///
/// The struct must implement `Default` (the value of a column a file lacks starts there), as
/// must each column's type. Don't derive serde's traits on it: the macro implements them. Each
/// field takes one step of macro recursion (the default limit, 128, is ample for a row).
macro_rules! csv_record {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident { $($body:tt)* }
    ) => {
        $crate::util::record::csv_record! {
            @munch [$(#[$meta])* $vis struct $name] [] [] $($body)*
        }
    };
    // A record field: every column of another row type.
    (@munch $head:tt [$($fields:tt)*] [$($ents:tt)*]
        $(#[$fmeta:meta])* $fvis:vis $f:ident : $t:ty { .. }
        $(, $($rest:tt)*)?
    ) => {
        $crate::util::record::csv_record! {
            @munch $head [$($fields)* $(#[$fmeta])* $fvis $f: $t,]
            [$($ents)* (rec $f : $t)] $($($rest)*)?
        }
    };
    // A group field: one column per listed `column: sub.field`.
    (@munch $head:tt [$($fields:tt)*] [$($ents:tt)*]
        $(#[$fmeta:meta])* $fvis:vis $f:ident : $t:ty { $($col:ident : $($sub:ident).+),+ $(,)? }
        $(, $($rest:tt)*)?
    ) => {
        $crate::util::record::csv_record! {
            @munch $head [$($fields)* $(#[$fmeta])* $fvis $f: $t,]
            [$($ents)* $((col $col => $f $(. $sub)+))+] $($($rest)*)?
        }
    };
    // A plain field: the column of its name.
    (@munch $head:tt [$($fields:tt)*] [$($ents:tt)*]
        $(#[$fmeta:meta])* $fvis:vis $f:ident : $t:ty
        $(, $($rest:tt)*)?
    ) => {
        $crate::util::record::csv_record! {
            @munch $head [$($fields)* $(#[$fmeta])* $fvis $f: $t,]
            [$($ents)* (col $f => $f)] $($($rest)*)?
        }
    };
    // Every field read: emit the struct and its impls from the list of entries.
    (@munch [$(#[$meta:meta])* $vis:vis struct $name:ident] [$($fields:tt)*] [$($ent:tt)*]) => {
        $(#[$meta])*
        $vis struct $name { $($fields)* }

        impl $crate::util::record::Record for $name {
            const COLUMNS: &'static [&'static str] = &{
                const PARTS: &[&[&'static str]] =
                    &[$($crate::util::record::csv_record!(@cols $ent)),*];
                const N: usize = $crate::util::record::total(PARTS);
                $crate::util::record::concat::<N>(PARTS)
            };

            fn serialize_columns<S: ::serde::ser::SerializeStruct>(
                &self,
                s: &mut S,
            ) -> ::std::result::Result<(), S::Error> {
                $( $crate::util::record::csv_record!(@ser self s $ent); )*
                Ok(())
            }

            fn set_column<'de, D: ::serde::Deserializer<'de>>(
                &mut self,
                name: &str,
                value: D,
            ) -> ::std::result::Result<(), D::Error> {
                $( $crate::util::record::csv_record!(@set self name value $ent); )*
                Err(<D::Error as ::serde::de::Error>::unknown_field(name, Self::COLUMNS))
            }

            fn into_columns(mut self) -> Self {
                let mut out = Self::default();
                $( $crate::util::record::csv_record!(@take self out $ent); )*
                out
            }
        }

        const _: () = assert!(
            $crate::util::record::distinct(<$name as $crate::util::record::Record>::COLUMNS),
            concat!(stringify!($name), " names a column twice")
        );

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(
                &self,
                s: S,
            ) -> ::std::result::Result<S::Ok, S::Error> {
                $crate::util::record::serialize(self, s, stringify!($name))
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(
                d: D,
            ) -> ::std::result::Result<Self, D::Error> {
                $crate::util::record::deserialize(d, stringify!($name))
            }
        }
    };
    (@cols (col $col:ident => $($p:ident).+)) => { &[stringify!($col)] };
    (@cols (rec $f:ident : $t:ty)) => { <$t as $crate::util::record::Record>::COLUMNS };
    (@ser $this:tt $s:ident (col $col:ident => $($p:ident).+)) => {
        $s.serialize_field(stringify!($col), &$this.$($p).+)?
    };
    (@ser $this:tt $s:ident (rec $f:ident : $t:ty)) => {
        $crate::util::record::Record::serialize_columns(&$this.$f, $s)?
    };
    (@set $this:tt $n:ident $v:ident (col $col:ident => $($p:ident).+)) => {
        if $n == stringify!($col) {
            $this.$($p).+ = ::serde::Deserialize::deserialize($v)?;
            return Ok(());
        }
    };
    (@set $this:tt $n:ident $v:ident (rec $f:ident : $t:ty)) => {
        if <$t as $crate::util::record::Record>::COLUMNS.contains(&$n) {
            return $crate::util::record::Record::set_column(&mut $this.$f, $n, $v);
        }
    };
    (@take $this:tt $out:ident (col $col:ident => $($p:ident).+)) => {
        $out.$($p).+ = ::std::mem::take(&mut $this.$($p).+)
    };
    (@take $this:tt $out:ident (rec $f:ident : $t:ty)) => {
        $out.$f = $crate::util::record::Record::into_columns(::std::mem::take(&mut $this.$f))
    };
}
pub(crate) use csv_record;

#[cfg(test)]
mod tests {
    use super::*;

    /// A group type with more statistics than one use lists.
    #[derive(Debug, Clone, Copy, Default, PartialEq)]
    struct Spread {
        lo: Option<f64>,
        hi: Option<f64>,
        n: Option<usize>,
    }

    csv_record! {
        /// A row mixing plain fields, a required one and two uses of one group.
        #[derive(Debug, Clone, Default, PartialEq)]
        struct Row {
            name: String,
            a: Spread { a_lo: lo, a_hi: hi },
            count: Option<usize>,
            b: Spread { b_n: n, b_lo: lo },
            ok: Option<bool>,
        }
    }

    fn row() -> Row {
        Row {
            name: "x,y".into(),
            a: Spread {
                lo: Some(0.5),
                hi: Some(2.0),
                n: None,
            },
            count: None,
            b: Spread {
                lo: Some(-1e-7),
                hi: None,
                n: Some(3),
            },
            ok: Some(true),
        }
    }

    fn csv_text(rows: &[Row]) -> String {
        let mut w = csv::Writer::from_writer(Vec::new());
        for r in rows {
            w.serialize(r).unwrap();
        }
        String::from_utf8(w.into_inner().unwrap()).unwrap()
    }

    fn read(text: &str) -> Result<Vec<Row>, csv::Error> {
        csv::Reader::from_reader(text.as_bytes())
            .deserialize()
            .collect()
    }

    /// The columns are the fields in order, a group's sub-fields as listed (its own field
    /// order ignored); the header csv writes from the serialized names is the same list.
    #[test]
    fn columns_follow_the_fields_and_the_listed_sub_fields() {
        assert_eq!(
            Row::COLUMNS,
            ["name", "a_lo", "a_hi", "count", "b_n", "b_lo", "ok"]
        );
        let text = csv_text(&[row()]);
        assert_eq!(
            text,
            "name,a_lo,a_hi,count,b_n,b_lo,ok\n\"x,y\",0.5,2.0,,3,-1e-7,true\n"
        );
    }

    /// Written and read back, a row is itself; as JSON it is one flat object in column order.
    #[test]
    fn round_trip_and_flat_json() {
        assert_eq!(read(&csv_text(&[row()])).unwrap(), vec![row()]);
        assert_eq!(
            serde_json::to_string(&row()).unwrap(),
            r#"{"name":"x,y","a_lo":0.5,"a_hi":2.0,"count":null,"b_n":3,"b_lo":-1e-7,"ok":true}"#
        );
        let back: Row = serde_json::from_str(&serde_json::to_string(&row()).unwrap()).unwrap();
        assert_eq!(back, row());
    }

    /// A value no column holds (`a.n`, `b.hi`) is dropped by `into_columns`, as by a round trip.
    #[test]
    fn into_columns_keeps_what_the_columns_hold() {
        let mut r = row();
        r.a.n = Some(9);
        r.b.hi = Some(9.0);
        assert_eq!(r.clone().into_columns(), row());
        assert_eq!(read(&csv_text(&[r])).unwrap(), vec![row()]);
    }

    /// An older file: absent `Option` columns read as `None`, unknown columns are skipped, any
    /// column order reads; an absent required column, or one given twice, is an error naming it.
    #[test]
    fn older_and_odd_headers() {
        let rows = read("extra,b_lo,name\nq,1.5,n\n").unwrap();
        let want = Row {
            name: "n".into(),
            b: Spread {
                lo: Some(1.5),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(rows, vec![want]);
        let e = read("a_lo\n1\n").unwrap_err().to_string();
        assert!(e.contains("missing field `name`"), "{e}");
        let e = read("name,a_lo,a_lo\nn,1,2\n").unwrap_err().to_string();
        assert!(e.contains("duplicate field `a_lo`"), "{e}");
        let e = read("name,a_lo\nn,x\n").unwrap_err().to_string();
        assert!(e.contains("field 1"), "{e}");
    }

    /// The duplicate check the macro runs at compile time.
    #[test]
    fn distinct_by_hand() {
        assert!(distinct(&["a", "ab", "b"]));
        assert!(distinct(&[]));
        assert!(!distinct(&["a", "ab", "a"]));
        assert!(!distinct(&["ttft_ms_p50", "ttft_ms_p50"]));
        assert!(distinct(&["Ab", "ab"]));
    }
}
