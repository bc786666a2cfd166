//! The safetensors and hf-hub cache paths load the same model as the GGUF path.
//!
//! The test converts the default GGUF into a Hugging Face checkpoint the way llama.cpp's
//! converter would in reverse: Q and K rows un-permuted back to Hugging Face's layout (which
//! uses half-split RoPE instead of adjacent pairs), tensors renamed, `config.json` and
//! `tokenizer.json` written. Both loaders must then give the same logits, which checks the tensor
//! mapping, the config reader and both RoPE layouts at once.

mod common;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use kvbench::model::gguf::GgufFile;
use kvbench::model::{self, hub, ModelLocation, WeightDtype};

/// Inverse of llama.cpp's `permute`: `[heads·hd, in]` GGUF rows → Hugging Face rows.
fn unpermute(w: &Tensor, heads: usize) -> Tensor {
    let (out, inp) = w.dims2().unwrap();
    let hd = out / heads;
    w.reshape((heads, hd / 2, 2, inp))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((out, inp))
        .unwrap()
}

fn write_checkpoint(gguf: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut f = GgufFile::open(gguf).unwrap();
    let cfg = f.config().unwrap();
    f.tokenizer()
        .unwrap()
        .save(&dir.join("tokenizer.json"))
        .unwrap();
    let dev = Device::Cpu;
    let mut t: HashMap<String, Tensor> = HashMap::new();
    let get = |f: &mut GgufFile, name: &str| f.tensor(name).unwrap().dequantize(&dev).unwrap();
    t.insert(
        "model.embed_tokens.weight".into(),
        get(&mut f, "token_embd.weight"),
    );
    t.insert(
        "model.norm.weight".into(),
        get(&mut f, "output_norm.weight"),
    );
    for i in 0..cfg.layers {
        let g = |n: &str| format!("blk.{i}.{n}.weight");
        let h = |n: &str| format!("model.layers.{i}.{n}.weight");
        let q = unpermute(&get(&mut f, &g("attn_q")), cfg.q_heads);
        let k = unpermute(&get(&mut f, &g("attn_k")), cfg.kv_heads);
        t.insert(h("self_attn.q_proj"), q);
        t.insert(h("self_attn.k_proj"), k);
        for (a, b) in [
            ("attn_v", "self_attn.v_proj"),
            ("attn_output", "self_attn.o_proj"),
            ("attn_norm", "input_layernorm"),
            ("ffn_norm", "post_attention_layernorm"),
            ("ffn_gate", "mlp.gate_proj"),
            ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"),
        ] {
            t.insert(h(b), get(&mut f, &g(a)));
        }
    }
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
    let config = serde_json::json!({
        "model_type": "llama",
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.intermediate,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.q_heads,
        "num_key_value_heads": cfg.kv_heads,
        "vocab_size": cfg.vocab,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_ctx,
        "tie_word_embeddings": true
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

#[test]
fn safetensors_folder_and_hub_cache_match_gguf() {
    let gguf = model::fetch::ensure_default_model().unwrap();
    let root = std::env::temp_dir().join(format!("kvbench-st-{}", std::process::id()));
    // A Hugging Face cache: hub/models--org--name/{refs/main, snapshots/<rev>/...}.
    let repo_dir = root.join("hub/models--test-org--smollm-converted");
    let snap = repo_dir.join("snapshots/0123456789abcdef");
    write_checkpoint(&gguf, &snap);
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    std::fs::write(repo_dir.join("refs/main"), "0123456789abcdef").unwrap();

    let a = model::load(gguf.to_str().unwrap(), WeightDtype::F32).unwrap();
    let b = model::load(snap.to_str().unwrap(), WeightDtype::F32).unwrap();
    assert_eq!(a.model.config.layers, b.model.config.layers);
    let text = "The tower is 324 metres tall, about the same height as an 81-storey building.";
    let ids = a.tokenizer.encode(text).unwrap();
    assert_eq!(ids, b.tokenizer.encode(text).unwrap());
    let la = a.model.forward(&ids, 1, None).unwrap();
    let lb = b.model.forward(&ids, 1, None).unwrap();
    let diff = common::max_abs_diff(&la, &lb);
    assert!(diff < 1e-3, "max |Δlogit| GGUF vs safetensors = {diff}");

    // The same checkpoint through hf-hub's cache, offline.
    std::env::set_var("HF_HOME", &root);
    std::env::set_var("HF_HUB_OFFLINE", "1");
    match hub::resolve("test-org/smollm-converted").unwrap() {
        ModelLocation::Safetensors { repo, weights, .. } => {
            assert_eq!(repo.as_deref(), Some("test-org/smollm-converted"));
            assert_eq!(weights, vec![snap.join("model.safetensors")]);
        }
        other => panic!("resolved to {other:?}"),
    }
    std::fs::remove_dir_all(&root).ok();
}
