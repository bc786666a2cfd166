//! CUDA kernels against their CPU references (feature `cuda`; needs a GPU to run, CI only
//! builds it). Every kernel in kernels/kv_cache.cu is checked against the CPU path of the same
//! scheme on random inputs of several shapes:
//! - append (quantize on write): the rows the GPU stores are byte-for-byte the rows the CPU
//!   encoders of src/kv/format.rs write for the same input;
//! - decode attention (split-sequence, fused dequantize), KIVI's per-channel keys, H2O scores
//!   and both evictions: outputs match the CPU cache within 2e-3 of the output's scale, every
//!   output element is written (outputs are NaN-filled first), the positions left after
//!   eviction and the bytes held are the CPU cache's.
//!
//! Without a GPU each test prints SKIPPED and passes, unless KVBENCH_REQUIRE_GPU=1
//! (scripts/device-check.sh sets it), which turns a missing GPU into a failure.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{Device, Tensor};
use kvbench::kv::cuda::CudaKvCache;
use kvbench::kv::{CacheGeometry, KvCache, KvScheme, Quant};
use kvbench::measure::device::{device_mem_used, time_ms};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(
                std::env::var("KVBENCH_REQUIRE_GPU").as_deref() != Ok("1"),
                "KVBENCH_REQUIRE_GPU=1 but no CUDA device: {e}"
            );
            eprintln!("SKIPPED: no CUDA device ({e})");
            None
        }
    }
}

fn tensor(x: &[f32], shape: (usize, usize, usize, usize), dev: &Device) -> Tensor {
    Tensor::from_slice(x, shape, dev).unwrap()
}

/// Quantize on write: for every per-token format, head_dim 64 and 128, appends of 17, 1, 1
/// and 40 tokens, the stored rows equal the CPU encoder's bytes.
#[test]
fn append_writes_the_cpu_encoders_rows() {
    let Some(dev) = gpu() else { return };
    let schemes = [
        "fp16",
        "int8-token",
        "fp8",
        "fp8-e5m2",
        "int4",
        "int4:group=16",
        "q8_0",
        "q4_0",
        "nvfp4",
        "mxfp4",
    ];
    for d in [64, 128] {
        let geom = CacheGeometry {
            layers: 1,
            kv_heads: 3,
            q_heads: 3,
            head_dim: d,
            window: None,
        };
        for name in schemes {
            let scheme: KvScheme = name.parse().unwrap();
            let (batch, kvh) = (2, geom.kv_heads);
            let mut rng = StdRng::seed_from_u64(d as u64);
            let mut cache = CudaKvCache::new(scheme, geom, batch, 16, &dev).unwrap();
            // All rows each (b, h) received, in order.
            let mut sent: Vec<Vec<Vec<f32>>> = vec![Vec::new(); batch * kvh];
            for n in [17, 1, 1, 40] {
                let k = common::activations(&mut rng, batch * kvh * n * d, d);
                let v = common::activations(&mut rng, batch * kvh * n * d, d);
                let q = common::activations(&mut rng, batch * kvh * n * d, d);
                for bh in 0..batch * kvh {
                    for t in 0..n {
                        sent[bh].push(k[(bh * n + t) * d..][..d].to_vec());
                    }
                }
                let shape = (batch, kvh, n, d);
                cache
                    .append(0, &tensor(&k, shape, &dev), &tensor(&v, shape, &dev))
                    .unwrap();
                cache.attend(0, &tensor(&q, shape, &dev)).unwrap();
            }
            let mut mismatched = 0;
            for b in 0..batch {
                for h in 0..kvh {
                    let (rows, pos) = cache.download_rows(0, b, h, false).unwrap();
                    assert_eq!(rows.len(), 59, "{name} d={d}: rows held");
                    assert_eq!(pos, (0..59).collect::<Vec<_>>());
                    for (t, row) in rows.iter().enumerate() {
                        let want = common::cpu_row_bytes(scheme.k, &sent[b * kvh + h][t]);
                        if *row != want {
                            mismatched += 1;
                            if mismatched == 1 {
                                eprintln!(
                                    "{name} d={d} b={b} h={h} t={t}:\n gpu {row:?}\n cpu {want:?}"
                                );
                            }
                        }
                    }
                }
            }
            assert_eq!(
                mismatched, 0,
                "{name} d={d}: rows differing from the CPU encoder"
            );
            eprintln!("append {name:<14} d={d}: 354 rows identical to the CPU encoder");
        }
    }
}

/// Decode attention, KIVI keys, H2O and window eviction: the GPU cache against the CPU cache,
/// step by step (a 70-token prefill, then 30 decode steps), 2 layers, batch 2, GQA groups of 3
/// and 4, head_dim 64 and 128.
#[test]
fn attention_and_eviction_match_the_cpu_cache() {
    let Some(dev) = gpu() else { return };
    let schemes = [
        "fp16",
        "int8-token",
        "int8-channel:group=32,residual=32",
        "int8-channel",
        "fp8",
        "int4",
        "q8_0",
        "q4_0",
        "int8-token/int4",
        "h2o:budget=48,recent=16",
        "h2o",
        "window:size=40,sinks=4",
        "nvfp4",
        "mxfp4",
        "window:size=40,sinks=4@nvfp4/mxfp4",
    ];
    for (d, kvh, qh) in [(64, 3, 9), (128, 2, 8)] {
        let geom = CacheGeometry {
            layers: 2,
            kv_heads: kvh,
            q_heads: qh,
            head_dim: d,
            window: None,
        };
        for name in schemes {
            let scheme: KvScheme = name.parse().unwrap();
            let batch = 2;
            let mut rng = StdRng::seed_from_u64(7 + d as u64);
            let mut cpu = KvCache::new(scheme, geom, batch).unwrap();
            let mut gpu_cache = CudaKvCache::new(scheme, geom, batch, 32, &dev).unwrap();
            gpu_cache.poison_outputs(true);
            let mut worst = 0f32;
            for n in std::iter::once(70).chain(std::iter::repeat_n(1, 30)) {
                for layer in 0..geom.layers {
                    let k = common::activations(&mut rng, batch * kvh * n * d, d);
                    let v = common::activations(&mut rng, batch * kvh * n * d, d);
                    let q = common::activations(&mut rng, batch * qh * n * d, d);
                    cpu.append(layer, &k, &v, n);
                    let want = cpu.attend(layer, &q, n);
                    let kv_shape = (batch, kvh, n, d);
                    gpu_cache
                        .append(
                            layer,
                            &tensor(&k, kv_shape, &dev),
                            &tensor(&v, kv_shape, &dev),
                        )
                        .unwrap();
                    let got = gpu_cache
                        .attend(layer, &tensor(&q, (batch, qh, n, d), &dev))
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap();
                    assert!(
                        got.iter().all(|x| !x.is_nan()),
                        "{name} d={d}: an output element was never written"
                    );
                    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
                    let err = got
                        .iter()
                        .zip(&want)
                        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
                        / scale;
                    worst = worst.max(err);
                    assert!(
                        err < 2e-3,
                        "{name} d={d} n={n} layer {layer}: relative error {err}"
                    );
                }
            }
            for layer in 0..geom.layers {
                for b in 0..batch {
                    for h in 0..kvh {
                        if matches!(scheme.k, Quant::Channel { .. }) {
                            continue;
                        }
                        let (_, mut pos) = gpu_cache.download_rows(layer, b, h, false).unwrap();
                        pos.sort_unstable();
                        assert_eq!(
                            pos,
                            cpu.held_positions(layer, b, h),
                            "{name} d={d}: positions held after eviction, layer {layer} b={b} h={h}"
                        );
                    }
                }
            }
            assert_eq!(
                gpu_cache.kv_bytes(),
                cpu.kv_bytes(),
                "{name} d={d}: bytes held"
            );
            eprintln!("attention {name:<34} d={d}: max relative error {worst:.2e} over 31 steps");
        }
    }
}

/// `device_mem_used` sees a 256 MiB allocation and `time_ms` times a 1 GiB device copy
/// (bandwidth-bound: well above 0 ms and below a second on any data-centre GPU).
#[test]
fn vram_sampling_and_event_timing() {
    let Some(dev) = gpu() else { return };
    let before = device_mem_used(&dev).unwrap().unwrap();
    let t = Tensor::zeros((64, 1024, 1024), candle_core::DType::F32, &dev).unwrap();
    let after = device_mem_used(&dev).unwrap().unwrap();
    assert!(after >= before + (256 << 20), "{before} → {after} bytes");
    let big = Tensor::zeros((256, 1024, 1024), candle_core::DType::F32, &dev).unwrap();
    let (_, ms) = time_ms(&dev, || Ok(big.copy()?)).unwrap();
    assert!(ms > 0.0 && ms < 1000.0, "1 GiB copy took {ms} ms");
    eprintln!(
        "1 GiB device copy: {ms:.3} ms, {:.0} GB/s read+write",
        2.0 * (1u64 << 30) as f64 / (ms * 1e-3) / 1e9
    );
    drop(t);
}
