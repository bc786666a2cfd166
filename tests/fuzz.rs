//! Seeded mutation fuzzing of the parsers that read files a user hands kvbench: the GGUF reader
//! (header scan, candle's reader, config, geometry checks, tokenizer, tensor reads), the
//! safetensors header and geometry check, suites (TOML) and gate CSVs.
//!
//! Seeds are real files: the default GGUF's header region, a tiny GGUF with the same metadata
//! keys, a safetensors file written by candle, `suites/*.toml`, `suites/baselines/*.csv`. Each
//! execution mutates a seed (bit flips, byte sets to boundary values, u32/u64 fields set to
//! boundary values, cuts, duplicated or deleted spans, splices between seeds) and runs the
//! parser; an execution "crashes" when it panics (caught here and counted) or aborts the
//! process (an allocation the parser let through). `cargo test` runs a short bounded loop; the
//! ignored `gguf_reader_one_million_executions` runs `KVBENCH_FUZZ_EXECS` (default 1,000,000)
//! executions of the GGUF reader and prints the counts.

#[path = "support/gguf.rs"]
mod gguf;

use std::io::Cursor;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kvbench::measure::settings::Settings;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Boundary values a mutation writes into an integer field.
const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    0x7f,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    0x1_0000_0000,
    i64::MAX as u64,
    u64::MAX,
    u64::MAX / 2,
];

/// One random mutation of `seed` (possibly several stacked), AFL-style.
fn mutate(rng: &mut StdRng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    let rounds = 1 + rng.random_range(0..4);
    for _ in 0..rounds {
        if v.is_empty() {
            v.push(0);
        }
        let len = v.len();
        // Mutations near the start hit the header fields; bias there half the time.
        let pos = if rng.random_bool(0.5) {
            rng.random_range(0..len.min(256))
        } else {
            rng.random_range(0..len)
        };
        match rng.random_range(0..8) {
            0 => v[pos] ^= 1 << rng.random_range(0..8),
            1 => v[pos] = [0u8, 1, 0x7f, 0x80, 0xff][rng.random_range(0..5)],
            2 if pos + 4 <= len => {
                let x = INTERESTING[rng.random_range(0..INTERESTING.len())] as u32;
                v[pos..pos + 4].copy_from_slice(&x.to_le_bytes());
            }
            3 if pos + 8 <= len => {
                let x = INTERESTING[rng.random_range(0..INTERESTING.len())];
                v[pos..pos + 8].copy_from_slice(&x.to_le_bytes());
            }
            4 => v.truncate(pos),
            5 => {
                let n = rng.random_range(1..=64.min(len - pos));
                let span: Vec<u8> = v[pos..pos + n].to_vec();
                let at = rng.random_range(0..=len);
                v.splice(at..at, span);
            }
            6 => {
                let n = rng.random_range(1..=64.min(len - pos));
                v.drain(pos..pos + n);
            }
            _ if !other.is_empty() => {
                let from = rng.random_range(0..other.len());
                let n = rng.random_range(1..=64.min(other.len() - from));
                let end = (pos + n).min(len);
                v.splice(pos..end, other[from..from + n].iter().copied());
            }
            _ => v[pos] = rng.random(),
        }
    }
    v
}

/// Runs `parse` on `count` mutations of `seeds` (seeded); returns (executions, crashes), a crash
/// being a panic (printed once per kind).
fn fuzz(name: &str, seeds: &[Vec<u8>], count: u64, seed: u64, parse: impl Fn(&[u8])) -> (u64, u64) {
    fuzz_with(name, seeds, count, seed, mutate, |_, b| parse(b))
}

/// [`fuzz`] with another mutator, telling `parse` which seed the input was made from (the
/// file of a run folder it replaces).
fn fuzz_with(
    name: &str,
    seeds: &[Vec<u8>],
    count: u64,
    seed: u64,
    mutator: impl Fn(&mut StdRng, &[u8], &[u8]) -> Vec<u8>,
    parse: impl Fn(usize, &[u8]),
) -> (u64, u64) {
    drive(
        name,
        count,
        seed,
        |rng| {
            let which = rng.random_range(0..seeds.len());
            let o = &seeds[rng.random_range(0..seeds.len())];
            (which, mutator(rng, &seeds[which], o))
        },
        |(which, input)| parse(*which, input),
        |(_, input)| input.clone(),
    )
}

/// The driver: `count` executions of `run` on inputs made by `make` from one seeded generator;
/// returns (executions, crashes), a crash being a panic (the first five printed, their inputs
/// saved as written by `save`).
fn drive<T>(
    name: &str,
    count: u64,
    seed: u64,
    mut make: impl FnMut(&mut StdRng) -> T,
    run: impl Fn(&T),
    save: impl Fn(&T) -> Vec<u8>,
) -> (u64, u64) {
    // One loop at a time: the panic hook is process-wide, and two loops swapping it would
    // leave it silenced for the test harness's own failure messages.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = StdRng::seed_from_u64(seed);
    let mut crashes = 0;
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for i in 0..count {
        let input = make(&mut rng);
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&input))) {
            crashes += 1;
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            if crashes <= 5 {
                let file = std::env::temp_dir().join(format!("kvbench-fuzz-{name}-{i}.bin"));
                std::fs::write(&file, save(&input)).ok();
                eprintln!(
                    "{name}: execution {i} panicked: {msg} (input saved to {})",
                    file.display()
                );
            }
        }
    }
    std::panic::set_hook(hook);
    (count, crashes)
}

/// How far GGUF mutants got: opened (header read), config and geometry accepted, tokenizer built.
static GGUF_STAGES: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// The GGUF reader end to end on bytes in memory: header scan and candle's reader, hyper-
/// parameters and geometry against the tensors, tokenizer, and (for small files) every tensor.
fn read_gguf(bytes: &[u8]) {
    let path = Path::new("fuzz.gguf");
    let Ok(mut f) = kvbench::model::gguf::GgufFile::from_reader(path, Cursor::new(bytes)) else {
        return;
    };
    GGUF_STAGES[0].fetch_add(1, Ordering::Relaxed);
    let _ = f.parameter_count();
    let Ok(cfg) = f.config() else { return };
    GGUF_STAGES[1].fetch_add(1, Ordering::Relaxed);
    if f.tokenizer().is_ok() {
        GGUF_STAGES[2].fetch_add(1, Ordering::Relaxed);
    }
    if bytes.len() < 1 << 20 {
        for name in [
            "token_embd.weight",
            "blk.0.attn_q.weight",
            "output_norm.weight",
        ] {
            let _ = f.tensor(name);
        }
    }
    let _ = cfg.cache_geometry();
}

fn gguf_seeds() -> Vec<Vec<u8>> {
    let path = kvbench::model::fetch::ensure_default_model().unwrap();
    let real = gguf::Gguf::read(&path);
    let bytes = std::fs::read(&path).unwrap();
    // The default model's header region (metadata, the start of the vocabulary), and a tiny
    // model with the same keys whose every part parses.
    vec![bytes[..64 << 10].to_vec(), gguf::tiny_model(&real).bytes()]
}

/// Safetensors: candle's reader of the header, then the geometry check against a config.
fn read_safetensors(bytes: &[u8]) {
    let Ok(st) = candle_core::safetensors::SliceSafetensors::new(bytes) else {
        return;
    };
    let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
    let cfg = kvbench::model::ModelConfig {
        arch: "llama".into(),
        layers: 1,
        hidden: 8,
        intermediate: 16,
        q_heads: 2,
        kv_heads: 1,
        head_dim: 4,
        vocab: 10,
        rope_theta: 10000.0,
        rope_style: kvbench::model::RopeStyle::Half,
        rms_eps: 1e-5,
        max_ctx: 64,
        layer_windows: Vec::new(),
    };
    let ok = kvbench::model::shapes::check_shapes(
        &cfg,
        kvbench::model::shapes::Naming::HuggingFace,
        |n| st.get(n).ok().map(|v| v.shape().to_vec()),
        names.iter().map(String::as_str),
        Path::new("fuzz.safetensors"),
    );
    if ok.is_ok() {
        for n in &names {
            let _ = st.load(n, &candle_core::Device::Cpu);
        }
    }
}

fn safetensors_seed() -> Vec<u8> {
    use candle_core::{Device, Tensor};
    let dev = Device::Cpu;
    let t = |shape: &[usize]| Tensor::ones(shape, candle_core::DType::F32, &dev).unwrap();
    let mut m = std::collections::HashMap::new();
    m.insert("model.embed_tokens.weight".to_string(), t(&[10, 8]));
    m.insert("model.norm.weight".to_string(), t(&[8]));
    let p = "model.layers.0";
    for (n, s) in [
        ("input_layernorm", vec![8]),
        ("post_attention_layernorm", vec![8]),
        ("self_attn.q_proj", vec![8, 8]),
        ("self_attn.k_proj", vec![4, 8]),
        ("self_attn.v_proj", vec![4, 8]),
        ("self_attn.o_proj", vec![8, 8]),
        ("mlp.gate_proj", vec![16, 8]),
        ("mlp.up_proj", vec![16, 8]),
        ("mlp.down_proj", vec![8, 16]),
    ] {
        m.insert(format!("{p}.{n}.weight"), t(&s));
    }
    let file =
        std::env::temp_dir().join(format!("kvbench-fuzz-{}.safetensors", std::process::id()));
    candle_core::safetensors::save(&m, &file).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).ok();
    bytes
}

fn read_suite(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let _ = kvbench::measure::settings::SweepSettings::parse_suite(&text, Path::new("fuzz.toml"));
}

fn suite_seeds() -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/suites");
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        // serve*.toml hold `kvbench serve` settings, not sweep suites.
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with("serve"))
        })
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

fn read_gate(bytes: &[u8], base: &kvbench::report::gate::Results) {
    use kvbench::report::gate::{compare, markdown, Limits, Results};
    let Ok(cur) = Results::from_reader(Path::new("fuzz.csv"), bytes) else {
        return;
    };
    let limits = Limits {
        max_ppl_delta_pct: Some(1.0),
        max_kl: Some(0.01),
        max_tpot_regression_pct: Some(5.0),
        significant: false,
    };
    for (b, c) in [(base, &cur), (&cur, base), (&cur, &cur)] {
        if let Ok(v) = compare(b, c, &limits) {
            let _ = markdown(&v, &limits);
        }
    }
}

fn gate_seeds() -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/suites/baselines");
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

/// The seeds parse (so mutations start from valid files).
#[test]
fn fuzz_seeds_are_valid_files() {
    let tiny = &gguf_seeds()[1];
    let mut f =
        kvbench::model::gguf::GgufFile::from_reader(Path::new("tiny.gguf"), Cursor::new(tiny))
            .unwrap();
    assert_eq!(f.config().unwrap().layers, 2);
    f.tensor("blk.1.ffn_down.weight").unwrap();
    assert!(!gate_seeds().is_empty() && !suite_seeds().is_empty());
    for s in suite_seeds() {
        kvbench::measure::settings::SweepSettings::parse_suite(
            std::str::from_utf8(&s).unwrap(),
            Path::new("s.toml"),
        )
        .unwrap();
    }
}

/// A short bounded run of every fuzz target (a few seconds): no panic, no abort.
#[test]
fn fuzzed_model_suite_and_gate_files_never_crash() {
    let g = fuzz("gguf", &gguf_seeds(), 3000, 1, read_gguf);
    let s = fuzz(
        "safetensors",
        &[safetensors_seed()],
        3000,
        2,
        read_safetensors,
    );
    let t = fuzz("suite", &suite_seeds(), 3000, 3, read_suite);
    let base_bytes = gate_seeds().remove(0);
    let base = kvbench::report::gate::Results::from_reader(Path::new("base.csv"), &base_bytes[..])
        .unwrap();
    let c = fuzz("gate", &gate_seeds(), 3000, 4, |b| read_gate(b, &base));
    let [sm, sr, ss] = fuzz_serve(1500, 5);
    let m = fuzz_merge(1500, 20, 8);
    let sl = fuzz_slurm(3000, 40, 9);
    for (name, (n, crashes)) in [
        ("gguf", g),
        ("safetensors", s),
        ("suite", t),
        ("gate", c),
        ("serve meta.json", sm),
        ("serve raw.jsonl", sr),
        ("serve suite", ss),
        ("merge", m),
        ("slurm", sl),
    ] {
        assert_eq!(crashes, 0, "{name}: {crashes} of {n} executions panicked");
    }
}

/// An environment variable's number, or `default`.
fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// ≥ 1 M executions of the GGUF reader (`cargo test --release --test fuzz -- --ignored
/// --nocapture`; `KVBENCH_FUZZ_EXECS` and `KVBENCH_FUZZ_SEED` change the count and seed).
#[test]
#[ignore]
fn gguf_reader_one_million_executions() {
    let n = env_u64("KVBENCH_FUZZ_EXECS", 1_000_000);
    let seed = env_u64("KVBENCH_FUZZ_SEED", 14);
    let t = Instant::now();
    let (execs, crashes) = fuzz("gguf", &gguf_seeds(), n, seed, read_gguf);
    let stage = |i: usize| GGUF_STAGES[i].load(Ordering::Relaxed);
    println!(
        "GGUF reader fuzz: {execs} executions, {crashes} crashes, {:.1} s (seed {seed}); \
         header read {}, config + geometry accepted {}, tokenizer built {}",
        t.elapsed().as_secs_f64(),
        stage(0),
        stage(1),
        stage(2)
    );
    assert_eq!(crashes, 0);
}

// ---- Structured mutations: JSON (meta.json, raw.jsonl) and flat TOML (suites) ----------------

/// Characters that mean something to a shell, to sbatch or to a file format: control
/// characters, quotes, `$`, backquotes, `%`, `\\`, `#`, spaces, and non-ASCII (a no-break space,
/// a line separator, a byte-order mark, a right-to-left override, an emoji).
const ODD_CHARS: &[char] = &[
    '\n', '\r', '\t', '\0', '\x1b', '\x7f', '\u{85}', '\'', '"', '`', '$', '%', '\\', '#', ' ',
    '=', ',', ':', '/', '.', '-', '{', '}', '(', ')', ';', '&', '|', '*', '?', '~', '!', '[', ']',
    '<', '>', '@', '+', '^', 'é', '中', '😀', '\u{a0}', '\u{2028}', '\u{feff}', '\u{202e}',
];

/// Fragments a random string is built from besides single characters.
const ODD_SNIPPETS: &[&str] = &[
    "$(echo INJECTED)",
    "`echo INJECTED`",
    "${HOME}",
    "$SLURM_ARRAY_TASK_ID",
    "'\\''",
    "\\\"",
    "\"\"",
    "''",
    "\n#SBATCH --wrap=x\n",
    "\necho INJECTED\n",
    "%a",
    "%%",
    "%j",
    "--",
    "-p gpu",
    "inf",
    "NaN",
    "1e309",
    "18446744073709551616",
    "-0",
    "0..0",
    "xsum:1..",
    "16..8",
    "24MiB",
    "0B",
];

/// A random string of at most `max` pieces: ASCII letters and digits, [`ODD_CHARS`] and
/// [`ODD_SNIPPETS`].
fn odd_string(rng: &mut StdRng, max: usize) -> String {
    let n = rng.random_range(0..=max);
    let mut s = String::new();
    for _ in 0..n {
        match rng.random_range(0..6) {
            0 | 1 => s.push(rng.random_range(b'a'..=b'z') as char),
            2 => s.push(rng.random_range(b'0'..=b'9') as char),
            3 | 4 => s.push(ODD_CHARS[rng.random_range(0..ODD_CHARS.len())]),
            _ => s.push_str(ODD_SNIPPETS[rng.random_range(0..ODD_SNIPPETS.len())]),
        }
    }
    s
}

/// A value a structured mutation writes into a field: integer boundaries, extreme floats,
/// odd strings, and the other JSON kinds.
fn odd_value(rng: &mut StdRng) -> serde_json::Value {
    use serde_json::json;
    match rng.random_range(0..17) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(1),
        3 => json!(u64::MAX),
        4 => json!(i64::MIN),
        5 => json!(INTERESTING[rng.random_range(0..INTERESTING.len())]),
        6 => json!(1e308),
        7 => json!(-0.0),
        8 => json!(5e-324),
        9 => json!(0.5),
        10 => json!(""),
        11 => serde_json::Value::String(odd_string(rng, 12)),
        12 => serde_json::Value::Null,
        13 => json!([]),
        14 => json!({}),
        15 => json!(true),
        _ => serde_json::Value::String("x".repeat(rng.random_range(1..5000))),
    }
}

/// Every node of `v` as a JSON pointer (the root is "").
fn pointers(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                pointers(
                    x,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                pointers(x, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// One to three structured mutations of `doc`: a node replaced by an odd value or by another
/// node (of `doc` or `other`), deleted, nudged (numbers ±1, ×1000, negated), an array element
/// duplicated or the array emptied, a key added.
fn mutate_value(rng: &mut StdRng, doc: &mut serde_json::Value, other: &serde_json::Value) {
    use serde_json::Value;
    for _ in 0..1 + rng.random_range(0..3) {
        let mut ps = Vec::new();
        pointers(doc, String::new(), &mut ps);
        let p = ps[rng.random_range(0..ps.len())].clone();
        let action = rng.random_range(0..8);
        if action == 5 && !p.is_empty() {
            // Delete the node from its parent.
            let (parent, key) = p.rsplit_once('/').unwrap();
            let key = key.replace("~1", "/").replace("~0", "~");
            match doc.pointer_mut(parent) {
                Some(Value::Object(m)) => {
                    m.remove(&key);
                }
                Some(Value::Array(a)) => {
                    if let Ok(i) = key.parse::<usize>() {
                        if i < a.len() {
                            a.remove(i);
                        }
                    }
                }
                _ => {}
            }
            continue;
        }
        if action == 4 {
            // Replace the node by a copy of another one (of this document or the other seed).
            let src = if rng.random_bool(0.5) { other } else { &*doc };
            let mut qs = Vec::new();
            pointers(src, String::new(), &mut qs);
            let q = &qs[rng.random_range(0..qs.len())];
            let x = src.pointer(q).cloned().unwrap_or(Value::Null);
            *doc.pointer_mut(&p).unwrap() = x;
            continue;
        }
        let node = doc.pointer_mut(&p).unwrap();
        match action {
            0..=3 => *node = odd_value(rng),
            _ => match node {
                Value::Number(n) => {
                    let (x, int) = (n.as_f64().unwrap_or(0.0), n.as_i64());
                    *node = match (int, rng.random_range(0..6)) {
                        (Some(i), 4 | 5) => {
                            serde_json::json!(i.wrapping_add(rng.random_range(-2..=2)))
                        }
                        (_, 0) => serde_json::json!(x + 1.0),
                        (_, 1) => serde_json::json!(x - 1.0),
                        (_, 2) => serde_json::json!(x * 1000.0),
                        _ => serde_json::json!(-x),
                    };
                }
                Value::String(s) => {
                    if rng.random_bool(0.5) {
                        s.push_str(&odd_string(rng, 4));
                    } else {
                        *s = odd_string(rng, 8);
                    }
                }
                Value::Array(a) if !a.is_empty() && rng.random_bool(0.7) => {
                    let i = rng.random_range(0..a.len());
                    let x = a[i].clone();
                    a.insert(rng.random_range(0..=a.len()), x);
                }
                Value::Array(a) => a.clear(),
                Value::Object(m) => {
                    m.insert(odd_string(rng, 6), odd_value(rng));
                }
                _ => *node = odd_value(rng),
            },
        }
    }
}

/// Byte mutations half the time, structured ones ([`mutate_value`]) the other half: a
/// pretty-printed JSON document (meta.json) is parsed, mutated and printed again; JSON Lines
/// (raw.jsonl) have a line mutated, or a line deleted, duplicated, swapped or cut short.
fn mutate_json(rng: &mut StdRng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    if rng.random_bool(0.5) {
        return mutate(rng, seed, other);
    }
    let text = String::from_utf8_lossy(seed);
    let parse = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).ok();
    let other_doc = parse(other)
        .or_else(|| other.split(|&b| b == b'\n').find_map(parse))
        .unwrap_or(serde_json::Value::Null);
    if text.trim().lines().count() > 1 {
        if let Some(mut doc) = parse(seed) {
            mutate_value(rng, &mut doc, &other_doc);
            return serde_json::to_string_pretty(&doc).unwrap().into_bytes();
        }
    }
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        return mutate(rng, seed, other);
    }
    let i = rng.random_range(0..lines.len());
    match rng.random_range(0..8) {
        0 => {
            lines.remove(i);
        }
        1 => {
            let l = lines[i].clone();
            lines.insert(rng.random_range(0..=lines.len()), l);
        }
        2 => {
            let j = rng.random_range(0..lines.len());
            lines.swap(i, j);
        }
        3 => {
            let l = &mut lines[i];
            let cut = rng.random_range(0..=l.len());
            let cut = (0..=cut)
                .rev()
                .find(|&c| l.is_char_boundary(c))
                .unwrap_or(0);
            l.truncate(cut);
        }
        _ => match parse(lines[i].as_bytes()) {
            Some(mut v) => {
                mutate_value(rng, &mut v, &other_doc);
                lines[i] = serde_json::to_string(&v).unwrap();
            }
            None => return mutate(rng, seed, other),
        },
    }
    let mut out = lines.join("\n");
    if rng.random_bool(0.8) {
        out.push('\n');
    }
    out.into_bytes()
}

/// `v` as TOML, for the flat tables suites are (keys and values written as JSON, which TOML
/// reads for these kinds; `null` keys left out). None where TOML has no form for a value.
fn to_toml(v: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    fn value(v: &Value) -> Option<String> {
        Some(match v {
            Value::Null => return None,
            Value::Array(a) => format!(
                "[{}]",
                a.iter().map(value).collect::<Option<Vec<_>>>()?.join(", ")
            ),
            Value::Object(m) => format!(
                "{{ {} }}",
                m.iter()
                    .map(|(k, x)| Some(format!("{} = {}", Value::from(k.as_str()), value(x)?)))
                    .collect::<Option<Vec<_>>>()?
                    .join(", ")
            ),
            Value::Number(n) if n.as_f64().is_some_and(|x| x.is_infinite()) => "inf".into(),
            other => other.to_string(),
        })
    }
    let Value::Object(m) = v else { return None };
    let mut s = String::new();
    for (k, x) in m {
        if let Some(x) = value(x) {
            s.push_str(&format!("{} = {x}\n", Value::from(k.as_str())));
        }
    }
    Some(s)
}

/// Byte mutations half the time; otherwise the suite is read as a TOML table, mutated as JSON
/// ([`mutate_value`]) and written back ([`to_toml`]).
fn mutate_toml(rng: &mut StdRng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    if rng.random_bool(0.5) {
        return mutate(rng, seed, other);
    }
    let table = |b: &[u8]| {
        let t: toml::Table = toml::from_str(std::str::from_utf8(b).ok()?).ok()?;
        serde_json::to_value(t).ok()
    };
    let (Some(mut doc), Some(o)) = (table(seed), table(other)) else {
        return mutate(rng, seed, other);
    };
    mutate_value(rng, &mut doc, &o);
    match to_toml(&doc) {
        Some(t) => t.into_bytes(),
        None => mutate(rng, seed, other),
    }
}

/// A fresh folder under the temp dir for one fuzz target.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kvbench-fuzz-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

// ---- Serve run folders: meta.json (--resume), raw.jsonl, suites -----------------------------

/// A real serve run folder (fp16, 2 requests of 16 + 2 tokens on the default model), made
/// once per test process.
fn serve_run_folder() -> &'static Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        kvbench::model::fetch::ensure_default_model().unwrap();
        let dir = scratch("serve-run").join("run");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args([
                "serve",
                "--schemes",
                "fp16",
                "--kv-budget",
                "4MiB",
                "--num-requests",
                "2",
                "--input-len",
                "16",
                "--output-len",
                "2",
                "--rate",
                "inf",
                "--out",
            ])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kvbench serve failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// `kvbench serve --resume DIR`'s reading of `DIR/meta.json`, then the checks of the
/// settings it recorded (as a resumed run makes them before loading the model).
fn read_serve_meta(dir: &Path, bytes: &[u8]) {
    std::fs::write(dir.join("meta.json"), bytes).unwrap();
    if let Ok((m, _)) = kvbench::report::serve::ServeMeta::read(&dir.join("meta.json")) {
        SERVE_STAGES[0].fetch_add(1, Ordering::Relaxed);
        if kvbench::serve::settings::ServePlan::build(&m.settings).is_ok() {
            SERVE_STAGES[1].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A serve `raw.jsonl` read back, and its rows written as results.csv is.
fn read_serve_raw(dir: &Path, bytes: &[u8]) {
    let path = dir.join("raw.jsonl");
    std::fs::write(&path, bytes).unwrap();
    if let Ok(lines) = kvbench::report::serve::read_raw(dir) {
        SERVE_STAGES[2].fetch_add(1, Ordering::Relaxed);
        let mut w = csv::Writer::from_writer(Vec::new());
        for l in &lines {
            if let kvbench::report::serve::RawLine::Point { row, .. } = l {
                let _ = w.serialize(row);
            }
        }
        let _ = w.flush();
    }
}

/// A serve suite over the defaults, then the checks `serve` makes of the settings.
fn read_serve_suite(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    if let Ok(a) =
        kvbench::serve::settings::ServeSettings::parse_suite(&text, Path::new("fuzz.toml"))
    {
        SERVE_STAGES[3].fetch_add(1, Ordering::Relaxed);
        if kvbench::serve::settings::ServePlan::build(&a).is_ok() {
            SERVE_STAGES[4].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// How far serve mutants got: meta read, its settings checked; raw.jsonl read; suite parsed,
/// its settings checked.
static SERVE_STAGES: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

/// suites/serve.toml, suites/serve-decode.toml and a suite with the keys they do not use
/// (closed loop, fixed and XSum lengths, a shared prefix, weights, threads).
fn serve_suite_seeds() -> Vec<Vec<u8>> {
    let read = |f: &str| std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(f)).unwrap();
    let (shipped, decode) = (read("suites/serve.toml"), read("suites/serve-decode.toml"));
    let other = b"description = \"closed loop\"\nschemes = \"fp16,int4\"\nconcurrency = [1, 4]\n\
                  input-len = 256\noutput-len = \"xsum:8..64\"\nshared-prefix = 32\n\
                  weights = \"f32\"\nprefill-weights = \"native\"\nthreads = 2\n\
                  rate = [\"inf\", 0.5]\nnum-requests = 8\nblock-size = 32\n"
        .to_vec();
    vec![shipped, decode, other]
}

/// Runs the three serve targets for `count` executions each; returns their (executions,
/// crashes) as (meta, raw, suite).
fn fuzz_serve(count: u64, seed: u64) -> [(u64, u64); 3] {
    let run = serve_run_folder();
    let dir = scratch("serve");
    let meta = std::fs::read(run.join("meta.json")).unwrap();
    let raw = std::fs::read(run.join("raw.jsonl")).unwrap();
    // The seeds are valid (so mutations start from files serve reads).
    let (m, _) = kvbench::report::serve::ServeMeta::read(&run.join("meta.json")).unwrap();
    kvbench::serve::settings::ServePlan::build(&m.settings).unwrap();
    let lines = kvbench::report::serve::read_raw(run).unwrap();
    let points = lines
        .iter()
        .filter(|l| matches!(l, kvbench::report::serve::RawLine::Point { .. }))
        .count();
    assert_eq!((lines.len() - points, points), (2, 1));
    for t in serve_suite_seeds() {
        let a = kvbench::serve::settings::ServeSettings::parse_suite(
            std::str::from_utf8(&t).unwrap(),
            run,
        )
        .unwrap();
        kvbench::serve::settings::ServePlan::build(&a).unwrap();
    }
    let m = fuzz_with("serve-meta", &[meta], count, seed, mutate_json, |_, b| {
        read_serve_meta(&dir, b)
    });
    let r = fuzz_with("serve-raw", &[raw], count, seed + 1, mutate_json, |_, b| {
        read_serve_raw(&dir, b)
    });
    let s = fuzz_with(
        "serve-suite",
        &serve_suite_seeds(),
        count,
        seed + 2,
        mutate_toml,
        |_, b| read_serve_suite(b),
    );
    std::fs::remove_dir_all(&dir).ok();
    [m, r, s]
}

// ---- Merge: two shard folders, one file mutated at a time ------------------------------------

/// The shard folders' files a merge reads, in seed order.
const MERGE_FILES: [(&str, &str); 4] = [
    ("A", "meta.json"),
    ("A", "raw.jsonl"),
    ("B", "meta.json"),
    ("B", "raw.jsonl"),
];

/// Two real shard folders (`A`, `B`) of a synthetic fp16/int8 sweep split in two, made under
/// `root`.
fn make_shards(root: &Path) {
    for (i, name) in ["A", "B"].iter().enumerate() {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args([
                "sweep",
                "--synthetic",
                "--dtypes",
                "fp16,int8",
                "--batch-sizes",
                "1",
                "--seq-lens",
                "16",
                "--gen",
                "2",
                "--shard",
                &format!("{i}/2"),
                "--out",
            ])
            .arg(root.join(name))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kvbench sweep --shard {i}/2 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// How far merge mutants got: both shards read, merged (allow-partial off), written by
/// `kvbench merge` (reported separately: only the first few are written).
static MERGE_STAGES: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// Puts a shard file back as it was when dropped (so the next execution, panic or not, starts
/// from the real folders).
struct Restore<'a>(&'a Path, &'a [u8]);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        std::fs::write(self.0, self.1).unwrap();
    }
}

/// `kvbench merge`'s reading and joining of the shards with one file replaced by `bytes`: both
/// shards read ([`kvbench::report::merge::ShardFolder::read`]), merged in either order, with and
/// without `--allow-partial`, and one shard alone (partial); while `writes` lasts, a mutant the
/// library merges is also merged by `kvbench merge` into a fresh folder (meta, raw, CSV,
/// summary, charts).
fn merge_mutant(root: &Path, seeds: &[Vec<u8>], which: usize, bytes: &[u8], writes: &AtomicU64) {
    use kvbench::report::merge::{merge, ShardFolder};
    let (shard, file) = MERGE_FILES[which];
    let path = root.join(shard).join(file);
    let _restore = Restore(&path, &seeds[which]);
    std::fs::write(&path, bytes).unwrap();
    let (a, b) = (root.join("A"), root.join("B"));
    let (Ok(sa), Ok(sb)) = (ShardFolder::read(&a), ShardFolder::read(&b)) else {
        return;
    };
    MERGE_STAGES[0].fetch_add(1, Ordering::Relaxed);
    let pair = [sa.clone(), sb.clone()];
    let ok = merge(&pair, false).is_ok();
    if ok {
        MERGE_STAGES[1].fetch_add(1, Ordering::Relaxed);
    }
    let _ = merge(&[sb.clone(), sa.clone()], false);
    let partial = merge(&pair, true).is_ok();
    let _ = merge(&[sb], true);
    let _ = merge(&[sa.clone(), sa], true);
    if (ok || partial)
        && writes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    {
        let out = root.join("merged");
        std::fs::remove_dir_all(&out).ok();
        let args = kvbench::cli::merge::MergeArgs {
            dirs: vec![a, b],
            out: out.clone(),
            allow_partial: true,
            force: false,
        };
        if kvbench::cli::merge::run(args).is_ok() {
            MERGE_STAGES[2].fetch_add(1, Ordering::Relaxed);
        }
        std::fs::remove_dir_all(&out).ok();
    }
}

/// `count` executions of the merge target, of which at most `writes` run the whole `kvbench
/// merge`; returns (executions, crashes).
fn fuzz_merge(count: u64, writes: u64, seed: u64) -> (u64, u64) {
    let root = scratch("merge");
    make_shards(&root);
    let seeds: Vec<Vec<u8>> = MERGE_FILES
        .iter()
        .map(|(d, f)| std::fs::read(root.join(d).join(f)).unwrap())
        .collect();
    // The seeds are valid: the real shards merge.
    let read = |d: &str| kvbench::report::merge::ShardFolder::read(&root.join(d)).unwrap();
    kvbench::report::merge::merge(&[read("A"), read("B")], false).unwrap();
    let writes = AtomicU64::new(writes);
    let r = fuzz_with("merge", &seeds, count, seed, mutate_json, |which, b| {
        merge_mutant(&root, &seeds, which, b, &writes)
    });
    std::fs::remove_dir_all(&root).ok();
    r
}

// ---- The Slurm script writer ----------------------------------------------------------------

/// A value a user gives `kvbench slurm`: a plain one a quarter of the time, else an
/// [`odd_string`], which keeps its control characters one time in eight (so that most jobs
/// pass the checks and reach the quoting).
fn slurm_value(rng: &mut StdRng) -> String {
    const PLAIN: [&str; 6] = ["gpu", "proj-42", "2:00:00", "16G", "kvbench", "a b"];
    if rng.random_bool(0.25) {
        return PLAIN[rng.random_range(0..PLAIN.len())].to_string();
    }
    let s = odd_string(rng, 10);
    if rng.random_bool(0.125) {
        s
    } else {
        s.chars().filter(|c| !c.is_control()).collect()
    }
}

/// A job with random values wherever a user gives one: partition, account, time, mem, job
/// name, `--sbatch-arg`s, `--out` (under `root`, so the scripts' folders stay there), the
/// working directory and the sweep flags' values; shards and threads at their bounds too.
fn odd_job(rng: &mut StdRng, root: &Path, exe: &Path) -> kvbench::app::slurm::JobSpec {
    let mut shard_options = Vec::new();
    let mut merge_options = Vec::new();
    for k in ["partition", "account", "time", "mem"] {
        if rng.random_bool(0.6) {
            let v = slurm_value(rng);
            if k == "partition" || k == "account" {
                merge_options.push((k.to_string(), v.clone()));
            }
            shard_options.push((k.to_string(), v));
        }
    }
    for k in ["gpus-per-task", "cpus-per-task"] {
        if rng.random_bool(0.3) {
            shard_options.push((k.to_string(), rng.random::<u32>().to_string()));
        }
    }
    let sbatch_args = (0..rng.random_range(0..3))
        .map(|_| match rng.random_range(0..4) {
            0 => format!("--{}", slurm_value(rng)),
            1 => format!("-p {}", slurm_value(rng)),
            2 => format!("--comment=\"{}\"", slurm_value(rng)),
            _ => slurm_value(rng),
        })
        .collect();
    let mut sweep_flags = Vec::new();
    for f in ["--dtypes", "--seq-lens", "--model", "--suite"] {
        if rng.random_bool(0.5) {
            sweep_flags.push(f.to_string());
            sweep_flags.push(slurm_value(rng));
        }
    }
    if rng.random_bool(0.3) {
        sweep_flags.push("--synthetic".into());
    }
    let shards = match rng.random_range(0..12) {
        0 => 0,
        1 => 1001,
        2 => 1002,
        3 => usize::MAX,
        _ => rng.random_range(1..=8),
    };
    // `..` would leave `root`; the rest of the odd characters stay.
    let out = root.join(format!("out-{}", slurm_value(rng).replace("..", "._")));
    let workdir = if rng.random_bool(0.7) {
        std::path::PathBuf::from("/work/some dir")
    } else {
        std::path::PathBuf::from(format!("/w/{}", slurm_value(rng)))
    };
    kvbench::app::slurm::JobSpec {
        exe: exe.to_path_buf(),
        workdir,
        out,
        shards,
        sweep_flags,
        threads: rng.random_bool(0.3).then(|| rng.random_range(0..=u32::MAX)),
        shard_options,
        sbatch_args,
        merge_options,
        job_name: slurm_value(rng),
    }
}

/// Whether `job` holds only values the writer is documented to take ([`JobSpec::check`]):
/// 1 to 1001 shards; no control character and not blank (job name, option values, sbatch
/// args, `--out`, working directory); no control character in a sweep flag; no `\` in
/// `--out`; each sbatch arg read whole by sbatch, starting with an option.
///
/// [`JobSpec::check`]: kvbench::app::slurm::JobSpec::check
fn slurm_job_is_plain(job: &kvbench::app::slurm::JobSpec) -> bool {
    let plain = |v: &str| !v.chars().any(char::is_control) && !v.trim().is_empty();
    let out = job.out.to_str().unwrap();
    (1..=1001).contains(&job.shards)
        && plain(&job.job_name)
        && plain(out)
        && !out.contains('\\')
        && plain(job.workdir.to_str().unwrap())
        && job
            .shard_options
            .iter()
            .chain(&job.merge_options)
            .all(|(_, v)| plain(v))
        && job.sbatch_args.iter().all(|a| {
            plain(a)
                && kvbench::app::slurm::sbatch_words(a)
                    .is_ok_and(|w| w.first().is_some_and(|w| w.starts_with('-')))
        })
        && job
            .sweep_flags
            .iter()
            .all(|w| !w.chars().any(char::is_control))
}

/// Checks that `script` is the shebang, then exactly the `#SBATCH` lines `header` (each read
/// back by sbatch's word splitting as these words), then exactly `body` further lines (`body`:
/// for each, the text it starts with); nothing else (an injected line or `#SBATCH` option
/// would show up as an extra line).
fn check_script(what: &str, script: &str, header: &[Vec<String>], body: &[&str]) {
    use kvbench::app::slurm::sbatch_words;
    let lines: Vec<&str> = script.split('\n').collect();
    assert_eq!(
        lines.len(),
        1 + header.len() + body.len() + 1,
        "{what}: an extra line:\n{script}"
    );
    assert_eq!(lines[0], "#!/bin/bash", "{what}");
    for (line, want) in lines[1..].iter().zip(header) {
        let rest = line
            .strip_prefix("#SBATCH ")
            .unwrap_or_else(|| panic!("{what}: {line:?} is not an #SBATCH line"));
        assert_eq!(
            sbatch_words(rest).as_ref(),
            Ok(want),
            "{what}: sbatch reads {line:?} otherwise"
        );
    }
    for (line, start) in lines[1 + header.len()..].iter().zip(body) {
        assert!(
            line.starts_with(start),
            "{what}: {line:?} should start with {start:?}"
        );
    }
    assert_eq!(lines.last(), Some(&""), "{what}: ends in a newline");
}

/// Runs `script` with bash (`SLURM_ARRAY_TASK_ID=1`) in `cwd`; the fake kvbench it execs
/// prints its arguments, which are returned.
fn bash_argv(script: &str, cwd: &Path) -> Vec<String> {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("SLURM_ARRAY_TASK_ID", "1")
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bash failed: {}\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_suffix('\0')
        .map(|t| t.split('\0').map(str::to_string).collect())
        .unwrap_or_default()
}

/// How far Slurm jobs got: scripts written; checked by bash.
static SLURM_STAGES: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];

/// The writer on `job`: refused exactly when a value is not plain ([`slurm_job_is_plain`]);
/// otherwise each `#SBATCH` line gives sbatch the intended option and value (with `%` of
/// `--out` doubled in `--output`) and no other line exists. With `bash` (a bounded sample: it
/// spawns processes), the scripts run by bash exec kvbench with exactly the intended
/// arguments, resuming when the shard folder holds a meta.json, and `sh_quote` of random
/// strings reads back as them. Always: `sbatch_quote(v)` reads back as `v`.
fn check_slurm(rng: &mut StdRng, job: &kvbench::app::slurm::JobSpec, bash: Option<&Path>) {
    use kvbench::app::slurm::{sbatch_quote, sbatch_words, scripts, sh_quote};
    for v in std::iter::once(&job.job_name).chain(job.shard_options.iter().map(|(_, v)| v)) {
        if !v.is_empty() {
            assert_eq!(sbatch_words(&sbatch_quote(v)), Ok(vec![v.clone()]), "{v:?}");
        }
    }
    let plain = slurm_job_is_plain(job);
    let s = match scripts(job) {
        Ok(s) => s,
        Err(e) => {
            assert!(!plain, "a plain job refused: {e}");
            return;
        }
    };
    assert!(plain, "a job with a value that is not plain accepted");
    SLURM_STAGES[0].fetch_add(1, Ordering::Relaxed);
    let out = job.out.to_str().unwrap();
    let workdir = job.workdir.to_str().unwrap();
    let logs = job.out.join("slurm").to_str().unwrap().replace('%', "%%");
    let one = |w: String| vec![w];
    let mut sweep_header = vec![
        one(format!("--job-name={}-sweep", job.job_name)),
        one(format!("--array=0-{}", job.shards - 1)),
        one(format!("--output={logs}/shard-%a.log")),
        one(format!("--chdir={workdir}")),
    ];
    sweep_header.extend(
        job.shard_options
            .iter()
            .map(|(k, v)| one(format!("--{k}={v}"))),
    );
    sweep_header.extend(job.sbatch_args.iter().map(|a| sbatch_words(a).unwrap()));
    let exec = format!("exec {}", sh_quote(job.exe.to_str().unwrap()));
    check_script(
        "sweep script",
        &s.sweep,
        &sweep_header,
        &[
            "# ",
            "# ",
            "set -euo pipefail",
            "dir=",
            "if [ -s \"$dir/meta.json\" ]; then",
            &format!("    {exec} sweep --resume \"$dir\""),
            "fi",
            &format!("{exec} sweep"),
        ],
    );
    let mut merge_header = vec![
        one(format!("--job-name={}-merge", job.job_name)),
        one(format!("--output={logs}/merge.log")),
        one(format!("--chdir={workdir}")),
    ];
    merge_header.extend(
        job.merge_options
            .iter()
            .map(|(k, v)| one(format!("--{k}={v}"))),
    );
    check_script(
        "merge script",
        &s.merge,
        &merge_header,
        &["# ", "set -euo pipefail", &format!("{exec} merge ")],
    );
    let Some(cwd) = bash else { return };
    SLURM_STAGES[1].fetch_add(1, Ordering::Relaxed);
    let threads: Vec<String> = job
        .threads
        .map(|t| vec!["--threads".into(), t.to_string()])
        .unwrap_or_default();
    let shard = format!("{out}/shard-1");
    let resume = rng.random_bool(0.5);
    let want: Vec<String> = if resume {
        std::fs::create_dir_all(&shard).unwrap();
        std::fs::write(format!("{shard}/meta.json"), "{}").unwrap();
        ["sweep", "--resume", &shard]
            .iter()
            .map(|w| w.to_string())
            .chain(threads)
            .collect()
    } else {
        let mut w = vec!["sweep".to_string()];
        w.extend(job.sweep_flags.iter().cloned());
        w.extend(threads);
        w.extend([
            "--shard".into(),
            format!("1/{}", job.shards),
            "--out".into(),
            shard.clone(),
        ]);
        w
    };
    assert_eq!(
        bash_argv(&s.sweep, cwd),
        want,
        "bash runs the sweep script otherwise"
    );
    if resume {
        std::fs::remove_dir_all(&job.out).unwrap();
    }
    let mut want = vec!["merge".to_string()];
    want.extend((0..job.shards).map(|i| job.out.join(format!("shard-{i}")).display().to_string()));
    want.extend([
        "--out".into(),
        job.out.join("merged").display().to_string(),
        "--force".into(),
    ]);
    assert_eq!(
        bash_argv(&s.merge, cwd),
        want,
        "bash runs the merge script otherwise"
    );
    // sh_quote alone, on strings the checks would refuse too (all but NUL, which no argument
    // holds).
    let vs: Vec<String> = (0..8)
        .map(|_| odd_string(rng, 10).replace('\0', ""))
        .collect();
    let words: Vec<String> = vs.iter().map(|v| sh_quote(v)).collect();
    let got = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("printf '%s\\0' {}", words.join(" ")))
        .output()
        .unwrap();
    let text = String::from_utf8(got.stdout).unwrap();
    let got: Vec<&str> = text.strip_suffix('\0').unwrap().split('\0').collect();
    assert_eq!(got, vs, "sh_quote does not read back through bash");
}

/// `count` Slurm jobs checked, the first `bash` of them also run through bash; returns
/// (executions, crashes).
fn fuzz_slurm(count: u64, bash: u64, seed: u64) -> (u64, u64) {
    let root = scratch("slurm");
    // A fake kvbench that prints its arguments, in a folder whose name needs quoting.
    let bin = root.join("kv bench's $bin");
    std::fs::create_dir_all(&bin).unwrap();
    let exe = bin.join("kvbench");
    std::fs::write(&exe, "#!/bin/sh\nprintf '%s\\0' \"$@\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cwd = root.join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let jobs = root.join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    let n = std::cell::Cell::new(0u64);
    let r = drive(
        "slurm",
        count,
        seed,
        |rng| {
            let job = odd_job(rng, &jobs, &exe);
            (job, StdRng::seed_from_u64(rng.random()))
        },
        |(job, r)| {
            let mut rng = r.clone();
            // Only jobs the writer takes are run by bash; count those.
            let take = slurm_job_is_plain(job) && n.get() < bash;
            if take {
                n.set(n.get() + 1);
            }
            check_slurm(&mut rng, job, take.then_some(cwd.as_path()));
        },
        |(job, _)| format!("{job:#?}").into_bytes(),
    );
    std::fs::remove_dir_all(&root).ok();
    r
}

/// A long run of the serve, merge and Slurm targets (`cargo test --release --test fuzz --
/// --ignored --nocapture serve_merge_and_slurm`): `KVBENCH_FUZZ_EXECS` (default 100,000)
/// executions of each, seeded by `KVBENCH_FUZZ_SEED`; of those, 200 whole `kvbench merge`
/// writes and 200 Slurm jobs run through bash. Prints the executions, crashes and how far the
/// mutants got.
#[test]
#[ignore]
fn serve_merge_and_slurm_long_run() {
    let n = env_u64("KVBENCH_FUZZ_EXECS", 100_000);
    let seed = env_u64("KVBENCH_FUZZ_SEED", 25);
    let load = |s: &[AtomicU64], i: usize| s[i].load(Ordering::Relaxed);
    let t = Instant::now();
    let [sm, sr, ss] = fuzz_serve(n, seed);
    println!(
        "serve fuzz ({:.1} s, seed {seed}): meta.json {} executions, {} crashes ({} read, {} \
         with settings that pass the checks); raw.jsonl {} executions, {} crashes ({} read); \
         suite {} executions, {} crashes ({} parsed, {} pass the checks)",
        t.elapsed().as_secs_f64(),
        sm.0,
        sm.1,
        load(&SERVE_STAGES, 0),
        load(&SERVE_STAGES, 1),
        sr.0,
        sr.1,
        load(&SERVE_STAGES, 2),
        ss.0,
        ss.1,
        load(&SERVE_STAGES, 3),
        load(&SERVE_STAGES, 4)
    );
    let t = Instant::now();
    let m = fuzz_merge(n, 200, seed + 3);
    println!(
        "merge fuzz ({:.1} s, seed {}): {} executions, {} crashes; both shards read {}, merged \
         {}, written by `kvbench merge` {}",
        t.elapsed().as_secs_f64(),
        seed + 3,
        m.0,
        m.1,
        load(&MERGE_STAGES, 0),
        load(&MERGE_STAGES, 1),
        load(&MERGE_STAGES, 2)
    );
    let t = Instant::now();
    let sl = fuzz_slurm(n, 200, seed + 4);
    println!(
        "slurm fuzz ({:.1} s, seed {}): {} executions, {} crashes; scripts written {}, run by \
         bash {}",
        t.elapsed().as_secs_f64(),
        seed + 4,
        sl.0,
        sl.1,
        load(&SLURM_STAGES, 0),
        load(&SLURM_STAGES, 1)
    );
    for (name, (n, crashes)) in [
        ("serve meta.json", sm),
        ("serve raw.jsonl", sr),
        ("serve suite", ss),
        ("merge", m),
        ("slurm", sl),
    ] {
        assert_eq!(crashes, 0, "{name}: {crashes} of {n} executions panicked");
    }
}
