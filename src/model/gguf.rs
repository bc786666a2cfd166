//! Loading a Llama-family model and its tokenizer from one GGUF file (the format llama.cpp
//! writes; read with candle's `gguf_file` reader). Metadata keys follow the GGUF spec
//! (`{arch}.block_count`, `tokenizer.ggml.tokens`, ...).

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::mapped::WeightBytes;
use super::tokenizer::TextTokenizer;
use super::StoredTensor;
use super::{Block, Embedding, Linear, Model, ModelConfig, ModelSource, RopeStyle, WeightDtype};
use crate::error::{Error, Result};

/// Architectures whose GGUF tensors kvbench maps onto its decoder.
const SUPPORTED_ARCHS: &[&str] = &["llama", "mistral", "qwen2"];

/// Opened GGUF file: metadata plus a reader for tensor data (a buffered file, or any
/// `Read + Seek`, e.g. bytes in memory).
pub struct GgufFile<R = BufReader<File>> {
    path: std::path::PathBuf,
    content: Content,
    reader: R,
    /// The whole file mapped read-only, when opened from a path ([`GgufFile::open`]): tensors
    /// are then read in place ([`GgufFile::stored`]).
    map: Option<std::sync::Arc<memmap2::Mmap>>,
}

impl GgufFile {
    /// Opens and parses the header. Errors: [`Error::ModelNotFound`] when the file is missing,
    /// [`Error::Io`] when it cannot be read (permissions), [`Error::ModelFormat`] when it is not
    /// a readable GGUF.
    pub fn open(path: &Path) -> Result<Self> {
        let map = super::mapped::map_file(path)?;
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let mut f = Self::from_reader(path, BufReader::new(file))?;
        f.map = Some(map);
        Ok(f)
    }
}

impl<R: Read + Seek> GgufFile<R> {
    /// Parses the header from `reader` (`path` names it in errors): first a bounds-checked scan
    /// ([`super::gguf_scan::scan`]: sizes checked against the file's length, duplicate keys and
    /// version 1 refused), then candle's reader. Errors: [`Error::ModelFormat`].
    pub fn from_reader(path: &Path, mut reader: R) -> Result<Self> {
        let bad = |reason: String| Error::ModelFormat {
            path: path.to_path_buf(),
            reason,
        };
        super::gguf_scan::scan(&mut reader)
            .map_err(|e| bad(format!("not a readable GGUF file: {e}")))?;
        reader
            .seek(std::io::SeekFrom::Start(0))
            .map_err(|e| Error::io(path, e))?;
        let content = Content::read(&mut reader).map_err(|e| {
            bad(format!(
                "not a readable GGUF file ({})",
                crate::error::first_line(&e)
            ))
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            content,
            reader,
            map: None,
        })
    }

    fn bad(&self, reason: String) -> Error {
        Error::ModelFormat {
            path: self.path.clone(),
            reason,
        }
    }

    /// A metadata value. Errors: [`Error::ModelFormat`] naming the missing key.
    pub fn meta(&self, key: &str) -> Result<&Value> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| self.bad(format!("metadata key `{key}` is missing")))
    }

    fn meta_usize(&self, key: &str) -> Result<usize> {
        let v = self.meta(key)?;
        v.to_u32()
            .map(|x| x as usize)
            .or_else(|_| v.to_u64().map(|x| x as usize))
            .or_else(|_| v.to_i32().map(|x| x as usize))
            .map_err(|e| {
                self.bad(format!(
                    "metadata `{key}`: {}",
                    crate::error::first_line(&e)
                ))
            })
            .and_then(|x| match v.to_i32() {
                Ok(i) if i < 0 => Err(self.bad(format!("metadata `{key}` is negative ({i})"))),
                _ => Ok(x),
            })
    }

    fn meta_f32(&self, key: &str) -> Result<f32> {
        self.meta(key)?.to_f32().map_err(|e| {
            self.bad(format!(
                "metadata `{key}`: {}",
                crate::error::first_line(&e)
            ))
        })
    }

    fn meta_str(&self, key: &str) -> Result<&str> {
        self.meta(key)?
            .to_string()
            .map(String::as_str)
            .map_err(|e| {
                self.bad(format!(
                    "metadata `{key}`: {}",
                    crate::error::first_line(&e)
                ))
            })
    }

    fn meta_strings(&self, key: &str) -> Result<Vec<String>> {
        let vals = self.meta(key)?.to_vec().map_err(|e| {
            self.bad(format!(
                "metadata `{key}`: {}",
                crate::error::first_line(&e)
            ))
        })?;
        vals.iter()
            .map(|v| {
                v.to_string().cloned().map_err(|e| {
                    self.bad(format!(
                        "metadata `{key}`: {}",
                        crate::error::first_line(&e)
                    ))
                })
            })
            .collect()
    }

    /// Parameters stored in the file (sum of every tensor's element count).
    pub fn parameter_count(&self) -> u64 {
        self.content
            .tensor_infos
            .values()
            .map(|t| t.shape.elem_count() as u64)
            .sum()
    }

    /// Whether a tensor is present.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Stored format, dims (outermost first) and byte count of every tensor, in file order of
    /// names — what a memory plan needs before anything is read.
    pub fn tensor_infos(&self) -> Vec<(String, GgmlDType, Vec<usize>, u64)> {
        let mut v: Vec<_> = self
            .content
            .tensor_infos
            .iter()
            .map(|(n, t)| {
                let elems = t.shape.elem_count() as u64;
                let bytes =
                    elems / t.ggml_dtype.block_size() as u64 * t.ggml_dtype.type_size() as u64;
                (n.clone(), t.ggml_dtype, t.shape.dims().to_vec(), bytes)
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// One tensor as stored: its bytes in place in the mapped file when opened from a path
    /// (no copy), else read from the reader into memory. Errors: [`Error::ModelFormat`] when
    /// it is missing or runs past the end of the file.
    pub fn stored(&mut self, name: &str) -> Result<StoredTensor> {
        let Some(info) = self.content.tensor_infos.get(name) else {
            return Err(self.bad(format!("tensor `{name}` is missing")));
        };
        let (dtype, dims) = (info.ggml_dtype, info.shape.dims().to_vec());
        let Some(map) = &self.map else {
            let q = self.tensor(name)?;
            return Ok(StoredTensor {
                dtype,
                dims,
                bytes: q.data()?.into_owned().into(),
            });
        };
        let elems = info.shape.elem_count();
        let len = elems / dtype.block_size() * dtype.type_size();
        let start = self.content.tensor_data_offset as usize + info.offset as usize;
        let bytes = WeightBytes::mapped(map.clone(), start..start.saturating_add(len))
            .filter(|_| elems.is_multiple_of(dtype.block_size()))
            .ok_or_else(|| {
                self.bad(format!(
                    "tensor `{name}` ({len} bytes at offset {start}) runs past the end of the \
                     file ({} bytes); is the file truncated?",
                    map.len()
                ))
            })?;
        Ok(StoredTensor { dtype, dims, bytes })
    }

    /// Reads every page of the mapped file now (one sequential pass; see
    /// [`super::mapped::prefault`]); a no-op for a reader.
    pub fn prefault(&self) {
        if let Some(m) = &self.map {
            super::mapped::prefault(m);
        }
    }

    /// Reads one tensor into CPU memory. Errors: [`Error::ModelFormat`] when it is missing or the
    /// file ends early.
    pub fn tensor(&mut self, name: &str) -> Result<QTensor> {
        if !self.has_tensor(name) {
            return Err(self.bad(format!("tensor `{name}` is missing")));
        }
        self.content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(|e| Error::ModelFormat {
                path: self.path.clone(),
                reason: format!(
                    "tensor `{name}` could not be read ({}); is the file truncated?",
                    crate::error::first_line(&e)
                ),
            })
    }

    /// Hyper-parameters from `{arch}.*` metadata.
    pub fn config(&self) -> Result<ModelConfig> {
        let arch = self.meta_str("general.architecture")?.to_string();
        if !SUPPORTED_ARCHS.contains(&arch.as_str()) {
            return Err(Error::Unsupported(format!(
                "GGUF architecture `{arch}` in {} (supported: {})",
                self.path.display(),
                SUPPORTED_ARCHS.join(", ")
            )));
        }
        let k = |s: &str| format!("{arch}.{s}");
        let hidden = self.meta_usize(&k("embedding_length"))?;
        let q_heads = self.meta_usize(&k("attention.head_count"))?;
        let kv_heads = self
            .meta_usize(&k("attention.head_count_kv"))
            .unwrap_or(q_heads);
        let head_dim = self
            .meta_usize(&k("attention.key_length"))
            .unwrap_or(hidden / q_heads.max(1));
        let vocab = match self.meta_usize(&k("vocab_size")) {
            Ok(v) => v,
            Err(_) => self.meta_strings("tokenizer.ggml.tokens")?.len(),
        };
        let cfg = ModelConfig {
            layers: self.meta_usize(&k("block_count"))?,
            hidden,
            intermediate: self.meta_usize(&k("feed_forward_length"))?,
            q_heads,
            kv_heads,
            head_dim,
            vocab,
            rope_theta: self.meta_f32(&k("rope.freq_base")).unwrap_or(10_000.0),
            // llama.cpp's converter permutes Llama/Mistral Q and K rows for adjacent-pair RoPE;
            // Qwen2 keeps Hugging Face's layout and uses NeoX (half) RoPE.
            rope_style: if arch == "qwen2" {
                RopeStyle::Half
            } else {
                RopeStyle::Interleaved
            },
            rms_eps: self.meta_f32(&k("attention.layer_norm_rms_epsilon"))? as f64,
            max_ctx: self.meta_usize(&k("context_length"))?,
            layer_windows: Vec::new(),
            arch,
        };
        self.check_shapes(&cfg)?;
        Ok(cfg)
    }

    /// The file's path, as opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Dims of a tensor as stored, outermost first (`[out, in]` for a matrix), `None` when it
    /// is absent.
    pub fn tensor_dims(&self, name: &str) -> Option<Vec<usize>> {
        self.content
            .tensor_infos
            .get(name)
            .map(|t| t.shape.dims().to_vec())
    }

    /// Checks `cfg` and the shapes of the weights every GGUF decoder shares (llama.cpp names:
    /// `token_embd`, `output_norm`, `output`, per block `attn_norm`, `attn_{q,k,v,output}`,
    /// `ffn_norm`, `ffn_{gate,up,down}` and their biases) with
    /// [`super::shapes::check_shapes`]. Errors: [`Error::ModelFormat`] naming the first tensor
    /// that is missing or has another shape.
    pub fn check_shapes(&self, cfg: &ModelConfig) -> Result<()> {
        super::shapes::check_shapes(
            cfg,
            super::shapes::Naming::Gguf,
            |name| self.tensor_dims(name),
            self.content.tensor_infos.keys().map(String::as_str),
            &self.path,
        )
    }

    /// Builds the byte-level BPE tokenizer from `tokenizer.ggml.*` metadata.
    pub fn tokenizer(&self) -> Result<TextTokenizer> {
        let model = self.meta_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(Error::Unsupported(format!(
                "GGUF tokenizer model `{model}` in {}: kvbench builds gpt2-style byte-level BPE \
                 from GGUF; pass a safetensors folder with tokenizer.json instead",
                self.path.display()
            )));
        }
        let tokens = self.meta_strings("tokenizer.ggml.tokens")?;
        let merges = self.meta_strings("tokenizer.ggml.merges")?;
        let types: Vec<i32> = match self.content.metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(|e| self.bad(format!("token_type: {e}")))?
                .iter()
                .map(|t| t.to_i32().unwrap_or(1))
                .collect(),
            None => vec![1; tokens.len()],
        };
        let pre = self
            .meta_str("tokenizer.ggml.pre")
            .unwrap_or("default")
            .to_string();
        let bos = self
            .meta_usize("tokenizer.ggml.bos_token_id")
            .ok()
            .map(|x| x as u32);
        let eos = self
            .meta_usize("tokenizer.ggml.eos_token_id")
            .ok()
            .map(|x| x as u32);
        let add_bos = self
            .content
            .metadata
            .get("tokenizer.ggml.add_bos_token")
            .and_then(|v| v.to_bool().ok())
            .unwrap_or(false);
        let mut t =
            TextTokenizer::from_gguf_vocab(&tokens, &merges, &types, &pre, bos, eos, add_bos)?;
        t.chat_template = self
            .meta_str("tokenizer.chat_template")
            .ok()
            .map(str::to_string);
        Ok(t)
    }
}

/// Loads model and tokenizer from a GGUF file, linear layers in `dtype`, every weight on
/// `device`. The file is mapped ([`GgufFile::open`]); on the CPU, layers that compute in the
/// stored format and the token table read the file's pages in place (one copy however many
/// phases load it), others are converted layer by layer. Errors: [`GgufFile::open`]'s,
/// [`GgufFile::config`]'s, [`crate::Error::Candle`].
pub fn load(
    path: &Path,
    dtype: WeightDtype,
    device: &Device,
) -> Result<(Model, TextTokenizer, ModelSource)> {
    let f = GgufFile::open(path)?;
    f.prefault();
    load_from(f, dtype, device)
}

/// [`load`] from an opened file (mapped, or any reader: then every tensor is read into memory).
pub fn load_from<R: Read + Seek>(
    mut f: GgufFile<R>,
    dtype: WeightDtype,
    device: &Device,
) -> Result<(Model, TextTokenizer, ModelSource)> {
    let cfg = f.config()?;
    let tokenizer = f.tokenizer()?;
    let w = decoder_weights(&mut f, &cfg, dtype, device)?;
    let model = Model::new(cfg, dtype, w.embed, w.blocks, w.norm, w.lm_head)?;
    Ok((model, tokenizer, source(f.path())))
}

/// The weights every GGUF decoder kvbench runs holds (Llama, Mistral, Qwen2 and Gemma 3 alike),
/// as [`Model::new`] takes them.
pub(crate) struct DecoderWeights {
    /// The token table `[vocab, hidden]`: its stored rows on the CPU ([`Embedding::Rows`],
    /// looked up per token), dense f32 on another device.
    pub embed: Embedding,
    /// The decoder blocks, in order.
    pub blocks: Vec<Block>,
    /// `output_norm` `[hidden]` f32.
    pub norm: Tensor,
    /// The head `[vocab, hidden]`: `output` when the file has one, else the token table (tied).
    pub lm_head: Linear,
}

/// Reads the shared weights of a decoder of `cfg`'s shape (checked beforehand with
/// [`GgufFile::check_shapes`]) from `f`, linear layers in `dtype`, on `device`: each tensor
/// through [`GgufFile::stored`] (the mapped file's bytes in place when opened from a path), a
/// layer that computes in the stored format on the CPU keeping those bytes
/// ([`Linear::from_stored`]). Errors: [`GgufFile::stored`]'s, [`Error::Candle`],
/// [`Error::ModelFormat`] for norm weights that are not finite.
pub(crate) fn decoder_weights<R: Read + Seek>(
    f: &mut GgufFile<R>,
    cfg: &ModelConfig,
    dtype: WeightDtype,
    device: &Device,
) -> Result<DecoderWeights> {
    let dev = device;
    let path = f.path.clone();
    let norm = |f: &mut GgufFile<R>, name: &str| -> Result<Tensor> {
        let t = f.stored(name)?.dequantize(dev)?;
        // NaN or infinite norm weights make every logit NaN: refuse them here.
        super::shapes::check_finite(&t, name, &path)?;
        Ok(t)
    };
    let embed_s = f.stored("token_embd.weight")?;
    let embed = if dev.is_cpu() {
        Embedding::Rows(embed_s.clone())
    } else {
        Embedding::Dense(embed_s.dequantize(dev)?)
    };
    let mut blocks = Vec::with_capacity(cfg.layers);
    for i in 0..cfg.layers {
        let lin = |f: &mut GgufFile<R>, name: &str| -> Result<Linear> {
            let w = f.stored(&format!("blk.{i}.{name}.weight"))?;
            let bias_name = format!("blk.{i}.{name}.bias");
            let b = if f.has_tensor(&bias_name) {
                Some(f.stored(&bias_name)?.dequantize(dev)?)
            } else {
                None
            };
            Linear::from_stored(&w, b, dtype, dev)
        };
        let (q, k, v, o) = (
            lin(f, "attn_q")?,
            lin(f, "attn_k")?,
            lin(f, "attn_v")?,
            lin(f, "attn_output")?,
        );
        let (gate, up, down) = (lin(f, "ffn_gate")?, lin(f, "ffn_up")?, lin(f, "ffn_down")?);
        blocks.push(Block {
            attn_norm: norm(f, &format!("blk.{i}.attn_norm.weight"))?,
            q,
            k,
            v,
            o,
            ffn_norm: norm(f, &format!("blk.{i}.ffn_norm.weight"))?,
            gate,
            up,
            down,
        });
    }
    let out_norm = norm(f, "output_norm.weight")?;
    // Tied embeddings (SmolLM2, Qwen2-0.5B, Gemma 3): no output.weight, the head reuses
    // token_embd.
    let head = if f.has_tensor("output.weight") {
        f.stored("output.weight")?
    } else {
        embed_s
    };
    let lm_head = Linear::from_stored(&head, None, dtype, dev)?;
    Ok(DecoderWeights {
        embed,
        blocks,
        norm: out_norm,
        lm_head,
    })
}

/// What `meta.json` records of a model read from the GGUF at `path`.
pub(crate) fn source(path: &Path) -> ModelSource {
    ModelSource {
        spec: path.display().to_string(),
        format: "gguf".into(),
        files: vec![path.to_path_buf()],
        repo: None,
    }
}
