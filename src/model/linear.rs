//! The decoder's weights as they are held: [`WeightDtype`] (the dtype a phase computes in),
//! [`StoredTensor`] (a tensor's bytes as the file stores them, mapped or owned), [`Linear`]
//! (`y = x Wᵀ + b` in one representation per layer) and [`Embedding`] (the token table, dense
//! or looked up row by row from the stored blocks).
//!
//! One copy per weight: a layer the CPU kernel ([`super::qmatmul`]) runs in the file's format
//! reads the file's mapped pages ([`super::mapped`]); a layer converted to another format holds
//! only the converted bytes; on a GPU, f16/bf16 weights stay f16/bf16 with `native` (vLLM's
//! `--dtype auto`: the checkpoint's own precision), quantized blocks stay quantized where
//! candle's CUDA `QMatMul` runs them.

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::mapped::WeightBytes;
use super::qmatmul;
use crate::error::{Error, Result};

/// The dtype the linear layers compute in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightDtype {
    /// Weights dequantized to f32 at load: exact arithmetic, for quality numbers.
    F32,
    /// Weights (re)quantized to ggml Q8_0 (blocks of 32, f16 scale), which kvbench's kernel
    /// runs with AVX2 dot products: the fast path for timing sweeps. A Q8_0 file is read in place.
    Q8_0,
    /// Whatever the file stores (e.g. Q4_1 in the default GGUF), read in place where kvbench's
    /// kernel runs the format; f16/bf16 stay f16/bf16 on a GPU (f32 on the CPU).
    Native,
}

impl std::fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WeightDtype::F32 => "f32",
            WeightDtype::Q8_0 => "q8_0",
            WeightDtype::Native => "native",
        })
    }
}

impl FromStr for WeightDtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(WeightDtype::F32),
            "q8_0" | "q8" => Ok(WeightDtype::Q8_0),
            "native" => Ok(WeightDtype::Native),
            _ => Err(Error::InvalidArgument {
                name: "weight dtype".into(),
                reason: format!("`{s}` is not one of f32, q8_0, native"),
            }),
        }
    }
}

impl WeightDtype {
    /// Whether a weight stored as `stored` is used as it is (no bytes of its own) on the CPU
    /// in this dtype: the file's own block format where kvbench's kernel runs it.
    pub fn keeps_stored(self, stored: GgmlDType) -> bool {
        let kernel = qmatmul::BlockFormat::of(stored).is_some();
        match self {
            WeightDtype::F32 => false,
            WeightDtype::Q8_0 => stored == GgmlDType::Q8_0,
            WeightDtype::Native => kernel,
        }
    }

    /// Bytes a stored weight of `elems` elements takes in this dtype when it is converted
    /// (see [`Self::keeps_stored`]; 0 when it is used in place): f32 4 per element, Q8_0 34
    /// per 32, native the stored bytes (`stored_bytes`; f16/bf16 widened to f32 on the CPU).
    pub fn converted_bytes(self, stored: GgmlDType, elems: u64, stored_bytes: u64) -> u64 {
        if self.keeps_stored(stored) {
            return 0;
        }
        match (self, stored) {
            (WeightDtype::F32, _) => elems * 4,
            (_, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) => elems * 4,
            (WeightDtype::Q8_0, _) => elems / 32 * 34,
            (WeightDtype::Native, _) => stored_bytes,
        }
    }
}

/// One tensor's bytes as the file stores them: ggml dtype, dims (`[rows, cols]` for a matrix,
/// outermost first) and the bytes, mapped from the file or owned.
#[derive(Debug, Clone)]
pub struct StoredTensor {
    /// The stored format.
    pub dtype: GgmlDType,
    /// Dimensions, outermost first (`[out, in]` for a linear layer, `[vocab, hidden]` for the
    /// token table).
    pub dims: Vec<usize>,
    /// The bytes: `elem_count / block_size × type_size`.
    pub bytes: WeightBytes,
}

impl StoredTensor {
    /// A CPU `QTensor` holding a copy of the bytes (for candle's conversions). Errors:
    /// [`Error::Candle`] when the byte count does not fit the dims.
    pub fn to_qtensor(&self) -> Result<QTensor> {
        let storage =
            QStorage::from_data(Cow::Borrowed(&self.bytes[..]), &Device::Cpu, self.dtype)?;
        Ok(QTensor::new(storage, self.dims.as_slice())?)
    }

    /// Every element as f32 on `device`, shaped as stored.
    pub fn dequantize(&self, device: &Device) -> Result<Tensor> {
        Ok(self.to_qtensor()?.dequantize(device)?)
    }

    /// `(rows, cols)` of a matrix. Errors: [`Error::Unsupported`] for another rank.
    fn dims2(&self) -> Result<(usize, usize)> {
        match self.dims[..] {
            [r, c] => Ok((r, c)),
            _ => Err(Error::Unsupported(format!(
                "a weight matrix with dims {:?} (expected 2)",
                self.dims
            ))),
        }
    }
}

/// How a [`Linear`] holds its weight: exactly one representation.
#[derive(Debug, Clone)]
enum LinearWeight {
    /// Block-quantized on the CPU for kvbench's kernel ([`qmatmul`]): every forward on the CPU.
    Blocks(Arc<qmatmul::QMatrix>),
    /// candle's `QMatMul` (dense f32, or blocks on a GPU / in formats our kernel lacks).
    Candle(QMatMul),
    /// f16/bf16 on a GPU (`native` weights of an f16/bf16 checkpoint): `x` is cast to the
    /// weight's dtype for the product, the result back to f32.
    Half(Tensor),
}

/// A linear layer `y = x Wᵀ (+ b)`, `W: [out, in]`, in the chosen [`WeightDtype`].
#[derive(Debug, Clone)]
pub struct Linear {
    w: LinearWeight,
    b: Option<Tensor>,
}

impl Linear {
    /// Builds the layer on `device` from a stored tensor `[out, in]` (on any device, normally
    /// the CPU, as read from the file), converting it to `dtype`; `b` must already be on
    /// `device`. Dequantizing and requantizing run on the CPU, so the weights are the same on
    /// every device; quantized blocks are then copied to `device` as they are (candle's CUDA
    /// QMatMul runs Q4_0/Q4_1/Q5_x/Q8_0 and the k-quants). Errors: [`Error::Candle`].
    pub fn new(w: QTensor, b: Option<Tensor>, dtype: WeightDtype, device: &Device) -> Result<Self> {
        // Whether kvbench requantizes the blocks here (they get the re-laid Q8_0 kernel; a
        // file's own blocks keep ggml's layout, mapped or read: see `QMatrix::relaid`).
        let converted = dtype == WeightDtype::Q8_0 && w.dtype() != GgmlDType::Q8_0;
        let w = match (dtype, w.dtype()) {
            (WeightDtype::Native, GgmlDType::F16 | GgmlDType::BF16) if !device.is_cpu() => {
                let half = if w.dtype() == GgmlDType::F16 {
                    DType::F16
                } else {
                    DType::BF16
                };
                // f16/bf16 → f32 → f16/bf16 is exact.
                let t = w.dequantize(&Device::Cpu)?.to_dtype(half)?;
                return Ok(Self {
                    w: LinearWeight::Half(t.to_device(device)?),
                    b,
                });
            }
            (WeightDtype::F32, _) | (_, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) => {
                QMatMul::Tensor(w.dequantize(device)?)
            }
            (WeightDtype::Q8_0, GgmlDType::Q8_0) | (WeightDtype::Native, _) => {
                QMatMul::QTensor(Arc::new(qtensor_to_device(w, device)?))
            }
            (WeightDtype::Q8_0, _) => {
                let t = w.dequantize(&Device::Cpu)?;
                QMatMul::QTensor(Arc::new(QTensor::quantize_onto(
                    &t,
                    GgmlDType::Q8_0,
                    device,
                )?))
            }
        };
        Self::with_kernel(w, b, converted)
    }

    /// Builds the layer from a stored tensor without copying it when `dtype` computes in the
    /// stored format on the CPU ([`WeightDtype::keeps_stored`]: the mapped bytes are the
    /// weight); otherwise as [`Self::new`]. Errors: [`Self::new`]'s, [`Error::Unsupported`] for
    /// a tensor that is not a matrix.
    pub fn from_stored(
        w: &StoredTensor,
        b: Option<Tensor>,
        dtype: WeightDtype,
        device: &Device,
    ) -> Result<Self> {
        let (rows, cols) = w.dims2()?;
        if device.is_cpu() && dtype.keeps_stored(w.dtype) {
            if let Some(q) = qmatmul::BlockFormat::of(w.dtype)
                .and_then(|f| qmatmul::QMatrix::new(f, rows, cols, w.bytes.clone()))
            {
                return Ok(Self {
                    w: LinearWeight::Blocks(Arc::new(q)),
                    b,
                });
            }
        }
        Self::new(w.to_qtensor()?, b, dtype, device)
    }

    /// Moves block-quantized weights on the CPU into kvbench's kernel ([`qmatmul`]), dropping
    /// candle's copy: one copy per layer; blocks kvbench `converted` (requantized at load) are
    /// re-laid for it ([`qmatmul::QMatrix::relaid`]).
    fn with_kernel(w: QMatMul, b: Option<Tensor>, converted: bool) -> Result<Self> {
        if let QMatMul::QTensor(q) = &w {
            if q.device().is_cpu() {
                if let (Some(format), Ok((rows, cols))) =
                    (qmatmul::BlockFormat::of(q.dtype()), q.shape().dims2())
                {
                    let data = q.data()?.into_owned();
                    let m = if converted {
                        qmatmul::QMatrix::relaid(format, rows, cols, data)
                    } else {
                        qmatmul::QMatrix::new(format, rows, cols, data)
                    };
                    if let Some(m) = m {
                        return Ok(Self {
                            w: LinearWeight::Blocks(Arc::new(m)),
                            b,
                        });
                    }
                }
            }
        }
        Ok(Self {
            w: LinearWeight::Candle(w),
            b,
        })
    }

    /// Builds the layer on `device` from a dense `[out, in]` tensor (safetensors), converting
    /// to `dtype`: `Native` keeps f16/bf16 on a GPU and f32 on the CPU (candle's CPU backend has
    /// no fast bf16/f16 matmul); `b` must already be on `device`. Q8_0 is quantized on the
    /// CPU, then copied. Errors: [`Error::Candle`].
    pub fn from_dense(
        w: Tensor,
        b: Option<Tensor>,
        dtype: WeightDtype,
        device: &Device,
    ) -> Result<Self> {
        if dtype == WeightDtype::Native
            && !device.is_cpu()
            && matches!(w.dtype(), DType::F16 | DType::BF16)
        {
            return Ok(Self {
                w: LinearWeight::Half(w.to_device(device)?),
                b,
            });
        }
        let w = w.to_dtype(DType::F32)?;
        let w = match dtype {
            WeightDtype::F32 | WeightDtype::Native => QMatMul::Tensor(w.to_device(device)?),
            WeightDtype::Q8_0 => QMatMul::QTensor(Arc::new(QTensor::quantize_onto(
                &w.to_device(&Device::Cpu)?,
                GgmlDType::Q8_0,
                device,
            )?)),
        };
        // Quantized here from dense weights: re-laid where kvbench's kernel runs them.
        Self::with_kernel(w, b, true)
    }

    /// Bytes of this layer's weight and bias as held (see [`super::Model::weight_bytes`]).
    pub(crate) fn weight_bytes(&self, seen: &mut Vec<candle_core::TensorId>) -> usize {
        let w = match &self.w {
            LinearWeight::Blocks(q) => q.bytes(),
            LinearWeight::Candle(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            LinearWeight::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t))
            | LinearWeight::Half(t) => tensor_bytes(t, seen),
        };
        w + self.b.as_ref().map_or(0, |b| tensor_bytes(b, seen))
    }

    /// Bytes of this layer's weight that are a mapped file's pages (0 for converted layers).
    pub(crate) fn mapped_bytes(&self) -> usize {
        match &self.w {
            LinearWeight::Blocks(q) if q.is_mapped() => q.bytes(),
            _ => 0,
        }
    }

    /// `x: [..., in]` f32 → `[..., out]` f32. Block-quantized weights on the CPU run kvbench's
    /// own kernel ([`qmatmul`]: each weight block read once for every row of `x`), f16/bf16 on a
    /// GPU a product in that dtype, everything else candle's `QMatMul`. Errors:
    /// [`Error::Candle`] (shape mismatch, device errors).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.w {
            LinearWeight::Blocks(q) => {
                let mut dims = x.dims().to_vec();
                if dims.last() != Some(&q.cols()) {
                    return Err(Error::Candle(candle_core::Error::ShapeMismatchBinaryOp {
                        lhs: x.shape().clone(),
                        rhs: (q.rows(), q.cols()).into(),
                        op: "linear",
                    }));
                }
                let xs = x.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                let m = xs.len() / q.cols();
                let mut out = vec![0f32; m * q.rows()];
                q.matmul(&xs, &mut out);
                *dims.last_mut().expect("at least one dim") = q.rows();
                Tensor::from_vec(out, dims, x.device())?
            }
            LinearWeight::Candle(w) => w.forward(x)?,
            LinearWeight::Half(w) => x
                .to_dtype(w.dtype())?
                .broadcast_matmul(&w.t()?)?
                .to_dtype(DType::F32)?,
        };
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// The token embedding table `[vocab, hidden]`.
#[derive(Debug, Clone)]
pub enum Embedding {
    /// Dense f32 on the model's device.
    Dense(Tensor),
    /// The stored rows (any ggml format, usually mapped), dequantized per looked-up token on
    /// the CPU — as llama.cpp's `ggml_get_rows` on a quantized table: the table is never
    /// widened whole (Llama-3-8B's would take 2.1 GB as f32 against 0.56 GB as Q8_0).
    Rows(StoredTensor),
}

impl From<Tensor> for Embedding {
    fn from(t: Tensor) -> Self {
        Embedding::Dense(t)
    }
}

impl Embedding {
    /// The device the looked-up rows come back on.
    pub fn device(&self) -> Device {
        match self {
            Embedding::Dense(t) => t.device().clone(),
            Embedding::Rows(_) => Device::Cpu,
        }
    }

    /// Rows `ids` as `[ids.len(), hidden]` f32. Errors: [`Error::InvalidArgument`] for an id
    /// past the vocabulary, [`Error::Candle`].
    pub fn lookup(&self, ids: &[u32]) -> Result<Tensor> {
        match self {
            Embedding::Dense(t) => {
                let idx = Tensor::from_slice(ids, ids.len(), t.device())?;
                Ok(t.index_select(&idx, 0)?)
            }
            Embedding::Rows(s) => {
                let (vocab, hidden) = s.dims2()?;
                let row = s.bytes.len() / vocab.max(1);
                let mut bytes = Vec::with_capacity(row * ids.len());
                for &id in ids {
                    let i = id as usize;
                    if i >= vocab {
                        return Err(Error::InvalidArgument {
                            name: "token id".into(),
                            reason: format!("{id} is past the vocabulary ({vocab} tokens)"),
                        });
                    }
                    bytes.extend_from_slice(&s.bytes[i * row..(i + 1) * row]);
                }
                StoredTensor {
                    dtype: s.dtype,
                    dims: vec![ids.len(), hidden],
                    bytes: WeightBytes::owned(bytes),
                }
                .dequantize(&Device::Cpu)
            }
        }
    }

    /// Bytes held (`seen` as in [`tensor_bytes`]).
    pub(crate) fn weight_bytes(&self, seen: &mut Vec<candle_core::TensorId>) -> usize {
        match self {
            Embedding::Dense(t) => tensor_bytes(t, seen),
            Embedding::Rows(s) => s.bytes.len(),
        }
    }

    /// Bytes that are a mapped file's pages.
    pub(crate) fn mapped_bytes(&self) -> usize {
        match self {
            Embedding::Rows(s) if s.bytes.is_mapped() => s.bytes.len(),
            _ => 0,
        }
    }
}

/// `q` with its blocks on `device` (a no-op on the CPU).
fn qtensor_to_device(q: QTensor, device: &Device) -> Result<QTensor> {
    if q.device().same_device(device) {
        return Ok(q);
    }
    let storage = QStorage::from_data(q.data()?, device, q.dtype())?;
    Ok(QTensor::new(storage, q.shape().clone())?)
}

/// Bytes of a dense tensor's elements (`elem_count × dtype size`), 0 when a tensor with the same
/// id (a clone sharing its storage, e.g. tied embeddings) was counted already.
pub(crate) fn tensor_bytes(t: &Tensor, seen: &mut Vec<candle_core::TensorId>) -> usize {
    if seen.contains(&t.id()) {
        return 0;
    }
    seen.push(t.id());
    t.elem_count() * t.dtype().size_in_bytes()
}
