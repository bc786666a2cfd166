//! A GGUF writer for tests, written from the spec (ggml `docs/gguf.md`, version 3) rather than
//! with kvbench's reader: rewrites a real file's header with edited metadata or tensor infos and
//! copies its data section as it is, and builds tiny models for the fuzz seeds.
#![allow(dead_code)]

use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;

/// One tensor info: name, dimensions innermost first (ggml `ne`), ggml type id, offset.
#[derive(Debug, Clone)]
pub struct Info {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: u32,
    pub offset: u64,
}

/// A GGUF file in pieces: metadata in order, tensor infos, data section.
#[derive(Debug, Clone)]
pub struct Gguf {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<Info>,
    pub data: Vec<u8>,
}

pub fn dtype_id(t: GgmlDType) -> u32 {
    use GgmlDType as G;
    match t {
        G::F32 => 0,
        G::F16 => 1,
        G::Q4_0 => 2,
        G::Q4_1 => 3,
        G::Q5_0 => 6,
        G::Q5_1 => 7,
        G::Q8_0 => 8,
        G::Q8_1 => 9,
        G::Q2K => 10,
        G::Q3K => 11,
        G::Q4K => 12,
        G::Q5K => 13,
        G::Q6K => 14,
        G::Q8K => 15,
        G::BF16 => 30,
    }
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    w.extend((s.len() as u64).to_le_bytes());
    w.extend(s.as_bytes());
}

fn put_value(w: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => w.push(*x),
        Value::I8(x) => w.extend(x.to_le_bytes()),
        Value::U16(x) => w.extend(x.to_le_bytes()),
        Value::I16(x) => w.extend(x.to_le_bytes()),
        Value::U32(x) => w.extend(x.to_le_bytes()),
        Value::I32(x) => w.extend(x.to_le_bytes()),
        Value::U64(x) => w.extend(x.to_le_bytes()),
        Value::I64(x) => w.extend(x.to_le_bytes()),
        Value::F32(x) => w.extend(x.to_le_bytes()),
        Value::F64(x) => w.extend(x.to_le_bytes()),
        Value::Bool(x) => w.push(u8::from(*x)),
        Value::String(s) => put_str(w, s),
        Value::Array(items) => {
            w.extend(items.first().map_or(4, type_id).to_le_bytes());
            w.extend((items.len() as u64).to_le_bytes());
            for i in items {
                put_value(w, i);
            }
        }
    }
}

impl Gguf {
    /// Reads `path` with candle's reader (metadata in sorted key order).
    pub fn read(path: &Path) -> Gguf {
        let bytes = std::fs::read(path).unwrap();
        let c = Content::read(&mut std::io::Cursor::new(&bytes)).unwrap();
        let mut metadata: Vec<(String, Value)> = c.metadata.into_iter().collect();
        metadata.sort_by(|a, b| a.0.cmp(&b.0));
        let mut tensors: Vec<Info> = c
            .tensor_infos
            .into_iter()
            .map(|(name, t)| Info {
                name,
                ne: t.shape.dims().iter().rev().map(|&d| d as u64).collect(),
                ty: dtype_id(t.ggml_dtype),
                offset: t.offset,
            })
            .collect();
        tensors.sort_by_key(|t| t.offset);
        Gguf {
            version: 3,
            metadata,
            tensors,
            data: bytes[c.tensor_data_offset as usize..].to_vec(),
        }
    }

    /// The file's bytes: header, padding to 32 bytes, data section.
    pub fn bytes(&self) -> Vec<u8> {
        let mut w = Vec::new();
        w.extend(b"GGUF");
        w.extend(self.version.to_le_bytes());
        w.extend((self.tensors.len() as u64).to_le_bytes());
        w.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut w, k);
            w.extend(type_id(v).to_le_bytes());
            put_value(&mut w, v);
        }
        for t in &self.tensors {
            put_str(&mut w, &t.name);
            w.extend((t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                w.extend(d.to_le_bytes());
            }
            w.extend(t.ty.to_le_bytes());
            w.extend(t.offset.to_le_bytes());
        }
        while w.len() % 32 != 0 {
            w.push(0);
        }
        w.extend(&self.data);
        w
    }

    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.bytes()).unwrap();
    }

    /// Sets (or appends) a metadata value.
    pub fn set(&mut self, key: &str, v: Value) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = v,
            None => self.metadata.push((key.to_string(), v)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Byte range of a tensor in the data section.
    pub fn tensor_start(&self, name: &str) -> usize {
        self.tensors.iter().find(|t| t.name == name).unwrap().offset as usize
    }
}

/// A tiny Llama GGUF (2 layers, hidden 8, 2 query heads and 1 kv head of 4, intermediate 16, f32
/// weights of seeded values) with the first 300 tokens of `vocab_from`'s vocabulary and the
/// merges among them: a small seed that exercises every part of the reader.
pub fn tiny_model(vocab_from: &Gguf) -> Gguf {
    let tokens: Vec<String> = match vocab_from.get("tokenizer.ggml.tokens") {
        Some(Value::Array(v)) => v
            .iter()
            .take(300)
            .map(|t| match t {
                Value::String(s) => s.clone(),
                _ => String::new(),
            })
            .collect(),
        _ => panic!("no tokens"),
    };
    let known: std::collections::HashSet<&str> = tokens.iter().map(String::as_str).collect();
    let merges: Vec<Value> = match vocab_from.get("tokenizer.ggml.merges") {
        Some(Value::Array(v)) => v
            .iter()
            .filter_map(|m| match m {
                Value::String(s) => {
                    let (a, b) = s.split_once(' ')?;
                    (known.contains(a) && known.contains(b) && known.contains(&*format!("{a}{b}")))
                        .then(|| Value::String(s.clone()))
                }
                _ => None,
            })
            .take(50)
            .collect(),
        _ => Vec::new(),
    };
    let vocab = tokens.len() as u64;
    let (hidden, heads, kv, hd, inter, layers) = (8u64, 2u64, 1u64, 4u64, 16u64, 2u64);
    let mut metadata = vec![
        (
            "general.architecture".to_string(),
            Value::String("llama".into()),
        ),
        ("general.alignment".to_string(), Value::U32(32)),
        ("llama.block_count".to_string(), Value::U32(layers as u32)),
        ("llama.context_length".to_string(), Value::U32(64)),
        (
            "llama.embedding_length".to_string(),
            Value::U32(hidden as u32),
        ),
        (
            "llama.feed_forward_length".to_string(),
            Value::U32(inter as u32),
        ),
        (
            "llama.attention.head_count".to_string(),
            Value::U32(heads as u32),
        ),
        (
            "llama.attention.head_count_kv".to_string(),
            Value::U32(kv as u32),
        ),
        ("llama.rope.freq_base".to_string(), Value::F32(10000.0)),
        (
            "llama.attention.layer_norm_rms_epsilon".to_string(),
            Value::F32(1e-5),
        ),
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".to_string(),
            Value::String("default".into()),
        ),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        ),
        ("tokenizer.ggml.merges".to_string(), Value::Array(merges)),
        ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(2)),
    ];
    metadata.push((
        "tokenizer.ggml.token_type".to_string(),
        Value::Array((0..vocab).map(|_| Value::I32(1)).collect()),
    ));
    let mut shapes: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![hidden, vocab]),
        ("output_norm.weight".into(), vec![hidden]),
    ];
    for i in 0..layers {
        for (n, ne) in [
            ("attn_norm", vec![hidden]),
            ("attn_q", vec![hidden, heads * hd]),
            ("attn_k", vec![hidden, kv * hd]),
            ("attn_v", vec![hidden, kv * hd]),
            ("attn_output", vec![heads * hd, hidden]),
            ("ffn_norm", vec![hidden]),
            ("ffn_gate", vec![hidden, inter]),
            ("ffn_up", vec![hidden, inter]),
            ("ffn_down", vec![inter, hidden]),
        ] {
            shapes.push((format!("blk.{i}.{n}.weight"), ne));
        }
    }
    let mut data = Vec::new();
    let mut tensors = Vec::new();
    let mut x = 0x2545_f491_u32;
    for (name, ne) in shapes {
        let n: u64 = ne.iter().product();
        tensors.push(Info {
            name: name.clone(),
            ne,
            ty: 0,
            offset: data.len() as u64,
        });
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let v = if name.contains("norm") {
                1.0f32
            } else {
                (x % 2001) as f32 / 1000.0 - 1.0
            };
            data.extend(v.to_le_bytes());
        }
        while data.len() % 32 != 0 {
            data.push(0);
        }
    }
    Gguf {
        version: 3,
        metadata,
        tensors,
        data,
    }
}
