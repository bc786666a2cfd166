//! Row codecs by their historical path: each now lives in its format's file under
//! [`super::formats`] (layouts, rounding and sources documented there), and the trait in
//! [`super::codec`]. Kept so `kvbench::kv::format::{F16Row, …, RowCodec}` stays valid.

pub use super::codec::RowCodec;
pub use super::formats::fp16::F16Row;
pub use super::formats::fp8::Fp8Row;
pub use super::formats::int4::Int4GroupRow;
pub use super::formats::int8::Int8TokenRow;
pub use super::formats::mxfp4::Mxfp4Row;
pub use super::formats::nvfp4::Nvfp4Row;
pub use super::formats::q4_0::Q4_0Row;
pub use super::formats::q8_0::Q8_0Row;
