//! The decode step's linear layers at SmolLM2-135M's shapes: kvbench's own kernel
//! (`model::qmatmul`) against candle's `QMatMul`, for Q8_0 and Q4_1 weights and 1, 4 and 8
//! sequences, interleaved (each round times every variant once, in a rotating order) so a
//! drifting machine affects all of them alike.
//!
//! `cargo bench --bench decode_matmul` prints, per variant, the median time of one decode
//! step's worth of matmuls (30 layers × q, k, v, o, gate, up, down + the 49152-row head), the
//! weight bytes read and the implied GB/s, and each kernel's speed-up over candle. Q8_0 runs
//! kvbench's kernel twice where the AVX-512 kernels are built: on the interleaved layout weights
//! converted at load get (`kvbench`) and on ggml's blocks, as a file's own (`kvb-ggml`). `FORMAT=q8_0`
//! (or `q4_1`) times one format only, `ROUNDS=n` sets the rounds (15). Random
//! weights: the timing does not depend on their values. Every layer has weights of its own
//! (30 copies of each shape, 143 MB of Q8_0 per step, as the model streams them from memory):
//! until 2026-12-06 each shape was one matrix used 30–60 times per step, which held the
//! smaller ones in cache and printed Q8_0 at batch 1 at 36 GB/s, above what the model's
//! decode step reaches.

use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use kvbench::model::qmatmul::{BlockFormat, QMatrix};

/// (out, in, count per step) of SmolLM2-135M's linear layers.
const SHAPES: &[(usize, usize, usize)] = &[
    (576, 576, 60),  // q, o
    (192, 576, 60),  // k, v
    (1536, 576, 60), // gate, up
    (576, 1536, 30), // down
    (49152, 576, 1), // tied output head
];

/// One shape's `count` matrices per step, each with weights of its own.
struct Layer {
    candle: Vec<QMatMul>,
    ours: Vec<QMatrix>,
    /// `ours` on ggml's blocks (Q8_0 only: the other formats have one layout).
    ggml: Vec<QMatrix>,
    cols: usize,
    bytes: usize,
}

fn layers(dtype: GgmlDType) -> Vec<Layer> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, &(rows, cols, count))| {
            let w = Tensor::randn(0f32, 0.02, (rows, cols), &Device::Cpu)
                .unwrap()
                .affine(1.0, i as f64 * 1e-3)
                .unwrap();
            let q = QTensor::quantize(&w, dtype).unwrap();
            let blocks = q.data().unwrap().into_owned();
            let format = BlockFormat::of(dtype).unwrap();
            let ours: Vec<QMatrix> = (0..count)
                .map(|_| QMatrix::relaid(format, rows, cols, blocks.clone()).unwrap())
                .collect();
            // Only where the re-laid kernel exists is there a second layout to time.
            let ggml: Vec<QMatrix> = if ours[0].is_interleaved() {
                (0..count)
                    .map(|_| QMatrix::new(format, rows, cols, blocks.clone()).unwrap())
                    .collect()
            } else {
                Vec::new()
            };
            let candle = (0..count)
                .map(|_| {
                    let q = QTensor::quantize(&w, dtype).unwrap();
                    QMatMul::from_qtensor(q).unwrap()
                })
                .collect();
            Layer {
                bytes: ours[0].bytes(),
                candle,
                ours,
                ggml,
                cols,
            }
        })
        .collect()
}

/// Which kernel a variant times.
#[derive(Clone, Copy, PartialEq)]
enum Kernel {
    Candle,
    Ours,
    OursGgml,
}

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::Candle => "candle",
            Kernel::Ours => "kvbench",
            Kernel::OursGgml => "kvb-ggml",
        }
    }
}

/// One decode step's matmuls for `m` sequences, ms.
fn step(layers: &[Layer], m: usize, kernel: Kernel) -> f64 {
    let t = Instant::now();
    for l in layers {
        let x: Vec<f32> = (0..m * l.cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let xt = Tensor::from_vec(x.clone(), (m, l.cols), &Device::Cpu).unwrap();
        let ours = match kernel {
            Kernel::Candle => {
                for w in &l.candle {
                    std::hint::black_box(w.forward(&xt).unwrap());
                }
                continue;
            }
            Kernel::Ours => &l.ours,
            Kernel::OursGgml => &l.ggml,
        };
        for w in ours {
            let mut out = vec![0f32; m * w.rows()];
            w.matmul(&x, &mut out);
            std::hint::black_box(&out);
        }
    }
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let only = std::env::var("FORMAT").ok();
    let formats = [("q8_0", GgmlDType::Q8_0), ("q4_1", GgmlDType::Q4_1)];
    let sets: Vec<(&str, Vec<Layer>)> = formats
        .iter()
        .filter(|(n, _)| only.as_deref().is_none_or(|o| o == *n))
        .map(|&(n, d)| (n, layers(d)))
        .collect();
    let mut variants = Vec::new();
    for (fi, (name, ls)) in sets.iter().enumerate() {
        let bytes: usize = ls.iter().map(|l| l.bytes * l.ours.len()).sum();
        let ggml = !ls[0].ggml.is_empty();
        for m in [1usize, 4, 8] {
            for kernel in [Kernel::Candle, Kernel::Ours, Kernel::OursGgml] {
                if kernel != Kernel::OursGgml || ggml {
                    variants.push((fi, *name, m, kernel, bytes, Vec::new()));
                }
            }
        }
    }
    for v in variants.iter() {
        step(&sets[v.0].1, v.2, v.3); // warm-up: pages, repacking, thread start
    }
    for r in 0..rounds {
        let n = variants.len();
        for k in 0..n {
            let v = &mut variants[(k + r) % n];
            let ms = step(&sets[v.0].1, v.2, v.3);
            v.5.push(ms);
        }
    }
    println!(
        "decode-step matmuls at SmolLM2-135M shapes, {} threads, median of {rounds} interleaved rounds",
        candle_core::utils::get_num_threads()
    );
    println!(
        "{:<6} {:>3} {:<8} {:>9} {:>8} {:>9}",
        "format", "m", "kernel", "ms/step", "GB/s", "vs candle"
    );
    let median = |xs: &mut Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    let mut last_candle = 0.0;
    for (_, name, m, kernel, bytes, times) in variants.iter_mut() {
        let ms = median(times);
        if *kernel == Kernel::Candle {
            last_candle = ms;
        }
        println!(
            "{:<6} {:>3} {:<8} {:>9.2} {:>8.1} {:>9}",
            name,
            m,
            kernel.name(),
            ms,
            *bytes as f64 / (ms * 1e-3) / 1e9,
            if *kernel == Kernel::Candle {
                "-".into()
            } else {
                format!("{:.2}×", last_candle / ms)
            }
        );
    }
}
