//! The decoder and perplexity through the cache, against independent references.

mod common;

use candle_core::{IndexOp, Tensor};
use kvbench::kv::{KvCache, KvScheme, Quant};
use kvbench::quality::perplexity::{perplexity, PplMode, PplProtocol, Scoring};
use kvbench::quality::wikitext::wikitext2_test_text;

/// Prefill 32 tokens into an fp16 cache, then decode 16 one at a time: the logits of every
/// position equal those of one uncached forward over all 48 tokens (plain candle attention over
/// f32 K/V). Tolerance: 0.05 absolute on logits of magnitude ~10–30, the error f16 K/V storage
/// introduces (relative 2⁻¹¹ per element); the greedy token must agree at every position.
#[test]
fn fp16_cached_decode_matches_uncached_forward() {
    let m = &common::smollm_f32().model;
    let tokens = &common::smollm_f32()
        .tokenizer
        .encode(wikitext2_test_text())
        .unwrap()[..48];
    let full = m.forward(tokens, 1, None).unwrap().squeeze(0).unwrap();
    let mut cache = KvCache::new(KvScheme::FP16, m.config.cache_geometry(), 1).unwrap();
    let prefill = m
        .forward(&tokens[..32], 1, Some(&mut cache))
        .unwrap()
        .squeeze(0)
        .unwrap();
    let mut rows = vec![prefill];
    for t in 32..48 {
        rows.push(
            m.forward(&tokens[t..t + 1], 1, Some(&mut cache))
                .unwrap()
                .squeeze(0)
                .unwrap(),
        );
    }
    let cached = Tensor::cat(&rows, 0).unwrap();
    let diff = common::max_abs_diff(&full, &cached);
    assert!(diff < 0.05, "max |Δlogit| = {diff}");
    let a = full.argmax(1).unwrap().to_vec1::<u32>().unwrap();
    let b = cached.argmax(1).unwrap().to_vec1::<u32>().unwrap();
    assert_eq!(a, b);
    // The cache holds exactly 48 tokens: 2 (K, V) × 30 layers × 3 kv heads × 128 bytes each.
    assert_eq!(cache.kv_bytes(), 48 * 2 * 30 * 3 * 128);
}

/// Same check for the batch dimension: two different sequences decoded together give the
/// logits each gives alone.
#[test]
fn batched_decode_matches_single_sequences() {
    let m = &common::smollm_f32().model;
    let all = common::smollm_f32()
        .tokenizer
        .encode(wikitext2_test_text())
        .unwrap();
    let (a, b) = (&all[100..120], &all[5000..5020]);
    let both: Vec<u32> = a.iter().chain(b).copied().collect();
    let mut cache = KvCache::new(
        KvScheme::plain(Quant::Int8Token),
        m.config.cache_geometry(),
        2,
    )
    .unwrap();
    let batched = m.forward(&both, 2, Some(&mut cache)).unwrap();
    for (i, seq) in [a, b].iter().enumerate() {
        let mut c1 = KvCache::new(
            KvScheme::plain(Quant::Int8Token),
            m.config.cache_geometry(),
            1,
        )
        .unwrap();
        let single = m
            .forward(seq, 1, Some(&mut c1))
            .unwrap()
            .squeeze(0)
            .unwrap();
        let diff = common::max_abs_diff(&batched.i(i).unwrap(), &single);
        assert!(diff < 1e-3, "sequence {i}: max |Δlogit| = {diff}");
    }
}

/// llama.cpp's `llama-perplexity` protocol on the first 4 windows: 512 tokens, no BOS (the
/// model's setting), the last 255 targets of each window scored, one prefill per window.
fn llama_cpp_protocol() -> PplProtocol {
    PplProtocol {
        mode: PplMode::Chunked,
        batch: 4,
        ctx: 512,
        windows: Some(4),
        scoring: Scoring::Half,
        bos: false,
        exact_attention: true,
    }
}

/// FP16-cache perplexity on the first 4 windows of WikiText-2 (llama.cpp protocol: 512-token
/// windows, no BOS, last 255 targets) equals the exact float32 reference with f16 K/V, 22.7453,
/// to well under 0.1 % (we require 0.02 %).
#[test]
fn fp16_perplexity_matches_float32_reference() {
    let lm = common::smollm_f32();
    let tokens = lm.tokenizer.encode(wikitext2_test_text()).unwrap();
    assert!(!lm.tokenizer.add_bos);
    let proto = llama_cpp_protocol();
    let r = perplexity(
        &lm.model,
        &tokens,
        KvScheme::FP16,
        &proto,
        lm.tokenizer.bos,
        |_, _| {},
    )
    .unwrap();
    assert_eq!(r.scored_tokens, 4 * 255);
    let rel = (r.perplexity / 22.7453 - 1.0).abs();
    assert!(
        rel < 2e-4,
        "perplexity {} vs 22.7453 (rel {rel:.2e})",
        r.perplexity
    );
}

/// Quantized caches cost perplexity in the expected order and amount on the same 4 windows:
/// int8 per-token within 0.5 % of fp16 (llama.cpp's q8_0 costs 0.1 %), int4 group-32 between
/// 1 % and 15 % (llama.cpp's symmetric q4_0 without rotation costs 18 %).
#[test]
fn quantized_caches_cost_perplexity_in_order() {
    let lm = common::smollm_f32();
    let tokens = lm.tokenizer.encode(wikitext2_test_text()).unwrap();
    let proto = llama_cpp_protocol();
    let ppl = |s: KvScheme| {
        perplexity(&lm.model, &tokens, s, &proto, None, |_, _| {})
            .unwrap()
            .perplexity
    };
    let base = 22.7453;
    let int8 = ppl(KvScheme::plain(Quant::Int8Token)) / base - 1.0;
    let int4 = ppl(KvScheme::plain(Quant::Int4 { group: 32 })) / base - 1.0;
    assert!(int8.abs() < 0.005, "int8 Δ {int8}");
    assert!((0.01..0.15).contains(&int4), "int4 Δ {int4}");
}

/// ggml's storage of `elems` weights in `dtype`, bytes, from the GGUF spec's block layouts
/// (ggml-common.h): e.g. Q4_1 stores 32 weights in 20 bytes (f16 scale, f16 min, 16 bytes of
/// nibbles), Q8_0 in 34 (f16 scale, 32 int8).
fn ggml_bytes(dtype: candle_core::quantized::GgmlDType, elems: usize) -> usize {
    use candle_core::quantized::GgmlDType as G;
    let (block, bytes) = match dtype {
        G::F32 => (1, 4),
        G::F16 | G::BF16 => (1, 2),
        G::Q4_0 => (32, 18),
        G::Q4_1 => (32, 20),
        G::Q5_0 => (32, 22),
        G::Q5_1 => (32, 24),
        G::Q8_0 => (32, 34),
        G::Q2K => (256, 84),
        G::Q3K => (256, 110),
        G::Q4K => (256, 144),
        G::Q5K => (256, 176),
        G::Q6K => (256, 210),
        other => panic!("no block size for {other:?} in this test"),
    };
    assert_eq!(elems % block, 0, "{dtype:?}: {elems} weights");
    elems / block * bytes
}

/// `weight_bytes` against the GGUF header read independently: every tensor's size from its
/// dtype's block layout (checked against the file's own length), then what the loader holds of
/// it — quantized tensors as stored with `native` weights, dense ones at 4 bytes per weight,
/// the embedding table as stored (rows dequantized per lookup; the tied output head counts it
/// once more) — and which of those bytes are the mapped file's pages: with `native` weights
/// every block-quantized matrix and the table (Q4_1 and Q8_0 run in place), with `f32` only
/// the table.
#[test]
fn weight_bytes_match_the_gguf_header() {
    use candle_core::quantized::GgmlDType;
    use kvbench::model::{self, WeightDtype};
    let path = model::fetch::ensure_default_model().unwrap();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let infos = &content.tensor_infos;
    // The sizes account for the whole file: the last tensor ends at its end (up to the
    // 32-byte alignment GGUF pads to).
    let end = infos
        .values()
        .map(|t| t.offset as usize + ggml_bytes(t.ggml_dtype, t.shape.elem_count()))
        .max()
        .unwrap();
    let file_len = std::fs::metadata(&path).unwrap().len() as usize;
    let data_len = file_len - content.tensor_data_offset as usize;
    assert!(
        end <= data_len && data_len - end < 32,
        "{end} vs {data_len}"
    );

    let dense = |t: GgmlDType| matches!(t, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
    let stored = |t: &candle_core::quantized::gguf_file::TensorInfo| {
        ggml_bytes(t.ggml_dtype, t.shape.elem_count())
    };
    let held = |t: &candle_core::quantized::gguf_file::TensorInfo| {
        if dense(t.ggml_dtype) {
            t.shape.elem_count() * 4
        } else {
            stored(t)
        }
    };
    let embed = &infos["token_embd.weight"];
    let tied = !infos.contains_key("output.weight");
    let others = || infos.iter().filter(|(n, _)| *n != "token_embd.weight");
    let native: usize = others().map(|(_, t)| held(t)).sum::<usize>()
        + stored(embed)
        + if tied { held(embed) } else { 0 };
    let f32_all: usize = others()
        .map(|(_, t)| t.shape.elem_count() * 4)
        .sum::<usize>()
        + stored(embed)
        + if tied {
            embed.shape.elem_count() * 4
        } else {
            0
        };
    let mapped_native: usize = others()
        .filter(|(_, t)| !dense(t.ggml_dtype))
        .map(|(_, t)| stored(t))
        .sum::<usize>()
        + stored(embed)
        + if tied { stored(embed) } else { 0 };

    let m = model::load(path.to_str().unwrap(), WeightDtype::Native).unwrap();
    assert_eq!(m.model.weight_bytes(), native, "native");
    assert_eq!(
        m.model.mapped_weight_bytes(),
        mapped_native,
        "native, mapped"
    );
    let f = &common::smollm_f32().model;
    assert_eq!(f.weight_bytes(), f32_all, "f32");
    assert_eq!(
        f.mapped_weight_bytes(),
        stored(embed),
        "f32, mapped: the table only"
    );
    // SmolLM2-135M: 134.5 M parameters, about 540 MB in f32 (plus the 113 MB tied head).
    assert!((400_000_000..700_000_000).contains(&f32_all), "{f32_all}");
}

/// Mapped loading (tensors read in place from the file's pages) gives the same model as
/// reading every tensor into memory through a reader, in every weight dtype: bit-identical
/// logits for 24 WikiText tokens, uncached.
#[test]
fn mapped_load_equals_read_load() {
    use kvbench::model::gguf::load_from;
    use kvbench::model::{self, WeightDtype};
    let path = model::fetch::ensure_default_model().unwrap();
    let tokens = &common::smollm_f32()
        .tokenizer
        .encode(wikitext2_test_text())
        .unwrap()[..24];
    for dtype in [WeightDtype::F32, WeightDtype::Q8_0, WeightDtype::Native] {
        let mapped = model::load(path.to_str().unwrap(), dtype).unwrap().model;
        let read = common::gguf_read_copy(&path);
        let (copied, _, _) = load_from(read, dtype, &candle_core::Device::Cpu).unwrap();
        assert_eq!(
            copied.mapped_weight_bytes(),
            0,
            "{dtype}: the reader copies"
        );
        let a = mapped.forward(tokens, 1, None).unwrap();
        let b = copied.forward(tokens, 1, None).unwrap();
        assert_eq!(common::max_abs_diff(&a, &b), 0.0, "{dtype}");
    }
}

/// On a GPU (cuda build), the decoder gives the CPU's logits (uncached reference attention,
/// f32 weights) and holds the same weight bytes in every weight dtype.
#[cfg(feature = "cuda")]
#[test]
fn cuda_decoder_matches_cpu() {
    use candle_core::Device;
    use kvbench::model::{self, DeviceSpec, WeightDtype};
    let dev = DeviceSpec::Cuda(0)
        .open()
        .expect("this test needs a CUDA GPU");
    let path = model::fetch::ensure_default_model().unwrap();
    let path = path.to_str().unwrap();
    let cpu = common::smollm_f32();
    let tokens = &cpu.tokenizer.encode(wikitext2_test_text()).unwrap()[..48];
    let gpu = model::load_on(path, WeightDtype::F32, &dev).unwrap();
    assert!(gpu.model.device().is_cuda());
    let a = cpu.model.forward(tokens, 1, None).unwrap();
    let b = gpu
        .model
        .forward(tokens, 1, None)
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap();
    let diff = common::max_abs_diff(&a, &b);
    assert!(diff < 1e-2, "max |Δlogit| CPU vs CUDA = {diff}");
    // The token table: on the CPU its stored rows (looked up per token), on the GPU dense f32
    // (an index_select on the device); every other weight the same bytes.
    let infos = model::gguf::GgufFile::open(std::path::Path::new(path))
        .unwrap()
        .tensor_infos();
    let table = infos.iter().find(|t| t.0 == "token_embd.weight").unwrap();
    let table_f32 = table.2.iter().product::<usize>() * 4;
    let gpu_extra = table_f32 - table.3 as usize;
    assert_eq!(
        gpu.model.weight_bytes(),
        cpu.model.weight_bytes() + gpu_extra
    );
    for dtype in [WeightDtype::Q8_0, WeightDtype::Native] {
        let g = model::load_on(path, dtype, &dev).unwrap();
        let c = model::load(path, dtype).unwrap();
        assert_eq!(
            g.model.weight_bytes(),
            c.model.weight_bytes() + gpu_extra,
            "{dtype}"
        );
        let logits = g.model.forward(tokens, 1, None).unwrap();
        let max = logits
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(max.is_finite(), "{dtype}: logits {max}");
    }
}
